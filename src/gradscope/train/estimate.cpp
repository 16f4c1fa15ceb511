#include "gradscope/train/estimate.h"

#include <algorithm>
#include <deque>
#include <memory>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"
#include "gradscope/models/vit.h"
#include "gradscope/optim/adam8bit.h"
#include "gradscope/optim/factory.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/data_source.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

double setting(const RunConfig& c, const std::string& key, double fallback) {
  auto it = c.opt.find(key);
  if (it == c.opt.end()) return fallback;
  if (it->second == "true") return 1;
  if (it->second == "false") return 0;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    return fallback;
  }
}

// Optimizer state and the temporaries of one update, from each optimizer's update rule as
// gradscope and LibTorch implement it: `per_param` holds the parameters' sizes in bytes.
struct OptimizerMemory {
  int64_t state = 0;
  int64_t scratch = 0;
};

OptimizerMemory optimizer_memory(const RunConfig& c,
                                 const std::vector<MemoryTrace::ParamShape>& shapes) {
  std::vector<int64_t> per_param;
  int64_t total = 0, largest = 0, largest_matrix = 0;
  for (const auto& s : shapes) {
    per_param.push_back(s.bytes);
    total += s.bytes;
    largest = std::max(largest, s.bytes);
    if (s.block_matrix) largest_matrix = std::max(largest_matrix, s.bytes);
  }
  const bool decay_in_grad = c.weight_decay > 0;  // grad.add(p, wd): one parameter-sized copy
  const int64_t decay = decay_in_grad ? largest : 0;
  const std::string& o = c.optimizer;
  if (o == "sgd") {
    const bool momentum = setting(c, "momentum", 0) > 0;
    const bool nesterov = setting(c, "nesterov", 0) > 0;
    return {momentum ? total : 0, decay + (nesterov ? largest : 0)};
  }
  if (o == "adam" || o == "adamw") {
    // exp_avg, exp_avg_sq (and max_exp_avg_sq); denom = sqrt(v) / c then + eps: two
    // temporaries of the parameter's size at once.
    const bool amsgrad = setting(c, "amsgrad", 0) > 0;
    return {(amsgrad ? 3 : 2) * total, 2 * largest + (o == "adam" ? decay : 0)};
  }
  if (o == "adagrad") return {total, largest + decay};           // sum; std = sqrt(sum) + eps
  if (o == "adadelta") return {2 * total, 2 * largest + decay};  // square_avg, acc_delta
  if (o == "cg") return {2 * total, 2 * largest + decay};        // previous gradient, direction
  if (o == "lion") return {total, largest};                      // momentum; sign of the blend
  if (o == "adam8bit") {
    // Two 8-bit moments with a float32 scale per block for tensors of at least min_8bit_size
    // elements; float32 moments below it. An update dequantizes one tensor's moments.
    // The optimizer's own defaults, so that the two cannot drift apart.
    const Adam8bitOptions defaults;
    const auto block = static_cast<int64_t>(setting(c, "block_size", defaults.block_size()));
    const auto min8 = static_cast<int64_t>(setting(c, "min_8bit_size", defaults.min_8bit_size()));
    int64_t state = 0;
    for (int64_t b : per_param) {
      const int64_t n = b / MemoryTrace::kFloat;
      state += n >= min8 ? 2 * (n + (n + block - 1) / block * MemoryTrace::kFloat) : 2 * b;
    }
    return {state, 4 * largest + decay};
  }
  if (o == "adam-mini") {
    // m per element; v one float per block: per row (per head for q and k, fewer), per element
    // of a bias, one for a norm's vector. Rows bound the blocks from above.
    int64_t blocks = 0;
    for (const auto& s : shapes) blocks += s.rows;
    return {total + blocks * MemoryTrace::kFloat, 2 * largest};
  }
  if (o == "muon") {
    // Momentum for the blocks' matrices, AdamW's two moments for the rest. An update of the
    // largest matrix: its momentum blend, Newton-Schulz's iterates (about three of its size in
    // bfloat16) and the orthogonalized update.
    int64_t state = 0;
    for (const auto& s : shapes) state += s.block_matrix ? s.bytes : 2 * s.bytes;
    return {state, std::max(2 * largest, 4 * largest_matrix)};
  }
  if (o == "galore" || o == "apollo" || o == "apollo-mini") {
    // Moments in a rank-r space for the blocks' (m, n) matrices, AdamW's for the rest. galore
    // also keeps its projector (min(m, n) x r); apollo draws its projection again each step
    // and keeps one float for its norm limiter; apollo-mini has rank 1.
    const double rank = o == "apollo-mini" ? 1.0 : setting(c, "rank", 0);
    int64_t state = 0, scratch = 2 * largest;
    for (const auto& s : shapes) {
      if (!s.block_matrix) {
        state += 2 * s.bytes;
        continue;
      }
      const int64_t lo = std::min(s.rows, s.cols), hi = std::max(s.rows, s.cols);
      const int64_t r = rank >= 1 ? static_cast<int64_t>(rank) : std::max<int64_t>(1, lo / 4);
      const int64_t f = MemoryTrace::kFloat;
      state += o == "galore" ? f * (lo * r + 2 * r * hi) : f * (2 * r * hi + 1);
      // The projection, the projected gradient, the moments' update and the full-size update.
      scratch = std::max(scratch, f * (lo * r + 3 * r * hi) + s.bytes);
    }
    return {state, scratch};
  }
  fail_usage("no memory model for optimizer '" + o + "'",
             "estimate models sgd, adam, adamw, adagrad, adadelta, cg, lion, adam8bit, adam-mini, "
             "muon, galore, apollo and apollo-mini");
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

// A decoder block of Llama (and NanoVLM's decoder) over T positions, as
// llama_forward_flops_per_token counts it.
BlockFlops llama_block_flops(const LlamaConfig& c, int64_t tokens, const char* tower) {
  const double C = static_cast<double>(c.hidden_size), T = static_cast<double>(tokens);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double I = static_cast<double>(c.intermediate_size);
  BlockFlops b;
  b.tower = tower;
  b.attention = 2.0 * T * (C * q + 2 * C * kv + q * C) + 2.0 * 2.0 * T * T * q;
  b.mlp = 2.0 * T * 3 * C * I;  // gate, up, down
  return b;
}

// An encoder block of ViT (and NanoVLM's vision tower), as vision_forward_flops_per_image
// counts it.
BlockFlops vision_block_flops(const VisionConfig& c, const char* tower) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double T = static_cast<double>(c.num_tokens());
  BlockFlops b;
  b.tower = tower;
  b.attention = 2.0 * T * 4 * C * C + 2.0 * 2.0 * T * T * C;  // q, k, v, o; scores, sum
  b.mlp = 2.0 * T * 2 * C * I;                                // fc1, fc2
  return b;
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
// all-reduced from a flat copy of N S_b elements and this rank's S_b kept (the whole
// gradients freed). The other parameters' gradients go through zero2's buckets.
class FsdpOverlay : public MemoryTrace::Overlay {
 public:
  FsdpOverlay(const std::vector<MemoryTrace::ParamShape>& shapes, int64_t world,
              int64_t bucket_bytes, bool reduce)
      : world_(world), reduce_(reduce), unit_of_(shapes.size(), -1) {
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
      // The flat copy beside the gradients, then the shard kept and the gradients freed.
      tally(u.full);
      most = std::max(most, bytes() + u.full);
      kept_ += u.full / world_;
      freed_ += u.bytes;
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
  bool reduce_;
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

// One rank's memory under --shard with N ranks, replacing the one-process figures of `e`:
// what each mode keeps of the parameters, gradients and optimizer state, and the collectives'
// buffers over the step (strategy/shard.cpp).
void estimate_rank(const RunConfig& config, const MemoryTrace& trace,
                   const MemoryTrace::Checkpointing& ck, int64_t data_bytes, MemoryEstimate& e) {
  const int64_t world = config.nproc;
  const Shard mode = config.shard;
  const bool fsdp = mode == Shard::kFsdp;
  const int64_t f = MemoryTrace::kFloat;
  const std::vector<MemoryTrace::ParamShape> shapes = trace.trainable_param_shapes();
  std::vector<int64_t> bytes, elements, root_elements;
  std::vector<std::vector<int64_t>> unit_elements;
  int64_t trainable = 0, root_bytes = 0;
  for (const auto& p : shapes) {
    bytes.push_back(p.bytes);
    elements.push_back(p.bytes / f);
    trainable += p.bytes;
    if (p.block < 0) {
      root_elements.push_back(p.bytes / f);
      root_bytes += p.bytes;
    } else {
      if (unit_elements.size() <= static_cast<size_t>(p.block))
        unit_elements.resize(static_cast<size_t>(p.block) + 1);
      auto& u = unit_elements[static_cast<size_t>(p.block)];
      if (u.empty()) u.push_back(0);
      u[0] += p.bytes / f;  // a unit is one flat tensor to the optimizer
    }
  }
  e.sharded = true;
  e.nproc = world;
  e.shard = shard_name(mode);
  e.flat_elements = trainable / f;
  const int64_t S = ceil_div(e.flat_elements, world);
  const int64_t root_shard = ceil_div(root_bytes / f, world);
  int64_t units_shard = 0;  // the blocks' shards, fsdp
  for (const auto& u : unit_elements)
    if (!u.empty()) units_shard += ceil_div(u[0], world);

  // What the rank keeps between steps.
  OptimizerMemory om{e.optimizer_state_bytes, e.optimizer_scratch_bytes};
  int64_t largest_piece = 0;
  if (mode == Shard::kZero1 || mode == Shard::kZero2) {
    om = sharded_optimizer_memory(config, {elements}, world, largest_piece);
    e.shard_elements = S;
  } else if (fsdp) {
    std::vector<std::vector<int64_t>> spaces = {root_elements};
    for (const auto& u : unit_elements)
      if (!u.empty()) spaces.push_back(u);
    om = sharded_optimizer_memory(config, spaces, world, largest_piece);
    e.shard_elements = root_shard + units_shard;
    // The blocks' parameters are a shard of S_b each; the rest, frozen ones included, whole.
    e.params_bytes = e.params_bytes - (trainable - root_bytes) + units_shard * f;
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

  // The micro-batches: only the last one's backward reduces; the earlier ones keep whole
  // gradients. fsdp gathers in every one.
  auto overlay = [&](bool reduce) -> std::unique_ptr<MemoryTrace::Overlay> {
    if (fsdp) return std::make_unique<FsdpOverlay>(shapes, world, config.bucket_bytes, reduce);
    if (!reduce) return nullptr;
    const bool zero2 = mode == Shard::kZero2;
    return std::make_unique<BucketOverlay>(bytes, std::vector<bool>(bytes.size(), true),
                                           config.bucket_bytes, zero2, zero2 ? S * f : 0);
  };
  auto buffers_peak = [](const MemoryTrace::Overlay* o) -> int64_t {
    if (const auto* b = dynamic_cast<const BucketOverlay*>(o)) return b->buffers_peak();
    if (const auto* d = dynamic_cast<const FsdpOverlay*>(o)) return d->buffers_peak();
    return 0;
  };
  const bool accumulates = config.accum_steps > 1;
  auto first_overlay = overlay(!accumulates);
  const auto first = trace.replay(ck, false, true, first_overlay.get());
  e.collective_buffers_bytes = buffers_peak(first_overlay.get());
  // The buffers of the reducing backward still alive when it ends (zero2 keeps a few; fsdp's
  // parameters outside the blocks likewise).
  int64_t reducing_buffers = 0;
  auto note_reducing = [&](const MemoryTrace::Overlay* o) {
    if (const auto* b = dynamic_cast<const BucketOverlay*>(o))
      reducing_buffers = std::max(reducing_buffers, b->buffers());
    if (const auto* d = dynamic_cast<const FsdpOverlay*>(o))
      reducing_buffers = std::max(reducing_buffers, d->root().buffers());
  };
  if (!accumulates) note_reducing(first_overlay.get());
  e.forward_peak_bytes = steady + first.forward_peak;
  e.backward_peak_bytes = steady + first.backward_peak;
  if (accumulates) {
    // Later micro-batches, with the earlier ones' whole gradients; the last reduces.
    for (bool reduce : {true, false}) {
      if (!reduce && config.accum_steps < 3) continue;
      auto o = overlay(reduce);
      const auto later = trace.replay(ck, true, true, o.get());
      e.collective_buffers_bytes = std::max(e.collective_buffers_bytes, buffers_peak(o.get()));
      if (reduce) note_reducing(o.get());
      e.forward_peak_bytes =
          std::max(e.forward_peak_bytes, steady + full_grads + later.forward_peak);
      e.backward_peak_bytes =
          std::max(e.backward_peak_bytes, steady + full_grads + later.backward_peak);
    }
  }

  // After backward: the reductions still running are waited for and drained. ddp and zero1
  // copy the buckets into the whole gradients; zero2 into a shard of zeros made first.
  // Every bucket's buffer alive at once (but those reduced in place).
  const int64_t buckets =
      fsdp ? 0
           : BucketOverlay(bytes, std::vector<bool>(bytes.size(), true), config.bucket_bytes, false)
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
  auto eval_overlay = fsdp ? overlay(false) : nullptr;
  e.eval_peak_bytes = steady + trace.replay(ck, false, false, eval_overlay.get()).forward_peak;
  e.notes.push_back(fmt::format(
      "per rank of {} ranks (--shard {}): activations of its micro-batch of {}; collective "
      "buffers up to {}",
      world, e.shard, config.batch, format_bytes(e.collective_buffers_bytes)));
}

}  // namespace

std::vector<BlockFlops> block_forward_flops(const std::string& model, const nlohmann::json& arch,
                                            int64_t seq_len) {
  std::vector<BlockFlops> blocks;
  if (model == "llama") {
    const LlamaConfig c = llama_config(arch);
    blocks.assign(static_cast<size_t>(c.num_hidden_layers),
                  llama_block_flops(c, seq_len, "decoder"));
  } else if (model == "vit") {
    const VisionConfig c = vision_config(arch, "vit");
    blocks.assign(static_cast<size_t>(c.num_hidden_layers), vision_block_flops(c, "encoder"));
  } else if (model == "modernbert") {
    // As modernbert_forward_flops_per_token: attention over the full T x T matrix, which the
    // kernels compute whatever the sliding window keeps; GeGLU's Wi maps C -> 2I.
    const ModernBertConfig c = modernbert_config(arch);
    const double C = static_cast<double>(c.hidden_size),
                 I = static_cast<double>(c.intermediate_size);
    const double T = static_cast<double>(seq_len);
    BlockFlops b;
    b.tower = "encoder";
    b.attention = 2.0 * T * 4 * C * C + 2.0 * 2.0 * T * T * C;
    b.mlp = 2.0 * T * 3 * C * I;
    blocks.assign(static_cast<size_t>(c.num_hidden_layers), b);
  } else if (model == "nanovlm") {
    // model.blocks() lists the vision tower's blocks, then the decoder's; the decoder runs
    // over the image tokens and the caption.
    const NanoVlmConfig c = nanovlm_config(arch);
    blocks.assign(static_cast<size_t>(c.vision.num_hidden_layers),
                  vision_block_flops(c.vision, "vision"));
    const BlockFlops d = llama_block_flops(c.decoder, c.image_tokens() + seq_len, "decoder");
    blocks.insert(blocks.end(), static_cast<size_t>(c.decoder.num_hidden_layers), d);
  }
  return blocks;
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

MemoryEstimate estimate_run(const RunConfig& config, int64_t data_bytes) {
  const ModelFamily& family = model_registry().get(config.model);
  const StepPlan plan = config.step_plan();
  optimizer_registry().get(config.optimizer);
  check_usage(family.trace_step != nullptr,
              "no memory model for '" + config.model + "' (a toy problem)",
              "estimate models the transformers: llama, modernbert, nanovlm, vit");
  check_usage(config.batch > 0 && config.accum_steps > 0, "batch and accum-steps must be positive",
              "pass --batch and --accum-steps of at least 1");
  const nlohmann::json arch = resolve_arch(config);
  MemoryTrace trace;
  if (plan.loss == LossKind::kLossChunked) trace.set_loss_chunk(plan.loss_chunk);
  trace.set_packed_projections(config.projections == Projections::kPacked);
  trace.set_attention(config.attention, torch::Device(config.device).is_cuda());
  if (config.lora()) trace.set_lora({config.lora_targets, config.lora_rank, config.lora_dropout});
  family.trace_step(arch, config.batch, trace);

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
    e.backward_peak_bytes =
        steady + std::max(unbuffered.backward_peak, largest + e.optimizer_scratch_bytes);
    e.notes.push_back(
        "no gradient buffer: the optimizer steps in backward and frees each gradient at once");
  } else if (config.accum_steps > 1) {
    // Later micro-batches run with the gradients of the earlier ones allocated.
    const auto later = trace.replay(ck, /*grads_exist=*/true, /*with_grad=*/true);
    e.forward_peak_bytes =
        std::max(e.forward_peak_bytes, steady + e.grads_bytes + later.forward_peak);
    e.backward_peak_bytes =
        std::max(e.backward_peak_bytes, steady + e.grads_bytes + later.backward_peak);
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
  }
  pick_peak(e);
  if (config.dtype != Dtype::kFp32)
    e.notes.push_back("activations are modelled in float32; bf16 autocast is not modelled");

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

nlohmann::json estimate_to_json(const MemoryEstimate& e) {
  nlohmann::json j = {{"peak_bytes", e.peak_bytes},
                      {"peak_phase", e.peak_phase},
                      {"params_bytes", e.params_bytes},
                      {"frozen_params_bytes", e.frozen_params_bytes},
                      {"grads_bytes", e.grads_bytes},
                      {"optimizer_state_bytes", e.optimizer_state_bytes},
                      {"optimizer_scratch_bytes", e.optimizer_scratch_bytes},
                      {"activations_bytes", e.activations_bytes},
                      {"logits_bytes", e.logits_bytes},
                      {"batch_bytes", e.batch_bytes},
                      {"data_bytes", e.data_bytes},
                      {"phase_peak_bytes",
                       {{"forward", e.forward_peak_bytes},
                        {"backward", e.backward_peak_bytes},
                        {"optimizer", e.optimizer_peak_bytes},
                        {"eval", e.eval_peak_bytes}}},
                      {"collective_buffers_bytes", e.collective_buffers_bytes},
                      {"model_flops_per_step", e.model_flops_per_step},
                      {"hardware_flops_per_step", e.hardware_flops_per_step},
                      {"recompute_flops_per_step", e.recompute_flops_per_step},
                      {"recompute_flops_by_tower", e.recompute_flops_by_tower},
                      {"notes", e.notes}};
  if (e.comm_peak_bytes > 0) j["phase_peak_bytes"]["communication"] = e.comm_peak_bytes;
  if (e.sharded)
    j["per_rank"] = {{"nproc", e.nproc},
                     {"shard", e.shard},
                     {"flat_params", e.flat_elements},
                     {"shard_params", e.shard_elements}};
  return j;
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
