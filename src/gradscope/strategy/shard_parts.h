// The parts every sharded step shares (shard.h): the flat parameter space and its shards,
// the gradient buckets reduced from backward's hooks, the optimizer over a shard (zero1,
// zero2, and fsdp's parameters outside its blocks), and the global norm. Used by shard.cpp
// (ddp, zero1, zero2) and fsdp.cpp; nothing outside strategy/ includes it.
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
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/comm/comm.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/strategy/updater.h"

namespace gradscope {
namespace shard_parts {

inline int64_t bytes_of(const torch::Tensor& t) {
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
    if (!shard_grad_.defined() && !params_.empty()) {  // no bucket at all
      const MemoryScope scope(MemoryComponent::kGradients);
      shard_grad_ =
          torch::zeros({layout_.hi() - layout_.lo()}, params_[0].options().requires_grad(false));
    }
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
      {
        const MemoryScope scope(MemoryComponent::kCollectiveBuffers);
        b.buffer = torch::empty({b.hi - b.lo}, first.options().requires_grad(false));
      }
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
        if (p.grad().defined()) {
          p.mutable_grad().copy_(piece);
        } else {
          const MemoryScope scope(MemoryComponent::kGradients);
          p.mutable_grad() = piece.clone();
        }
      }
    } else {
      // The shard is made at the first drain, not before: backward's early part holds none.
      if (!shard_grad_.defined()) {
        const MemoryScope scope(MemoryComponent::kGradients);  // this rank's gradient shard
        shard_grad_ =
            torch::zeros({layout_.hi() - layout_.lo()}, b.buffer.options().requires_grad(false));
      }
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
inline double global_norm(Communicator& comm, double squares) {
  return std::sqrt(comm.sum(squares));
}
inline double clip_scale(const UpdaterOptions& options, double norm) {
  if (options.clip_grad_norm <= 0) return 1;
  return std::min(1.0, options.clip_grad_norm / (norm + 1e-6));
}

// fsdp (fsdp.cpp): its updater, and its figures (null for another updater).
std::unique_ptr<Updater> make_fsdp_updater(Model& model, const std::vector<torch::Tensor>& params,
                                           const OptimizerSpec& spec,
                                           const UpdaterOptions& options,
                                           std::shared_ptr<Communicator> comm,
                                           int64_t bucket_bytes, GradReduce grad_reduce);
const ShardFigures* fsdp_figures(const Updater& updater);

}  // namespace shard_parts
}  // namespace gradscope
