// fsdp (ZeRO-3) over a communicator (shard.h): each block's parameters a unit, gathered around
// the block through the block runner's shard layer (RunnerLayer::kShard, outside
// recomputation) and again when backward reaches the block.
#include <optional>
#include <unordered_map>
#include <utility>

#include "gradscope/strategy/shard_parts.h"

namespace gradscope {
namespace {

using shard_parts::BufferTally;
using shard_parts::bytes_of;
using shard_parts::clip_scale;
using shard_parts::FlatLayout;
using shard_parts::global_norm;
using shard_parts::GradientReducer;
using shard_parts::ZeroPart;

// fsdp: each block's parameters are a unit, sharded over the ranks and gathered whole only
// around the block's forward and its backward. A unit's parameters are views of one flat
// buffer of N S elements whose storage is released between uses (the parameters keep their
// tensors, so the graph's saved references stay valid and see the data again once it is
// gathered for backward). The parameters outside the blocks (embeddings, the final norm, the
// head) stay whole on every rank and are stepped as under zero2.
class FsdpUpdater;

struct FsdpUnit {
  std::vector<torch::Tensor> params;  // the block's trainable parameters
  std::vector<int64_t> offsets;       // in its flat space
  int64_t elements = 0, shard = 0;    // P_b and S_b = ceil(P_b / N)
  torch::Tensor full;                 // N S_b elements; storage released when not gathered
  torch::Tensor master;               // this rank's S_b elements: what the optimizer updates
  torch::Tensor grad_shard;           // the reduced gradient's S_b elements, until the update
  int64_t pending = 0;                // gradients still to come in this backward
  bool gathered = false, reduced = false;
};

// Identity in forward; in backward, gathers the block's unit before the block's own backward
// (which needs its parameters) runs.
class GatherBeforeBackward : public torch::autograd::Function<GatherBeforeBackward> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* actx, const torch::Tensor& y,
                               int64_t unit, int64_t updater) {
    actx->saved_data["unit"] = unit;
    actx->saved_data["updater"] = updater;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* actx,
                                                 torch::autograd::variable_list grads);
};

class FsdpUpdater : public Updater, public MicroBatchListener {
 public:
  FsdpUpdater(Model& model, const std::vector<torch::Tensor>& params, const OptimizerSpec& spec,
              const UpdaterOptions& options, std::shared_ptr<Communicator> comm,
              int64_t bucket_bytes, GradReduce grad_reduce)
      : options_(options), comm_(std::move(comm)), grad_reduce_(grad_reduce) {
    const int world = comm_->world(), rank = comm_->rank();
    std::unordered_map<const void*, size_t> index_of;
    for (size_t i = 0; i < params.size(); ++i) index_of[params[i].unsafeGetTensorImpl()] = i;
    std::vector<bool> in_unit(params.size(), false);
    torch::NoGradGuard no_grad;
    for (const auto& block : model.blocks()) {
      FsdpUnit u;
      for (const auto& p : block->parameters()) {
        const auto it = index_of.find(p.unsafeGetTensorImpl());
        if (it == index_of.end() || in_unit[it->second]) continue;
        in_unit[it->second] = true;
        u.params.push_back(params[it->second]);
      }
      unit_of_block_[block.get()] = units_.size();
      units_.push_back(std::move(u));
    }
    std::vector<torch::Tensor> root;
    std::vector<std::string> root_names;
    std::vector<int64_t> root_heads;
    for (size_t i = 0; i < params.size(); ++i) {
      if (in_unit[i]) continue;
      root.push_back(params[i]);
      if (i < spec.param_names.size()) root_names.push_back(spec.param_names[i]);
      if (i < spec.param_head_sizes.size()) root_heads.push_back(spec.param_head_sizes[i]);
    }
    root_ = std::make_unique<ZeroPart>(false, root, root_names, root_heads, spec, *comm_,
                                       bucket_bytes, figures_, buffers_);
    figures_.flat_elements = root_->layout().total();
    figures_.shard_elements = root_->layout().shard();
    std::vector<torch::Tensor> masters;
    for (size_t k = 0; k < units_.size(); ++k) {
      FsdpUnit& u = units_[k];
      if (u.params.empty()) continue;
      for (const auto& p : u.params) {
        check_usage(p.is_contiguous(), "a parameter is not contiguous",
                    "--shard fsdp addresses parameters as flat views");
        u.offsets.push_back(u.elements);
        u.elements += p.numel();
      }
      u.shard = (u.elements + world - 1) / world;
      u.full = torch::zeros({u.shard * world}, u.params[0].options().requires_grad(false));
      for (size_t j = 0; j < u.params.size(); ++j) {
        u.full.narrow(0, u.offsets[j], u.params[j].numel()).copy_(u.params[j].detach().reshape(-1));
        torch::Tensor p = u.params[j];
        p.set_data(u.full.narrow(0, u.offsets[j], p.numel()).view(p.sizes()));
      }
      u.master = u.full.narrow(0, rank * u.shard, u.shard).clone();
      masters.push_back(u.master);
      u.gathered = true;
      buffers_.add(bytes_of(u.full));
      release(u);
      figures_.flat_elements += u.elements;
      figures_.shard_elements += u.shard;
      for (size_t j = 0; j < u.params.size(); ++j) {
        c10::intrusive_ptr<torch::autograd::Node> node =
            torch::autograd::impl::grad_accumulator(u.params[j]);
        if (!node)
          fail_runtime("a parameter has no gradient accumulator",
                       "--shard fsdp needs leaf parameters that require grad");
        node->add_post_hook(std::make_unique<UnitReady>(this, k));
        accumulators_.push_back(std::move(node));
      }
    }
    // The units' shards as flat tensors: an elementwise update of them is the update of each
    // parameter's entries.
    blocks_optimizer_ =
        make_optimizer(spec.name, masters, ParamInfo{}, spec.lr, spec.weight_decay, spec.opt);
    // The outermost layer: a recompute in backward (a layer inside) finds the block's
    // parameters gathered, since backward reaches the gather on the block's output first.
    model.set_block_runner(RunnerLayer::kShard,
                           [this](Block& block, const torch::Tensor& x, const BlockContext& ctx,
                                  const BlockRunner& inner) {
                             return run_block(inner, block, x, ctx);
                           });
  }

  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r;
    r.out = gradients();
    r.evaluations = 1;
    observer.enter(Phase::kComm);
    // Units whose gradients did not all arrive (parameters unused this step) reduce now, in
    // unit order on every rank.
    for (FsdpUnit& u : units_)
      if (!u.params.empty() && !u.reduced) reduce(u);
    double squares = root_->reduce();
    observer.enter(Phase::kOptimizer);
    for (FsdpUnit& u : units_) {
      if (u.params.empty()) continue;
      u.master.mutable_grad() = u.grad_shard;
      squares += u.grad_shard.to(torch::kFloat64).pow(2).sum().item<double>();
    }
    if (!grads_bytes_) {
      int64_t bytes = root_->grads_bytes().value_or(0);
      for (const FsdpUnit& u : units_) bytes += bytes_of(u.grad_shard);
      grads_bytes_ = bytes;
    }
    if (options_.clip_grad_norm > 0 || options_.log_grad_norm) {
      r.grad_norm = global_norm(*comm_, squares);
      const double scale = clip_scale(options_, r.grad_norm);
      if (scale < 1) {
        root_->scale_grads(scale);
        for (FsdpUnit& u : units_)
          if (!u.params.empty()) u.master.mutable_grad().mul_(scale);
      }
    }
    root_->update();
    blocks_optimizer_->step();
    for (FsdpUnit& u : units_) {
      if (u.params.empty()) continue;
      u.master.mutable_grad() = torch::Tensor();
      u.grad_shard = torch::Tensor();
      u.reduced = false;
    }
    observer.enter(Phase::kComm);
    root_->gather_parameters();
    figures_.buffer_peak_bytes = buffers_.peak;
    return r;
  }

  void after_backward(const MicroBatchInfo& info) override {
    root_->reducer().after_backward(info);
  }
  void before_backward(const MicroBatchInfo& info) override {
    root_->reducer().before_backward(info);
    armed_ = info.index == info.count - 1;
    for (FsdpUnit& u : units_) u.pending = static_cast<int64_t>(u.params.size());
  }

  void set_learning_rate(double lr) override {
    gradscope::set_learning_rate(root_->optimizer(), lr);
    gradscope::set_learning_rate(*blocks_optimizer_, lr);
  }
  int64_t state_bytes() const override {
    return optimizer_state_bytes(root_->optimizer()) + optimizer_state_bytes(*blocks_optimizer_);
  }
  std::vector<torch::Tensor> state_tensors() const override {
    std::vector<torch::Tensor> out = optimizer_state_tensors(root_->optimizer());
    for (auto& t : optimizer_state_tensors(*blocks_optimizer_)) out.push_back(std::move(t));
    return out;
  }
  std::optional<int64_t> grads_bytes() const override { return grads_bytes_; }
  MicroBatchListener* micro_batch_listener() override { return this; }
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::serialize::OutputArchive root, blocks;
    root_->optimizer().save(root);
    blocks_optimizer_->save(blocks);
    archive.write("root", root);
    archive.write("blocks", blocks);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::serialize::InputArchive root, blocks;
    archive.read("root", root);
    archive.read("blocks", blocks);
    root_->optimizer().load(root);
    blocks_optimizer_->load(blocks);
  }
  void gather_parameters() override {
    for (FsdpUnit& u : units_)
      if (!u.params.empty()) gather(u);
  }
  void scatter_parameters() override {
    torch::NoGradGuard no_grad;
    for (FsdpUnit& u : units_) {
      if (u.params.empty() || !u.gathered) continue;
      u.master.copy_(u.full.narrow(0, comm_->rank() * u.shard, u.shard));
      release(u);
    }
  }
  std::optional<int64_t> resident_params_bytes() const override {
    int64_t bytes = 0;
    for (const FsdpUnit& u : units_) bytes += bytes_of(u.master);
    for (const auto& p : root_params()) bytes += bytes_of(p);
    return bytes;
  }
  std::vector<std::pair<std::string, torch::Tensor>> parameter_shards() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (size_t k = 0; k < units_.size(); ++k)
      out.emplace_back(fmt::format("block {} shard", k), units_[k].master);
    return out;
  }
  const ShardFigures& figures() const { return figures_; }

  void gather_unit(int64_t k) { gather(units_[static_cast<size_t>(k)]); }

 private:
  class UnitReady : public torch::autograd::FunctionPostHook {
   public:
    UnitReady(FsdpUpdater* updater, size_t unit) : updater_(updater), unit_(unit) {}
    torch::autograd::variable_list operator()(
        const torch::autograd::variable_list& outputs,
        const torch::autograd::variable_list& /*inputs*/) override {
      updater_->on_gradient(unit_);
      return outputs;
    }

   private:
    FsdpUpdater* updater_;
    size_t unit_;
  };

  std::vector<torch::Tensor> root_params() const {
    std::vector<torch::Tensor> out;
    const FlatLayout& l = root_->layout();
    for (size_t i = 0; i < l.size(); ++i) out.push_back(l.flat(i));
    return out;
  }

  torch::Tensor run_block(const BlockRunner& inner, Block& block, const torch::Tensor& x,
                          const BlockContext& ctx) {
    const auto it = unit_of_block_.find(&block);
    if (it == unit_of_block_.end() || units_[it->second].params.empty())
      return inner(block, x, ctx);
    FsdpUnit& u = units_[it->second];
    gather(u);
    torch::Tensor y = inner(block, x, ctx);
    if (torch::GradMode::is_enabled() && y.requires_grad())
      y = GatherBeforeBackward::apply(y, static_cast<int64_t>(it->second),
                                      reinterpret_cast<int64_t>(this));
    release(u);
    return y;
  }

  void gather(FsdpUnit& u) {
    if (u.gathered) return;
    torch::NoGradGuard no_grad;
    c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
    const auto bytes = static_cast<size_t>(bytes_of(u.full));
    {
      const MemoryScope scope(MemoryComponent::kCollectiveBuffers);
      storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
    }
    storage->set_nbytes(bytes);
    buffers_.add(static_cast<int64_t>(bytes));
    std::vector<torch::Tensor> parts;
    for (int q = 0; q < comm_->world(); ++q)
      parts.push_back(u.full.narrow(0, q * u.shard, u.shard));
    comm_->allgather(parts, u.master);
    u.gathered = true;
  }

  void release(FsdpUnit& u) {
    if (!u.gathered) return;
    c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
    buffers_.remove(static_cast<int64_t>(storage->nbytes()));
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, u.full.device()));
    storage->set_nbytes(0);
    u.gathered = false;
  }

  void on_gradient(size_t k) {
    FsdpUnit& u = units_[k];
    if (u.pending <= 0)
      fail_runtime("a block parameter's gradient was accumulated twice in one backward",
                   "--shard fsdp needs each block parameter used once per forward");
    if (--u.pending > 0) return;
    // The block's backward is done: its gathered parameters go; on the step's last
    // micro-batch its gradients are reduced first (earlier ones accumulate locally).
    if (armed_) reduce(u);
    release(u);
  }

  // Reduces the unit's gradients (zeros for those that did not come) over the ranks and
  // keeps this rank's shard of the sum: all-reduced whole, or reduce-scattered.
  void reduce(FsdpUnit& u) {
    torch::NoGradGuard no_grad;
    torch::Tensor flat;
    {
      const MemoryScope scope(MemoryComponent::kCollectiveBuffers);
      flat = torch::zeros({u.shard * comm_->world()}, u.full.options());
    }
    buffers_.add(bytes_of(flat));
    for (size_t j = 0; j < u.params.size(); ++j) {
      torch::Tensor p = u.params[j];
      if (p.grad().defined()) flat.narrow(0, u.offsets[j], p.numel()).copy_(p.grad().reshape(-1));
      p.mutable_grad() = torch::Tensor();
    }
    // Synchronous, inside backward (its time is backward's): not among the bucket reductions
    // whose overlap the record reports.
    if (grad_reduce_ == GradReduce::kReduceScatter) {
      {
        const MemoryScope scope(MemoryComponent::kGradients);  // this rank's gradient shard
        u.grad_shard = torch::empty({u.shard}, flat.options());
      }
      // Gloo's copy of the flat buffer while it reduces.
      const int64_t copy =
          reduce_scatter_copies_input(flat.device(), comm_->world()) ? bytes_of(flat) : 0;
      buffers_.add(copy);
      {
        const MemoryScope scope(MemoryComponent::kCollectiveBuffers);
        comm_->reduce_scatter(u.grad_shard, flat);
      }
      buffers_.remove(copy);
    } else {
      comm_->allreduce(flat);
      const MemoryScope scope(MemoryComponent::kGradients);  // this rank's gradient shard
      u.grad_shard = flat.narrow(0, comm_->rank() * u.shard, u.shard).clone();
    }
    buffers_.remove(bytes_of(flat));
    u.reduced = true;
  }

  UpdaterOptions options_;
  std::shared_ptr<Communicator> comm_;
  GradReduce grad_reduce_;
  ShardFigures figures_;
  BufferTally buffers_;
  std::vector<FsdpUnit> units_;
  std::unordered_map<const Block*, size_t> unit_of_block_;
  std::unique_ptr<ZeroPart> root_;
  std::unique_ptr<torch::optim::Optimizer> blocks_optimizer_;
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;  // holding the hooks
  std::optional<int64_t> grads_bytes_;
  bool armed_ = false;
};

torch::autograd::variable_list GatherBeforeBackward::backward(
    torch::autograd::AutogradContext* actx, torch::autograd::variable_list grads) {
  auto* updater = reinterpret_cast<FsdpUpdater*>(actx->saved_data["updater"].toInt());
  updater->gather_unit(actx->saved_data["unit"].toInt());
  return {grads[0], torch::Tensor(), torch::Tensor()};
}

}  // namespace

namespace shard_parts {

std::unique_ptr<Updater> make_fsdp_updater(Model& model, const std::vector<torch::Tensor>& params,
                                           const OptimizerSpec& spec,
                                           const UpdaterOptions& options,
                                           std::shared_ptr<Communicator> comm,
                                           int64_t bucket_bytes, GradReduce grad_reduce) {
  return std::make_unique<FsdpUpdater>(model, params, spec, options, std::move(comm), bucket_bytes,
                                       grad_reduce);
}

const ShardFigures* fsdp_figures(const Updater& updater) {
  const auto* f = dynamic_cast<const FsdpUpdater*>(&updater);
  return f ? &f->figures() : nullptr;
}

}  // namespace shard_parts
}  // namespace gradscope
