#include "gradscope/train/estimate.h"

#include <algorithm>
#include <deque>
#include <memory>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/comm/comm.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/data_source.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

// Optimizer state and the temporaries of one update, by the optimizer's memory rule
// (optim/memory_rule.h) over the trainable parameters' shapes.
OptimizerMemory optimizer_memory(const RunConfig& c,
                                 const std::vector<MemoryTrace::ParamShape>& shapes) {
  const OptimizerEntry& entry = optimizer_registry().get(c.optimizer);
  if (!entry.memory) {
    const std::vector<std::string> names =
        optimizers_where([](const OptimizerEntry& e) { return e.memory != nullptr; });
    std::string modelled;
    for (size_t i = 0; i < names.size(); ++i)
      modelled += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    fail_usage(fmt::format("no memory model for optimizer '{}': {}", c.optimizer,
                           entry.no_memory_model ? entry.no_memory_model : "none declared"),
               "estimate models " + modelled);
  }
  std::vector<ParamExtent> params;
  params.reserve(shapes.size());
  for (const auto& s : shapes) params.push_back({s.bytes, s.rows, s.cols, s.block_matrix});
  return entry.memory(MemoryRuleInput(std::move(params), c.opt, c.weight_decay));
}

MemoryTrace::Checkpointing checkpointing_of(const StepPlan& plan) {
  MemoryTrace::Checkpointing ck;
  ck.enabled = plan.recompute != Recompute::kNone;
  ck.every = std::max<int64_t>(1, plan.recompute_every);
  ck.input_bf16 = plan.saved_input == Dtype::kBf16;
  if (plan.recompute == Recompute::kAttention)
    ck.unit = MemoryTrace::Unit::kAttention;
  else if (plan.recompute == Recompute::kMlp)
    ck.unit = MemoryTrace::Unit::kMlp;
  return ck;
}

// ---- several ranks (strategy/shard.cpp) ----
// The collectives' memory beside the trace's tensors, as the sharded steps allocate it. A
// rank's trainable parameters lie end to end in their order (P elements); zero and fsdp give
// rank r the elements [r S, (r+1) S), S = ceil(P / N).

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Gradients reduced in buckets from backward's hooks: consecutive parameters from the last
// backwards, up to bucket_bytes each; a bucket's flat buffer is made when its gradients are
// complete and every earlier bucket was launched. ddp and zero1 keep every buffer until
// backward ends. zero2 (and fsdp's parameters outside the blocks) free the gradients once
// copied into it, keep at most kZero2BucketsInFlight buffers (strategy/shard.h; the oldest
// drained into the rank's shard of the gradients, `shard_bytes`, made when the backward
// starts) and so never hold them all.
class BucketOverlay : public MemoryTrace::Overlay {
 public:
  // `bytes`: every trainable parameter's; `member`: those these buckets reduce.
  BucketOverlay(const std::vector<int64_t>& bytes, const std::vector<bool>& member,
                int64_t bucket_bytes, bool free_grads, int64_t shard_bytes = 0)
      : free_grads_(free_grads), shard_bytes_(shard_bytes), bucket_of_(bytes.size(), -1) {
    std::vector<size_t> order;
    for (size_t i = 0; i < bytes.size(); ++i)
      if (member[i]) order.push_back(i);
    size_t end = order.size();
    while (end > 0) {
      size_t begin = end - 1;
      int64_t sum = bytes[order[begin]];
      while (begin > 0 && sum + bytes[order[begin - 1]] <= bucket_bytes)
        sum += bytes[order[--begin]];
      for (size_t j = begin; j < end; ++j) bucket_of_[order[j]] = static_cast<int>(buckets_.size());
      buckets_.push_back(
          {sum, static_cast<int64_t>(end - begin), static_cast<int64_t>(end - begin)});
      total_ += sum;
      end = begin;
    }
  }
  int64_t enter_block(int64_t /*block*/, bool /*backward*/) override { return bytes(); }
  int64_t gradient_done(int param) override {
    const int b = bucket_of_[static_cast<size_t>(param)];
    if (b < 0) return bytes();
    --buckets_[static_cast<size_t>(b)].pending;
    int64_t most = bytes();
    while (next_ < buckets_.size() && buckets_[next_].pending <= 0) {
      const Bucket& bucket = buckets_[next_];
      // A bucket of one parameter is reduced in place: its gradient is the buffer.
      const bool in_place = bucket.params == 1;
      if (free_grads_) {
        // The oldest buffers are drained (into the shard, made at the first drain) before
        // another is made.
        while (in_flight_.size() >= kZero2BucketsInFlight) {
          alive_ -= in_flight_.front().first;
          if (!in_flight_.front().second) copies_ -= in_flight_.front().first;
          in_flight_.pop_front();
          drained_ = true;
        }
        in_flight_.emplace_back(bucket.bytes, in_place);
      }
      if (in_place) {
        // ddp, zero1: the gradient stays where it is; zero2: the buffer takes it over.
        if (free_grads_) {
          alive_ += bucket.bytes;
          freed_ += bucket.bytes;
        }
      } else {
        // The buffer is made and filled, then (zero2) the gradients go.
        alive_ += bucket.bytes;
        copies_ += bucket.bytes;
        peak_copies_ = std::max(peak_copies_, copies_);
        most = std::max(most, bytes());
        if (free_grads_) freed_ += bucket.bytes;
      }
      ++next_;
    }
    return std::max(most, bytes());
  }
  int64_t bytes() const override {
    return alive_ - freed_ + (free_grads_ && drained_ ? shard_bytes_ : 0);
  }
  // The buffers alive now (in-place ones included) and the most copies at once (what the
  // record counts as collective buffers).
  int64_t buffers() const { return alive_; }
  int64_t buffers_peak() const { return peak_copies_; }
  int64_t total() const { return total_; }  // every bucket's buffer
  // The buffers of the buckets of several parameters (the others reduce in place).
  int64_t copied_total() const {
    int64_t sum = 0;
    for (const Bucket& b : buckets_) sum += b.params > 1 ? b.bytes : 0;
    return sum;
  }

 private:
  struct Bucket {
    int64_t bytes, pending, params;
  };
  bool free_grads_;
  int64_t shard_bytes_;
  std::vector<int> bucket_of_;
  std::vector<Bucket> buckets_;
  std::deque<std::pair<int64_t, bool>> in_flight_;  // bytes, in place
  size_t next_ = 0;
  bool drained_ = false;
  int64_t total_ = 0, alive_ = 0, copies_ = 0, peak_copies_ = 0, freed_ = 0;
};

// fsdp: each block's trainable parameters are a unit of N S_b elements, gathered whole (an
// all-gather, whose flat output Gloo allocates beside the unit's buffer) before the block's
// forward and released after it, gathered again when backward reaches the block, and released
// when its last gradient is complete; on the step's last micro-batch that gradient is first
// reduced from a flat copy of N S_b elements (copied again by Gloo's reduce-scatter:
// reduce_copy), this rank's S_b kept. The other parameters' go through zero2's buckets.
class FsdpOverlay : public MemoryTrace::Overlay {
 public:
  FsdpOverlay(const std::vector<MemoryTrace::ParamShape>& shapes, int64_t world,
              int64_t bucket_bytes, bool reduce, bool reduce_copy)
      : world_(world), reduce_(reduce), reduce_copy_(reduce_copy), unit_of_(shapes.size(), -1) {
    std::vector<int64_t> bytes;
    std::vector<bool> root;
    for (size_t i = 0; i < shapes.size(); ++i) {
      bytes.push_back(shapes[i].bytes);
      root.push_back(shapes[i].block < 0);
      if (shapes[i].block < 0) continue;
      const auto b = static_cast<size_t>(shapes[i].block);
      if (units_.size() <= b) units_.resize(b + 1);
      units_[b].bytes += shapes[i].bytes;
      ++units_[b].params;
      unit_of_[i] = static_cast<int>(b);
    }
    for (Unit& u : units_) {
      u.full = world_ * ceil_div(u.bytes / MemoryTrace::kFloat, world_) * MemoryTrace::kFloat;
      u.pending = u.params;
    }
    int64_t root_bytes = 0;
    for (size_t i = 0; i < bytes.size(); ++i) root_bytes += root[i] ? bytes[i] : 0;
    const int64_t root_shard =
        ceil_div(root_bytes / MemoryTrace::kFloat, world_) * MemoryTrace::kFloat;
    root_ = std::make_unique<BucketOverlay>(bytes, root, bucket_bytes, true, root_shard);
  }
  int64_t enter_block(int64_t block, bool backward) override {
    int64_t most = bytes();
    if (!backward) {
      if (current_ >= 0) release(units_[static_cast<size_t>(current_)]);
      current_ = block;
    }
    if (block >= 0 && static_cast<size_t>(block) < units_.size()) {
      Unit& u = units_[static_cast<size_t>(block)];
      if (!u.gathered && u.params > 0 && !(backward && u.pending == 0)) {
        tally(u.full);
        most = std::max(most, bytes() + u.full + u.full);  // the unit's buffer, Gloo's output
        u.gathered = true;
        gathered_ += u.full;
      }
    }
    return std::max(most, bytes());
  }
  int64_t gradient_done(int param) override {
    const int k = unit_of_[static_cast<size_t>(param)];
    if (k < 0) {
      const int64_t most = root_->gradient_done(param) - root_->bytes() + bytes();
      tally(0);
      return most;
    }
    Unit& u = units_[static_cast<size_t>(k)];
    if (--u.pending > 0) return bytes();
    int64_t most = bytes();
    if (reduce_) {
      // The flat copy beside the gradients; the shard kept, the gradients freed, then (with
      // reduce_copy) Gloo's copy of the flat buffer while it reduces.
      tally((reduce_copy_ ? 2 : 1) * u.full);
      most = std::max(most, bytes() + u.full);
      kept_ += u.full / world_;
      freed_ += u.bytes;
      if (reduce_copy_) most = std::max(most, bytes() + 2 * u.full);
    }
    release(u);
    return std::max(most, bytes());
  }
  int64_t bytes() const override { return gathered_ + kept_ - freed_ + root_->bytes(); }
  int64_t buffers_peak() const { return tally_peak_; }
  const BucketOverlay& root() const { return *root_; }

 private:
  struct Unit {
    int64_t bytes = 0, params = 0, full = 0, pending = 0;
    bool gathered = false;
  };
  void release(Unit& u) {
    if (!u.gathered) return;
    u.gathered = false;
    gathered_ -= u.full;
  }
  // The run's tally of collective buffers: gathered units and reduction buffers alive.
  void tally(int64_t transient) {
    tally_peak_ = std::max(tally_peak_, gathered_ + transient + root_->buffers());
  }
  int64_t world_;
  bool reduce_, reduce_copy_;
  std::vector<int> unit_of_;
  std::vector<Unit> units_;
  std::unique_ptr<BucketOverlay> root_;
  int64_t current_ = -1, gathered_ = 0, kept_ = 0, freed_ = 0, tally_peak_ = 0;
};

// One rank's optimizer state and update temporaries, the most over the ranks. Each of
// `spaces` lists the elements of parameters laid end to end; rank r owns [r S, (r+1) S) of
// each, S = ceil(total / N), and its optimizer sees one piece per parameter that touches.
// `largest_piece`: the bytes of the largest piece.
OptimizerMemory sharded_optimizer_memory(const RunConfig& c,
                                         const std::vector<std::vector<int64_t>>& spaces,
                                         int64_t world, int64_t& largest_piece) {
  OptimizerMemory most;
  largest_piece = 0;
  for (int64_t r = 0; r < world; ++r) {
    std::vector<MemoryTrace::ParamShape> pieces;
    for (const auto& space : spaces) {  // elements of each parameter of one flat space
      int64_t total = 0;
      for (int64_t n : space) total += n;
      const int64_t shard = ceil_div(total, world);
      const int64_t lo = std::min(total, r * shard), hi = std::min(total, (r + 1) * shard);
      int64_t at = 0;
      for (int64_t n : space) {
        const int64_t a = std::max(lo, at), b = std::min(hi, at + n);
        if (a < b) {
          pieces.push_back({(b - a) * MemoryTrace::kFloat, 1, 0, false, -1});
          largest_piece = std::max(largest_piece, pieces.back().bytes);
        }
        at += n;
      }
    }
    const OptimizerMemory m = optimizer_memory(c, pieces);
    most.state = std::max(most.state, m.state);
    most.scratch = std::max(most.scratch, m.scratch);
  }
  return most;
}

// Why a sharded step of this configuration is not modelled ("" when it is): what the run
// itself refuses.
std::string unmodelled_sharding(const RunConfig& c, const StepPlan& plan) {
  if (plan.optimizer_step != OptimizerStep::kAfterBackward)
    return "the optimizer cannot step inside backward with --shard";
  std::string refusal = shard_refusal(c.shard, c.optimizer);
  if (!refusal.empty()) return refusal;
  if (c.shard != Shard::kDdp && optimizer_registry().get(c.optimizer).steps_with_closure)
    return "optimizer '" + c.optimizer + "' runs a line search over every parameter";
  return "";
}

// The largest of the phases' peaks, and its phase.
void pick_peak(MemoryEstimate& e) {
  e.peak_bytes = e.forward_peak_bytes;
  e.peak_phase = "forward";
  auto consider = [&](int64_t bytes, const char* phase) {
    if (bytes > e.peak_bytes) {
      e.peak_bytes = bytes;
      e.peak_phase = phase;
    }
  };
  consider(e.backward_peak_bytes, "backward");
  consider(e.optimizer_peak_bytes, "optimizer");
  consider(e.eval_peak_bytes, "eval");
  consider(e.comm_peak_bytes, "communication");
}

// The trainable parameters as the sharded step lays them out: end to end (zero), or the
// blocks' as one flat unit each and the rest end to end (fsdp).
struct FlatLayout {
  std::vector<MemoryTrace::ParamShape> shapes;
  std::vector<int64_t> bytes, elements, root_elements;
  std::vector<std::vector<int64_t>> unit_elements;  // per block: {elements}, or empty
  int64_t trainable = 0, root_bytes = 0;
};

FlatLayout flat_layout(const MemoryTrace& trace) {
  const int64_t f = MemoryTrace::kFloat;
  FlatLayout l;
  l.shapes = trace.trainable_param_shapes();
  for (const auto& p : l.shapes) {
    l.bytes.push_back(p.bytes);
    l.elements.push_back(p.bytes / f);
    l.trainable += p.bytes;
    if (p.block < 0) {
      l.root_elements.push_back(p.bytes / f);
      l.root_bytes += p.bytes;
    } else {
      if (l.unit_elements.size() <= static_cast<size_t>(p.block))
        l.unit_elements.resize(static_cast<size_t>(p.block) + 1);
      auto& u = l.unit_elements[static_cast<size_t>(p.block)];
      if (u.empty()) u.push_back(0);
      u[0] += p.bytes / f;  // a unit is one flat tensor to the optimizer
    }
  }
  return l;
}

// The overlay of one micro-batch's backward: fsdp gathers in every one; the others reduce in
// the last only (`reduce`), zero2 into a shard of `shard_bytes`.
std::unique_ptr<MemoryTrace::Overlay> rank_overlay(const RunConfig& config, const FlatLayout& l,
                                                   int64_t shard_bytes, bool reduce) {
  if (config.shard == Shard::kFsdp) {
    const bool gloo_copy =
        config.grad_reduce == GradReduce::kReduceScatter &&
        reduce_scatter_copies_input(torch::Device(config.device), config.nproc);
    return std::make_unique<FsdpOverlay>(l.shapes, config.nproc, config.bucket_bytes, reduce,
                                         gloo_copy);
  }
  if (!reduce) return nullptr;
  const bool zero2 = config.shard == Shard::kZero2;
  return std::make_unique<BucketOverlay>(l.bytes, std::vector<bool>(l.bytes.size(), true),
                                         config.bucket_bytes, zero2, zero2 ? shard_bytes : 0);
}

int64_t overlay_buffers_peak(const MemoryTrace::Overlay* o) {
  if (const auto* b = dynamic_cast<const BucketOverlay*>(o)) return b->buffers_peak();
  if (const auto* d = dynamic_cast<const FsdpOverlay*>(o)) return d->buffers_peak();
  return 0;
}

// The buffers of a reducing backward still alive when it ends (zero2 keeps a few; fsdp's
// parameters outside the blocks likewise).
int64_t overlay_buffers_left(const MemoryTrace::Overlay* o) {
  if (const auto* b = dynamic_cast<const BucketOverlay*>(o)) return b->buffers();
  if (const auto* d = dynamic_cast<const FsdpOverlay*>(o)) return d->root().buffers();
  return 0;
}

// The forward and backward peaks of the rank's micro-batches and their collective buffers,
// into `e`; returns the buffers the reducing backward leaves alive. Only the last micro-batch's
// backward reduces; the earlier ones keep whole gradients (`full_grads`).
int64_t replay_rank_micro_batches(const RunConfig& config, const MemoryTrace& trace,
                                  const MemoryTrace::Checkpointing& ck, const FlatLayout& l,
                                  int64_t shard_bytes, int64_t steady, int64_t full_grads,
                                  MemoryEstimate& e) {
  const bool accumulates = config.accum_steps > 1;
  auto first_overlay = rank_overlay(config, l, shard_bytes, !accumulates);
  const auto first = trace.replay(ck, false, true, first_overlay.get());
  e.collective_buffers_bytes = overlay_buffers_peak(first_overlay.get());
  int64_t reducing_buffers = accumulates ? 0 : overlay_buffers_left(first_overlay.get());
  e.forward_peak_bytes = steady + first.forward_peak;
  e.backward_peak_bytes = steady + first.backward_peak;
  if (!accumulates) return reducing_buffers;
  // Later micro-batches, with the earlier ones' whole gradients; the last reduces.
  for (bool reduce : {true, false}) {
    if (!reduce && config.accum_steps < 3) continue;
    auto o = rank_overlay(config, l, shard_bytes, reduce);
    const auto later = trace.replay(ck, true, true, o.get());
    e.collective_buffers_bytes =
        std::max(e.collective_buffers_bytes, overlay_buffers_peak(o.get()));
    if (reduce) reducing_buffers = std::max(reducing_buffers, overlay_buffers_left(o.get()));
    e.forward_peak_bytes = std::max(e.forward_peak_bytes, steady + full_grads + later.forward_peak);
    e.backward_peak_bytes =
        std::max(e.backward_peak_bytes, steady + full_grads + later.backward_peak);
  }
  return reducing_buffers;
}

// One rank's memory under --shard with N ranks, replacing the one-process figures of `e`:
// what each mode keeps of the parameters, gradients and optimizer state, and the collectives'
// buffers over the step (strategy/shard.cpp).
void estimate_rank(const RunConfig& config, const MemoryTrace& trace,
                   const MemoryTrace::Checkpointing& ck, int64_t data_bytes, MemoryEstimate& e) {
  const int64_t world = config.nproc;
  const Shard mode = config.shard;
  const bool fsdp = mode == Shard::kFsdp;
  const int64_t f = MemoryTrace::kFloat;
  const FlatLayout l = flat_layout(trace);
  e.sharded = true;
  e.nproc = world;
  e.shard = shard_name(mode);
  e.flat_elements = l.trainable / f;
  const int64_t S = ceil_div(e.flat_elements, world);
  const int64_t root_shard = ceil_div(l.root_bytes / f, world);
  int64_t units_shard = 0;  // the blocks' shards, fsdp
  for (const auto& u : l.unit_elements)
    if (!u.empty()) units_shard += ceil_div(u[0], world);

  // What the rank keeps between steps.
  OptimizerMemory om{e.optimizer_state_bytes, e.optimizer_scratch_bytes, std::nullopt};
  int64_t largest_piece = 0;
  if (mode == Shard::kZero1 || mode == Shard::kZero2) {
    om = sharded_optimizer_memory(config, {l.elements}, world, largest_piece);
    e.shard_elements = S;
  } else if (fsdp) {
    std::vector<std::vector<int64_t>> spaces = {l.root_elements};
    for (const auto& u : l.unit_elements)
      if (!u.empty()) spaces.push_back(u);
    om = sharded_optimizer_memory(config, spaces, world, largest_piece);
    e.shard_elements = root_shard + units_shard;
    // The blocks' parameters are a shard of S_b each; the rest, frozen ones included, whole.
    e.params_bytes = e.params_bytes - (l.trainable - l.root_bytes) + units_shard * f;
  } else {
    e.shard_elements = e.flat_elements;
  }
  e.optimizer_state_bytes = om.state;
  e.optimizer_scratch_bytes = om.scratch;
  const int64_t steady = e.params_bytes + e.optimizer_state_bytes + e.batch_bytes + data_bytes;

  // Gradients after the reduction: all (ddp, zero1), this rank's shard (zero2), the blocks'
  // shards and the shard of the rest (fsdp).
  const int64_t full_grads = e.grads_bytes;
  if (mode == Shard::kZero2) e.grads_bytes = S * f;
  if (fsdp) e.grads_bytes = (units_shard + root_shard) * f;
  const int64_t reducing_buffers =
      replay_rank_micro_batches(config, trace, ck, l, S * f, steady, full_grads, e);

  // After backward: the reductions still running are waited for and drained. ddp and zero1
  // copy the buckets into the whole gradients; zero2 into a shard of zeros made first.
  // Every bucket's buffer alive at once (but those reduced in place).
  const int64_t buckets =
      fsdp ? 0
           : BucketOverlay(l.bytes, std::vector<bool>(l.bytes.size(), true), config.bucket_bytes,
                           false)
                 .copied_total();
  if (mode == Shard::kDdp || mode == Shard::kZero1) {
    e.comm_peak_bytes = steady + full_grads + buckets;
    e.collective_buffers_bytes = std::max(e.collective_buffers_bytes, buckets);
  } else if (mode == Shard::kZero2) {
    e.comm_peak_bytes = steady + reducing_buffers + S * f;
  } else {  // the blocks' gradient shards, the other parameters' buckets and their shard
    e.comm_peak_bytes = steady + units_shard * f + reducing_buffers + root_shard * f;
  }
  // After the update, zero and fsdp's parameters outside the blocks gather the shards in
  // chunks of bucket_bytes / 4 / N elements: the rank's chunk and N received, counted as the
  // collective's buffers, and Gloo's flat output of N more.
  if (mode != Shard::kDdp) {
    const int64_t per_chunk = std::max<int64_t>(1, config.bucket_bytes / f / world);
    const int64_t chunk = std::min(per_chunk, fsdp ? root_shard : S) * f;
    e.comm_peak_bytes = std::max(e.comm_peak_bytes, steady + (2 * world + 1) * chunk);
    e.collective_buffers_bytes = std::max(e.collective_buffers_bytes, (world + 1) * chunk);
  }
  const int64_t rank_grads =
      mode == Shard::kZero1 || mode == Shard::kDdp ? full_grads : e.grads_bytes;
  // zero and fsdp take the global gradient norm from each piece's squares: a float64 copy of
  // the piece and its square at once.
  const bool norm = config.clip_grad_norm > 0 || config.log_grad_norm;
  const int64_t norm_bytes = mode != Shard::kDdp && norm ? 4 * largest_piece : 0;
  e.optimizer_peak_bytes = steady + rank_grads + std::max(e.optimizer_scratch_bytes, norm_bytes);
  // Evaluation: fsdp gathers each block for its forward as well.
  auto eval_overlay = fsdp ? rank_overlay(config, l, S * f, false) : nullptr;
  e.eval_peak_bytes = steady + trace.replay(ck, false, false, eval_overlay.get()).forward_peak;
  e.notes.push_back(fmt::format(
      "per rank of {} ranks (--shard {}): activations of its micro-batch of {}; collective "
      "buffers up to {}",
      world, e.shard, config.batch, format_bytes(e.collective_buffers_bytes)));
}

}  // namespace

std::vector<BlockFlops> block_forward_flops(const std::string& model, const nlohmann::json& arch,
                                            int64_t seq_len) {
  const ModelFamily& family = model_registry().get(model);
  return family.block_flops ? family.block_flops(arch, seq_len) : std::vector<BlockFlops>{};
}

RecomputeFlops recompute_flops(const RunConfig& config, const nlohmann::json& arch,
                               int64_t seq_len) {
  RecomputeFlops r;
  const StepPlan plan = config.step_plan();
  if (plan.recompute == Recompute::kNone) return r;
  const int64_t every = std::max<int64_t>(1, plan.recompute_every);
  const bool attention = plan.recompute != Recompute::kMlp;
  const bool mlp = plan.recompute != Recompute::kAttention;
  const auto samples = static_cast<double>(config.effective_batch());
  const std::vector<BlockFlops> blocks = block_forward_flops(config.model, arch, seq_len);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (static_cast<int64_t>(i) % every != 0) continue;
    const double f =
        samples * ((attention ? blocks[i].attention : 0.0) + (mlp ? blocks[i].mlp : 0.0));
    r.per_step += f;
    r.by_tower[blocks[i].tower] += f;
  }
  return r;
}

namespace {

// The model of one micro-batch's step of the run (models/common/memory_trace.h).
MemoryTrace trace_of(const RunConfig& config, const StepPlan& plan) {
  const ModelFamily& family = model_registry().get(config.model);
  optimizer_registry().get(config.optimizer);
  check_usage(family.trace_step != nullptr,
              "no memory model for '" + config.model + "' (a toy problem)",
              "estimate models the transformers: llama, modernbert, nanovlm, vit");
  check_usage(config.batch > 0 && config.accum_steps > 0, "batch and accum-steps must be positive",
              "pass --batch and --accum-steps of at least 1");
  MemoryTrace trace;
  if (plan.loss == LossKind::kChunked) trace.set_loss_chunk(plan.loss_chunk);
  trace.set_packed_projections(config.projections == Projections::kPacked);
  trace.set_attention(config.attention, torch::Device(config.device).is_cuda());
  if (config.lora()) trace.set_lora({config.lora_targets, config.lora_rank, config.lora_dropout});
  family.trace_step(resolve_arch(config), config.batch, trace);
  return trace;
}

}  // namespace

std::vector<ParamPlace> trainable_param_places(const RunConfig& config) {
  std::vector<ParamPlace> out;
  for (const auto& p : trace_of(config, config.step_plan()).trainable_param_shapes())
    out.push_back({p.bytes, p.block});
  return out;
}

MemoryEstimate estimate_run(const RunConfig& config, int64_t data_bytes) {
  const StepPlan plan = config.step_plan();
  const MemoryTrace trace = trace_of(config, plan);

  MemoryEstimate e;
  e.params_bytes = trace.params_bytes();
  e.batch_bytes = trace.persistent_bytes();
  e.data_bytes = data_bytes;
  e.frozen_params_bytes = trace.frozen_params_bytes();
  const OptimizerMemory om = optimizer_memory(config, trace.trainable_param_shapes());
  e.optimizer_state_bytes = om.state;
  e.optimizer_scratch_bytes = om.scratch;

  const MemoryTrace::Checkpointing ck = checkpointing_of(plan);
  const auto first = trace.replay(ck, /*grads_exist=*/false, /*with_grad=*/true);
  e.grads_bytes = first.grads_bytes;
  e.grads_at_backward_peak_bytes = first.grads_at_backward_peak;
  e.activations_bytes = first.saved_bytes;
  e.logits_bytes = first.head_saved_bytes;
  // The steady state from the second step on: parameters, optimizer state, batch and data.
  const int64_t steady = e.params_bytes + e.optimizer_state_bytes + e.batch_bytes + data_bytes;
  e.forward_peak_bytes = steady + first.forward_peak;
  e.backward_peak_bytes = steady + first.backward_peak;
  // Whether a buffer of every gradient exists. Not when the optimizer steps in backward (fused,
  // accumulation+fused): each gradient is applied to its parameter, or folded into the
  // optimizer state, as its AccumulateGrad finishes, and freed there.
  const bool grad_buffer = plan.optimizer_step != OptimizerStep::kInBackward;
  if (!grad_buffer) {
    // The replay with gradients already allocated counts each new gradient as a transient of
    // the node that makes it (made, added, freed): here it is made, used by the optimizer and
    // freed. Every micro-batch's backward is that one. An update's temporaries come when its
    // parameter's gradient is complete, after the nodes that read the parameter: the largest
    // parameter's (a tied embedding's, complete at the end of backward) are taken beside its
    // gradient alone, not on top of the backward's peak.
    const auto unbuffered = trace.replay(ck, /*grads_exist=*/true, /*with_grad=*/true);
    const auto sizes = trace.trainable_param_sizes();
    const int64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
    e.grads_bytes = 0;
    e.grads_at_backward_peak_bytes = 0;
    // With accumulation (asked for, even of one micro-batch) the update after the folded
    // micro-batches has temporaries of its own.
    const int64_t update_scratch =
        plan.micro_batches && om.fold_scratch ? *om.fold_scratch : e.optimizer_scratch_bytes;
    e.backward_peak_bytes = steady + std::max(unbuffered.backward_peak, largest + update_scratch);
    e.notes.push_back(
        "no gradient buffer: the optimizer steps in backward and frees each gradient at once");
  } else if (config.accum_steps > 1) {
    // Later micro-batches run with the gradients of the earlier ones allocated.
    const auto later = trace.replay(ck, /*grads_exist=*/true, /*with_grad=*/true);
    e.forward_peak_bytes =
        std::max(e.forward_peak_bytes, steady + e.grads_bytes + later.forward_peak);
    e.backward_peak_bytes =
        std::max(e.backward_peak_bytes, steady + e.grads_bytes + later.backward_peak);
    e.grads_at_backward_peak_bytes = e.grads_bytes;  // the later micro-batches' peak
  }
  // Without a buffer the optimizer's work was done in backward.
  e.optimizer_peak_bytes =
      grad_buffer ? steady + e.grads_bytes + e.optimizer_scratch_bytes : steady;
  // Evaluation: forwards of micro-batch size without a graph.
  const auto eval = trace.replay(ck, false, /*with_grad=*/false);
  e.eval_peak_bytes = steady + eval.forward_peak;

  e.nproc = config.nproc;
  e.shard = shard_name(config.shard);
  if (config.nproc > 1 && config.shard != Shard::kNone) {
    const std::string why = unmodelled_sharding(config, plan);
    if (why.empty())
      estimate_rank(config, trace, ck, data_bytes, e);
    else
      e.notes.push_back("not modelled per rank: " + why + "; the figures are one process's");
    e.grads_at_backward_peak_bytes = e.grads_bytes;  // the rank's, whole
  }
  pick_peak(e);
  if (config.dtype != Dtype::kFp32)
    e.notes.push_back("activations are modelled in float32; bf16 autocast is not modelled");

  const ModelFamily& family = model_registry().get(config.model);
  const nlohmann::json arch = resolve_arch(config);
  const int64_t seq = arch.at("seq_len").get<int64_t>();
  const double forward = family.forward_flops_per_token(arch, seq) *
                         static_cast<double>(config.effective_batch() * seq);
  e.model_flops_per_step = 3.0 * forward;
  // The sub-layers a checkpoint runs again, block by block.
  const RecomputeFlops recompute = recompute_flops(config, arch, seq);
  e.recompute_flops_per_step = recompute.per_step;
  e.recompute_flops_by_tower = recompute.by_tower;
  e.hardware_flops_per_step = e.model_flops_per_step + recompute.per_step;
  return e;
}

int64_t max_batch_within(RunConfig config, int64_t data_bytes, int64_t budget_bytes) {
  auto fits = [&](int64_t b) {
    config.batch = b;
    return estimate_run(config, data_bytes).peak_bytes <= budget_bytes;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (fits(hi)) {
    lo = hi;
    hi *= 2;
    if (hi > (int64_t{1} << 24)) return lo;
  }
  while (hi - lo > 1) {  // fits(lo), !fits(hi)
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

int64_t resident_data_bytes(const RunConfig& config) {
  const ModelFamily& family = model_registry().get(config.model);
  if (config.device != "cpu" || family.kind == ModelKind::kToy) return 0;
  int64_t bytes = 0;
  make_data_source(family, resolve_arch(config), config, &bytes);
  return bytes;
}

}  // namespace gradscope
