// Data-parallel and ZeRO steps over a communicator (shard.h).
//
// The flat parameter space: the trainable parameters laid end to end in their order, P
// elements, padded to a multiple of the world size N; rank r's shard is [r S, (r+1) S) with
// S = ceil(P / N). A shard may begin or end inside a parameter: the optimizer of zero1/zero2
// sees one piece per parameter it touches, a view of that parameter's own storage, so that an
// elementwise update of the pieces is the update of the whole, entry by entry.
//
// Buckets: consecutive parameters, taken from the last (whose gradients backward makes first)
// until bucket_bytes, as PyTorch's DDP does. A bucket is launched when every gradient in it is
// complete (the parameters' AccumulateGrad post hooks count them), and only after every earlier
// bucket was: all ranks start their collectives in one order, which Gloo needs. After backward
// the buckets still waiting (parameters without a gradient this step, reduced as zeros) are
// launched and every reduction waited for; that wait is the communication phase.
#include "gradscope/strategy/shard.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {
namespace {

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
}

// The parameters laid end to end, and this rank's shard of them.
class FlatLayout {
 public:
  FlatLayout(const std::vector<torch::Tensor>& params, int rank, int world) {
    int64_t at = 0;
    for (const auto& p : params) {
      check_usage(p.is_contiguous(), "a parameter is not contiguous",
                  "sharded steps address parameters as flat views");
      flats_.push_back(p.detach().view(-1));
      offsets_.push_back(at);
      at += p.numel();
    }
    total_ = at;
    shard_ = (total_ + world - 1) / world;
    lo_ = std::min<int64_t>(total_, shard_ * rank);
    hi_ = std::min<int64_t>(total_, shard_ * (rank + 1));
  }
  int64_t total() const { return total_; }
  int64_t shard() const { return shard_; }  // elements per rank (the last may hold padding)
  int64_t lo() const { return lo_; }        // this rank's shard, within [0, total)
  int64_t hi() const { return hi_; }
  size_t size() const { return flats_.size(); }
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t numel(size_t i) const { return flats_[i].numel(); }
  const torch::Tensor& flat(size_t i) const { return flats_[i]; }

  // f(i, start in parameter i, start in [lo, hi), length) for each piece of [lo, hi).
  template <typename F>
  void for_range(int64_t lo, int64_t hi, F&& f) const {
    hi = std::min(hi, total_);
    if (lo >= hi) return;
    // The first parameter that ends after lo.
    size_t i = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), lo) -
                                   offsets_.begin() - 1);
    for (; i < flats_.size() && offsets_[i] < hi; ++i) {
      const int64_t a = std::max(lo, offsets_[i]);
      const int64_t b = std::min(hi, offsets_[i] + numel(i));
      if (a < b) f(i, a - offsets_[i], a - lo, b - a);
    }
  }

  // Copies [lo, hi) of the parameters into `out` (padding past the end stays as it is).
  void read(int64_t lo, int64_t hi, torch::Tensor out) const {
    for_range(lo, hi, [&](size_t i, int64_t in_param, int64_t in_out, int64_t n) {
      out.narrow(0, in_out, n).copy_(flats_[i].narrow(0, in_param, n));
    });
  }
  void write(int64_t lo, int64_t hi, const torch::Tensor& in) const {
    for_range(lo, hi, [&](size_t i, int64_t in_param, int64_t in_in, int64_t n) {
      flats_[i].narrow(0, in_param, n).copy_(in.narrow(0, in_in, n));
    });
  }

 private:
  std::vector<torch::Tensor> flats_;
  std::vector<int64_t> offsets_;
  int64_t total_ = 0, shard_ = 0, lo_ = 0, hi_ = 0;
};

// Collective buffers alive, and the most at once.
struct BufferTally {
  void add(int64_t b) {
    live += b;
    peak = std::max(peak, live);
  }
  void remove(int64_t b) { live -= b; }
  int64_t live = 0, peak = 0;
};

// Reduces the gradients of the step's last micro-batch in buckets, from backward's hooks.
class GradientReducer : public MicroBatchListener {
 public:
  // keep_full: every rank keeps every reduced gradient (ddp, zero1); else only the shard's
  // (zero2), written into shard_grad.
  GradientReducer(const std::vector<torch::Tensor>& params, const FlatLayout& layout,
                  Communicator& comm, int64_t bucket_bytes, bool keep_full, ShardFigures& figures,
                  BufferTally& buffers)
      : params_(params),
        layout_(layout),
        comm_(comm),
        keep_full_(keep_full),
        figures_(figures),
        buffers_(buffers) {
    // Buckets from the last parameter backwards.
    bucket_of_.assign(params_.size(), 0);
    size_t end = params_.size();
    while (end > 0) {
      size_t begin = end - 1;
      int64_t bytes = bytes_of(params_[begin]);
      while (begin > 0 && bytes + bytes_of(params_[begin - 1]) <= bucket_bytes) {
        --begin;
        bytes += bytes_of(params_[begin]);
      }
      Bucket b;
      b.first = begin;
      b.last = end;
      b.lo = layout_.offset(begin);
      b.hi = layout_.offset(end - 1) + layout_.numel(end - 1);
      for (size_t j = begin; j < end; ++j) bucket_of_[j] = buckets_.size();
      buckets_.push_back(std::move(b));
      end = begin;
    }
    for (size_t j = 0; j < params_.size(); ++j) {
      c10::intrusive_ptr<torch::autograd::Node> node =
          torch::autograd::impl::grad_accumulator(params_[j]);
      if (!node)
        fail_runtime("a parameter has no gradient accumulator",
                     "sharded steps need leaf parameters that require grad");
      node->add_post_hook(std::make_unique<Ready>(this, j));
      accumulators_.push_back(std::move(node));
    }
  }

  void before_backward(const MicroBatchInfo& info) override {
    // Only the last micro-batch's backward reduces; the earlier ones accumulate locally.
    armed_ = info.index == info.count - 1;
    if (armed_) start_step();
  }

  // The step's reducing backward has returned: what has been reduced by now ran beside it.
  void after_backward(const MicroBatchInfo& info) override {
    if (!armed_ || info.index != info.count - 1) return;
    for (Bucket& b : buckets_)
      if (b.launched && (!b.work || b.work->done())) figures_.overlapped_bytes += b.bytes;
  }

  // After the step's gradients are computed: launches what is left, waits for every bucket
  // (the caller's communication phase) and leaves the reduced gradients where they belong:
  // in the parameters' .grad (keep_full), else in shard_grad().
  void finish() {
    if (!armed_) start_step();  // a gradient function that announced no micro-batch
    armed_ = false;
    for (Bucket& b : buckets_) b.pending = 0;
    launch_ready();
    for (Bucket& b : buckets_) drain(b);
  }

  // zero2: this rank's shard of the reduced gradients (made when the step's last backward
  // starts, filled as buckets finish), handed over once.
  torch::Tensor take_shard_grad() {
    if (!shard_grad_.defined() && !params_.empty())  // no bucket at all
      shard_grad_ =
          torch::zeros({layout_.hi() - layout_.lo()}, params_[0].options().requires_grad(false));
    return std::move(shard_grad_);
  }

 private:
  struct Bucket {
    size_t first = 0, last = 0;  // parameters [first, last)
    int64_t lo = 0, hi = 0;      // their flat range
    int64_t pending = 0;
    torch::Tensor buffer;
    bool in_place = false;  // the buffer is the one parameter's gradient itself
    bool launched = false;
    int64_t bytes = 0;  // of its buffer
    std::unique_ptr<PendingCollective> work;
  };

  class Ready : public torch::autograd::FunctionPostHook {
   public:
    Ready(GradientReducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
    torch::autograd::variable_list operator()(
        const torch::autograd::variable_list& outputs,
        const torch::autograd::variable_list& /*inputs*/) override {
      reducer_->on_gradient(index_);
      return outputs;
    }

   private:
    GradientReducer* reducer_;
    size_t index_;
  };

  void start_step() {
    for (Bucket& b : buckets_) {
      b.launched = false;
      b.pending = static_cast<int64_t>(b.last - b.first);
      b.buffer = torch::Tensor();
      b.work.reset();
    }
    next_ = 0;
    in_flight_.clear();
    shard_grad_ = torch::Tensor();
  }

  void on_gradient(size_t j) {
    if (!armed_) return;
    Bucket& b = buckets_[bucket_of_[j]];
    if (b.work || b.pending <= 0)
      fail_runtime(
          "a parameter's gradient was accumulated twice in one backward after its "
          "bucket was reduced",
          "a parameter used in two places must be reduced after backward; this model "
          "cannot be sharded with gradient hooks");
    --b.pending;
    launch_ready();
    // zero2: what is done is copied out now, so its buffer goes early.
    if (!keep_full_)
      for (Bucket& d : buckets_)
        if (d.work && d.work->done()) drain(d);
  }

  void launch_ready() {
    while (next_ < buckets_.size() && buckets_[next_].pending <= 0) launch(buckets_[next_++]);
  }

  // zero2 keeps at most kZero2BucketsInFlight buckets (shard.h); ddp and zero1 keep every
  // gradient anyway, and let every bucket run while backward goes on.
  void launch(Bucket& b) {
    if (!keep_full_)
      while (in_flight_.size() >= kZero2BucketsInFlight) {
        drain(*in_flight_.front());
        in_flight_.pop_front();
      }
    // A bucket of one parameter reduces its gradient in place: no copy, no second buffer
    // (the embedding of a language model is often a bucket of its own, and its largest
    // tensor).
    const torch::Tensor alone = b.last - b.first == 1 ? params_[b.first].grad() : torch::Tensor();
    if (alone.defined() && alone.is_contiguous()) {
      b.buffer = alone.view(-1);
      b.in_place = true;
      if (!keep_full_) {
        torch::Tensor p = params_[b.first];
        p.mutable_grad() = torch::Tensor();  // the buffer holds it until the shard is taken
      }
    } else {
      const torch::Tensor& first = params_[b.first];
      b.in_place = false;
      b.buffer = torch::empty({b.hi - b.lo}, first.options().requires_grad(false));
      buffers_.add(bytes_of(b.buffer));
      for (size_t j = b.first; j < b.last; ++j) {
        torch::Tensor piece = b.buffer.narrow(0, layout_.offset(j) - b.lo, layout_.numel(j));
        const torch::Tensor g = params_[j].grad();
        if (g.defined())
          piece.copy_(g.reshape(-1));
        else
          piece.zero_();
        // zero2 keeps no whole gradient: the buffer holds it until the shard is taken.
        if (!keep_full_) {
          torch::Tensor p = params_[j];
          p.mutable_grad() = torch::Tensor();
        }
      }
    }
    b.launched = true;
    b.bytes = bytes_of(b.buffer);
    figures_.reduced_bytes += b.bytes;
    b.work = comm_.allreduce_async(b.buffer);
    if (!keep_full_) in_flight_.push_back(&b);
  }

  void drain(Bucket& b) {
    if (!b.work) return;
    b.work->wait();
    b.work.reset();
    if (keep_full_) {
      // In place, the gradient is already the reduced one.
      for (size_t j = b.first; j < b.last && !b.in_place; ++j) {
        torch::Tensor p = params_[j];
        const torch::Tensor piece =
            b.buffer.narrow(0, layout_.offset(j) - b.lo, layout_.numel(j)).view_as(p);
        if (p.grad().defined())
          p.mutable_grad().copy_(piece);
        else
          p.mutable_grad() = piece.clone();
      }
    } else {
      // The shard is made at the first drain, not before: backward's early part holds none.
      if (!shard_grad_.defined())
        shard_grad_ =
            torch::zeros({layout_.hi() - layout_.lo()}, b.buffer.options().requires_grad(false));
      const int64_t lo = std::max(b.lo, layout_.lo()), hi = std::min(b.hi, layout_.hi());
      if (lo < hi)
        shard_grad_.narrow(0, lo - layout_.lo(), hi - lo)
            .copy_(b.buffer.narrow(0, lo - b.lo, hi - lo));
    }
    if (!b.in_place) buffers_.remove(bytes_of(b.buffer));
    b.buffer = torch::Tensor();
  }

  std::vector<torch::Tensor> params_;
  const FlatLayout& layout_;
  Communicator& comm_;
  bool keep_full_;
  ShardFigures& figures_;
  BufferTally& buffers_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  size_t next_ = 0;
  bool armed_ = false;
  torch::Tensor shard_grad_;
  std::deque<Bucket*> in_flight_;  // zero2's launched buckets, oldest first
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;  // holding the hooks
};

// ddp: the after-backward updater over gradients reduced in buckets.
class DdpUpdater : public Updater {
 public:
  DdpUpdater(const StepPlan& plan, const std::vector<torch::Tensor>& params,
             const OptimizerSpec& spec, const UpdaterOptions& options,
             std::shared_ptr<Communicator> comm, int64_t bucket_bytes)
      : comm_(std::move(comm)),
        layout_(params, comm_->rank(), comm_->world()),
        reducer_(params, layout_, *comm_, bucket_bytes, true, figures_, buffers_) {
    StepPlan after = plan;
    after.optimizer_step = OptimizerStep::kAfterBackward;
    inner_ = make_updater(after, params, spec, options);
    figures_.flat_elements = layout_.total();
    figures_.shard_elements = layout_.total();
  }

  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r = inner_->step(
        [&] {
          StepOutput out = gradients();
          observer.enter(Phase::kComm);
          reducer_.finish();
          return out;
        },
        observer);
    figures_.buffer_peak_bytes = buffers_.peak;
    return r;
  }
  void set_learning_rate(double lr) override { inner_->set_learning_rate(lr); }
  int64_t state_bytes() const override { return inner_->state_bytes(); }
  std::optional<int64_t> grads_bytes() const override { return inner_->grads_bytes(); }
  MicroBatchListener* micro_batch_listener() override { return &reducer_; }
  void save(torch::serialize::OutputArchive& archive) const override { inner_->save(archive); }
  void load(torch::serialize::InputArchive& archive) override { inner_->load(archive); }
  const ShardFigures& figures() const { return figures_; }

 private:
  std::shared_ptr<Communicator> comm_;
  ShardFigures figures_;
  BufferTally buffers_;
  FlatLayout layout_;
  GradientReducer reducer_;
  std::unique_ptr<Updater> inner_;
};

// zero1 and zero2 over a list of parameters: the optimizer over this rank's shard of their
// flat space. The parts of a step, so that fsdp can use them for the parameters outside its
// blocks.
class ZeroPart {
 public:
  ZeroPart(bool keep_full_grads, const std::vector<torch::Tensor>& params,
           const std::vector<std::string>& names, const std::vector<int64_t>& head_sizes,
           const OptimizerSpec& spec, Communicator& comm, int64_t bucket_bytes,
           ShardFigures& figures, BufferTally& buffers)
      : full_(keep_full_grads),
        params_(params),
        comm_(comm),
        buffers_(buffers),
        layout_(params, comm.rank(), comm.world()),
        reducer_(params, layout_, comm, bucket_bytes, keep_full_grads, figures, buffers),
        gather_elements_(std::max<int64_t>(
            1, bucket_bytes / std::max<int64_t>(1, params.empty() ? 4 : params[0].element_size()) /
                   comm.world())) {
    // The pieces of this rank's shard, one per parameter it touches, as views of the
    // parameters' own storage; the optimizer sees them with their parameters' names.
    ParamInfo info;
    layout_.for_range(layout_.lo(), layout_.hi(),
                      [&](size_t i, int64_t in_param, int64_t in_shard, int64_t n) {
                        pieces_.push_back(Piece{i, in_param, in_shard, n});
                        piece_tensors_.push_back(layout_.flat(i).narrow(0, in_param, n));
                        if (i < names.size()) info.names.push_back(names[i]);
                        if (i < head_sizes.size()) info.head_sizes.push_back(head_sizes[i]);
                      });
    optimizer_ =
        make_optimizer(spec.name, piece_tensors_, info, spec.lr, spec.weight_decay, spec.opt);
  }

  const FlatLayout& layout() const { return layout_; }
  GradientReducer& reducer() { return reducer_; }
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }

  // After backward: every bucket reduced, the pieces' gradients in place. Returns the sum of
  // the squares of this rank's share of the gradients (for the global norm).
  double reduce() {
    reducer_.finish();
    if (!full_) shard_grad_ = reducer_.take_shard_grad();
    // The pieces' gradients: views of the whole gradients (zero1) or of the shard's (zero2).
    for (size_t k = 0; k < pieces_.size(); ++k) {
      const Piece& pc = pieces_[k];
      piece_tensors_[k].mutable_grad() =
          full_ ? params_[pc.param].grad().reshape(-1).narrow(0, pc.in_param, pc.n)
                : shard_grad_.narrow(0, pc.in_shard, pc.n);
    }
    if (!grads_bytes_)
      grads_bytes_ = full_ ? gradscope::grads_bytes(params_) : bytes_of(shard_grad_);
    double squares = 0;
    for (const auto& t : piece_tensors_)
      squares += t.grad().to(torch::kFloat64).pow(2).sum().item<double>();
    return squares;
  }
  void scale_grads(double scale) {
    for (auto& t : piece_tensors_) t.mutable_grad().mul_(scale);
  }
  // The update of this rank's pieces, then every gradient freed.
  void update() {
    optimizer_->step();
    for (auto& t : piece_tensors_) t.mutable_grad() = torch::Tensor();
    for (const auto& p : params_) {
      torch::Tensor t = p;
      t.mutable_grad() = torch::Tensor();
    }
    shard_grad_ = torch::Tensor();
  }

  // Every rank's updated shard into every rank's parameters, a chunk at a time so that the
  // buffers stay within a bucket.
  void gather_parameters() {
    const int world = comm_.world();
    const int64_t shard = layout_.shard();
    const torch::TensorOptions options =
        params_.empty() ? torch::TensorOptions() : params_[0].options().requires_grad(false);
    torch::NoGradGuard no_grad;
    for (int64_t at = 0; at < shard; at += gather_elements_) {
      const int64_t n = std::min(gather_elements_, shard - at);
      torch::Tensor mine = torch::zeros({n}, options);
      const int64_t lo = comm_.rank() * shard + at;
      layout_.read(lo, lo + n, mine);
      std::vector<torch::Tensor> all;
      for (int q = 0; q < world; ++q) all.push_back(torch::empty({n}, options));
      const int64_t bytes = bytes_of(mine) * (world + 1);
      buffers_.add(bytes);
      comm_.allgather(all, mine);
      for (int q = 0; q < world; ++q) {
        if (q == comm_.rank()) continue;
        const int64_t qlo = q * shard + at;
        layout_.write(qlo, qlo + n, all[static_cast<size_t>(q)]);
      }
      buffers_.remove(bytes);
    }
  }

  std::optional<int64_t> grads_bytes() const { return grads_bytes_; }

 private:
  struct Piece {
    size_t param;
    int64_t in_param, in_shard, n;
  };

  bool full_;
  std::vector<torch::Tensor> params_;
  Communicator& comm_;
  BufferTally& buffers_;
  FlatLayout layout_;
  GradientReducer reducer_;
  int64_t gather_elements_;
  std::vector<Piece> pieces_;
  std::vector<torch::Tensor> piece_tensors_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  torch::Tensor shard_grad_;
  std::optional<int64_t> grads_bytes_;
};

// The global gradient norm from every rank's share of the squares; clips when asked.
double global_norm(Communicator& comm, double squares) { return std::sqrt(comm.sum(squares)); }
double clip_scale(const UpdaterOptions& options, double norm) {
  if (options.clip_grad_norm <= 0) return 1;
  return std::min(1.0, options.clip_grad_norm / (norm + 1e-6));
}

class ZeroUpdater : public Updater {
 public:
  ZeroUpdater(Shard shard, const std::vector<torch::Tensor>& params, const OptimizerSpec& spec,
              const UpdaterOptions& options, std::shared_ptr<Communicator> comm,
              int64_t bucket_bytes)
      : options_(options),
        comm_(std::move(comm)),
        part_(shard == Shard::kZero1, params, spec.param_names, spec.param_head_sizes, spec,
              *comm_, bucket_bytes, figures_, buffers_) {
    figures_.flat_elements = part_.layout().total();
    figures_.shard_elements = part_.layout().shard();
  }

  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r;
    r.out = gradients();
    r.evaluations = 1;
    observer.enter(Phase::kComm);
    const double squares = part_.reduce();
    observer.enter(Phase::kOptimizer);
    if (options_.clip_grad_norm > 0 || options_.log_grad_norm) {
      // Every rank takes only its shard's squares, so the sum counts each entry once.
      r.grad_norm = global_norm(*comm_, squares);
      const double scale = clip_scale(options_, r.grad_norm);
      if (scale < 1) part_.scale_grads(scale);
    }
    part_.update();
    observer.enter(Phase::kComm);
    part_.gather_parameters();
    figures_.buffer_peak_bytes = buffers_.peak;
    return r;
  }

  void set_learning_rate(double lr) override {
    gradscope::set_learning_rate(part_.optimizer(), lr);
  }
  int64_t state_bytes() const override { return optimizer_state_bytes(part_.optimizer()); }
  std::optional<int64_t> grads_bytes() const override { return part_.grads_bytes(); }
  MicroBatchListener* micro_batch_listener() override { return &part_.reducer(); }
  void save(torch::serialize::OutputArchive& archive) const override {
    part_.optimizer().save(archive);
  }
  void load(torch::serialize::InputArchive& archive) override { part_.optimizer().load(archive); }
  const ShardFigures& figures() const { return figures_; }

 private:
  UpdaterOptions options_;
  std::shared_ptr<Communicator> comm_;
  ShardFigures figures_;
  BufferTally buffers_;
  ZeroPart part_;
};

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
              int64_t bucket_bytes)
      : options_(options), comm_(std::move(comm)) {
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
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
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

  // All-reduces the unit's gradients (zeros for those that did not come) and keeps this
  // rank's shard of them.
  void reduce(FsdpUnit& u) {
    torch::NoGradGuard no_grad;
    torch::Tensor flat = torch::zeros({u.shard * comm_->world()}, u.full.options());
    buffers_.add(bytes_of(flat));
    for (size_t j = 0; j < u.params.size(); ++j) {
      torch::Tensor p = u.params[j];
      if (p.grad().defined()) flat.narrow(0, u.offsets[j], p.numel()).copy_(p.grad().reshape(-1));
      p.mutable_grad() = torch::Tensor();
    }
    // Synchronous, inside backward (its time is backward's): not among the bucket reductions
    // whose overlap the record reports.
    comm_->allreduce(flat);
    u.grad_shard = flat.narrow(0, comm_->rank() * u.shard, u.shard).clone();
    buffers_.remove(bytes_of(flat));
    u.reduced = true;
  }

  UpdaterOptions options_;
  std::shared_ptr<Communicator> comm_;
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

const std::vector<std::string>& elementwise_optimizers() {
  static const std::vector<std::string> names = {"sgd",     "adam",     "adamw",
                                                 "adagrad", "adadelta", "lion"};
  return names;
}

std::string shard_refusal(Shard shard, const std::string& optimizer) {
  if (shard == Shard::kNone || shard == Shard::kDdp) return "";
  const auto& ok = elementwise_optimizers();
  if (std::find(ok.begin(), ok.end(), optimizer) != ok.end()) return "";
  return fmt::format(
      "--shard {} gives each rank a slice of the flat parameters, and optimizer '{}' needs "
      "whole matrices, blocks or sums over every parameter, which no rank holds",
      shard_name(shard), optimizer);
}

void check_shard(const StepPlan& plan, Shard shard, const std::string& optimizer) {
  if (shard == Shard::kNone) return;
  check_usage(plan.optimizer_step == OptimizerStep::kAfterBackward,
              fmt::format("--shard {} reduces gradients across ranks before the optimizer steps; "
                          "the optimizer cannot step inside backward",
                          shard_name(shard)),
              "leave --optimizer-step in-backward (and --strategy fused) out with --shard");
  const std::string refusal = shard_refusal(shard, optimizer);
  std::string list;
  for (const auto& n : elementwise_optimizers()) list += (list.empty() ? "" : ", ") + n;
  check_usage(refusal.empty(), refusal,
              "use --shard ddp with " + optimizer + ", or one of " + list + " with --shard " +
                  shard_name(shard));
  check_usage(shard == Shard::kDdp || !optimizer_registry().get(optimizer).steps_with_closure,
              "optimizer '" + optimizer + "' runs a line search over every parameter",
              "use --shard ddp with it");
}

std::unique_ptr<Updater> make_sharded_updater(const StepPlan& plan, Shard shard,
                                              const std::vector<torch::Tensor>& params,
                                              const OptimizerSpec& optimizer,
                                              const UpdaterOptions& options,
                                              std::shared_ptr<Communicator> comm,
                                              int64_t bucket_bytes, Model* model) {
  check_shard(plan, shard, optimizer.name);
  check_usage(shard != Shard::kFsdp || model != nullptr,
              "--shard fsdp needs the model, whose blocks it gathers");
  if (shard == Shard::kFsdp)
    return std::make_unique<FsdpUpdater>(*model, params, optimizer, options, std::move(comm),
                                         bucket_bytes);
  if (shard == Shard::kDdp)
    return std::make_unique<DdpUpdater>(plan, params, optimizer, options, std::move(comm),
                                        bucket_bytes);
  check_usage(shard == Shard::kZero1 || shard == Shard::kZero2,
              fmt::format("--shard {} is not an optimizer step", shard_name(shard)));
  return std::make_unique<ZeroUpdater>(shard, params, optimizer, options, std::move(comm),
                                       bucket_bytes);
}

const ShardFigures* shard_figures(const Updater& updater) {
  if (const auto* f = dynamic_cast<const FsdpUpdater*>(&updater)) return &f->figures();
  if (const auto* d = dynamic_cast<const DdpUpdater*>(&updater)) return &d->figures();
  if (const auto* z = dynamic_cast<const ZeroUpdater*>(&updater)) return &z->figures();
  return nullptr;
}

}  // namespace gradscope
