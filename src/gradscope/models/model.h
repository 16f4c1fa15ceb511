// What a model exposes to the rest of gradscope. Models know nothing of optimizers,
// strategies or measurement: they turn a batch into a summed loss and a target count, and
// they expose their blocks so that a strategy can wrap them (checkpointing).
//
// Dimension legend: B batch, T sequence positions, C hidden size, V vocabulary,
// NH query heads, NKV key/value heads, HS head size, L layers.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/memory_scope.h"
#include "gradscope/models/common/lora.h"

namespace gradscope {

// One micro-batch. Unused tensors stay undefined.
struct Batch {
  torch::Tensor input_ids;  // (B, T) int64 token ids
  torch::Tensor targets;    // (B, T) int64, kIgnoreIndex where no loss is taken
  torch::Tensor images;     // (B, 3, H, W) float
  torch::Tensor labels;     // (B) int64 class labels
  torch::Tensor text_mask;  // (B, T) bool, true at real tokens, false at padding; undefined
                            // when nothing is padded
  int64_t samples = 0;      // B
  int64_t tokens = 0;       // positions through the transformer (image tokens included)
  // Positions in the loss (targets other than kIgnoreIndex), counted on the CPU by whoever
  // made the batch, so that neither a model nor a strategy waits for the device to learn it.
  int64_t targets_count = 0;

  Batch to(const torch::Device& device) const;
};

constexpr int64_t kIgnoreIndex = -100;

// The loss of a micro-batch as a SUM over its targets, and the number of targets, so that a
// strategy can normalize by the count of the whole effective batch (exact accumulation).
struct LossOutput {
  torch::Tensor loss_sum;  // () float, requires grad
  int64_t target_count = 0;
  int64_t correct = -1;  // classifiers in eval mode: right arg-max predictions; else -1
  // With LossOptions::keep_logits and the full loss: the logits the loss was taken from,
  // detached (ViT (B, K); Llama and NanoVLM (B, T, V); ModernBERT (M, V), its M target
  // positions in row-major order of the batch), a copy where the loss overwrites them (the
  // language models'); else undefined.
  torch::Tensor logits;
};

// Per-forward tensors a block needs besides its input: rotary tables and masks. A model
// builds them once per forward; strategies pass them through untouched.
struct BlockContext {
  torch::Tensor rope_cos;  // (T, HS) rotary tables (global layers)
  torch::Tensor rope_sin;
  torch::Tensor rope_cos_local;  // (T, HS) rotary tables of local layers, if different
  torch::Tensor rope_sin_local;
  torch::Tensor mask;        // additive (T, T) or (B, 1, T, T) mask; undefined = causal/none
  torch::Tensor mask_local;  // sliding-window mask of local layers
  // Whether `mask` already holds the causal constraint (a causal block then passes it as is
  // rather than combining it with the causal mask again in every layer).
  bool mask_includes_causal = false;
};

// The residual sub-layers of a block, which a strategy may treat separately (selective
// checkpointing recomputes one kind and keeps the other's activations).
enum class SubLayer { kAttention, kMlp };

// One residual sub-layer as a function of its input, the residual sum included:
// x -> x + branch(x), (B, T, C) -> (B, T, C). (With the sum inside, a recompute accumulates
// the input's gradient from the residual and from the branch in plain backward's order, so
// checkpointing it stays bitwise exact.) It must own what it needs (capture by value), since
// a checkpoint runs it again in backward.
using SubLayerFn = std::function<torch::Tensor(const torch::Tensor& x)>;
// How a block calls its branches; the default calls fn(x).
using SubLayerRunner =
    std::function<torch::Tensor(SubLayer which, const SubLayerFn& fn, const torch::Tensor& x)>;

class Block : public torch::nn::Module {
 public:
  // (B, T, C) -> (B, T, C)
  virtual torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx) = 0;
  // Whether forward runs its attention and MLP branches through run_sublayer.
  virtual bool exposes_sublayers() const { return false; }

  void set_sublayer_runner(SubLayerRunner runner) { sublayer_runner_ = std::move(runner); }

 protected:
  torch::Tensor run_sublayer(SubLayer which, const SubLayerFn& fn, const torch::Tensor& x) {
    const MemoryScope scope(which == SubLayer::kAttention ? "attention" : "mlp");
    return sublayer_runner_ ? sublayer_runner_(which, fn, x) : fn(x);
  }

 private:
  SubLayerRunner sublayer_runner_;
};

// How a model calls its blocks; the default calls block.forward directly.
using BlockRunner =
    std::function<torch::Tensor(Block& block, const torch::Tensor& x, const BlockContext& ctx)>;

// The layers of the block runner, outermost first. Each memory method that wraps the blocks
// installs its runner at its own layer, and the model calls them nested in this order
// whatever order they were installed in, so that methods combine without knowing each other:
//   - kShard: fsdp gathers a block's parameters around everything else the block runs,
//     the recompute in backward included (strategy/shard.h);
//   - kRecompute: checkpointing runs the block without a graph and again in backward,
//     keeping only its input (strategy/checkpoint.h), in the precision the plan keeps it in.
// What changes the block's own modules (LoRA's adapters, packed projections) is no runner:
// it is inside every layer. The innermost runner calls block.forward.
enum class RunnerLayer { kShard = 0, kRecompute, kCount };
// One layer: runs the block, calling `inner` (the layers inside it, then the block) as it
// needs to, once or not at all.
using LayeredBlockRunner =
    std::function<torch::Tensor(Block& block, const torch::Tensor& x, const BlockContext& ctx,
                                const BlockRunner& inner)>;

// How a language-model head takes its cross-entropy (--loss, --loss-chunk).
struct LossOptions {
  bool chunked = false;      // chunks of positions, the logits never held for the whole batch
  int64_t chunk_rows = 256;  // positions per chunk
  // Called, when set, in training forwards and with either loss: with true just before the
  // projection to the vocabulary (after the final norm; ModernBERT: before its MLM head), with
  // false once the summed loss exists; lets the trainer measure what the head keeps for
  // backward without models reading a meter. Models only test and call it (no allocation).
  std::function<void(bool starts)> head_probe;
  // Whether the full loss hands back its logits (LossOutput::logits), to compare them with
  // another implementation's; the chunked loss never holds them whole and gives none.
  bool keep_logits = false;
};

// Around a language model's loss head, from the projection to the vocabulary to the summed
// loss: calls the head probe (LossOptions) as the head starts and, unless it threw, once the
// loss exists, in training forwards; and labels what the head allocates as logits, module
// "loss head" (core/memory_scope.h).
class LossHeadScope {
 public:
  LossHeadScope(const LossOptions& options, bool training)
      : options_(options), probe_(options.head_probe && training),
        exceptions_(std::uncaught_exceptions()) {
    if (probe_) options_.head_probe(true);
  }
  ~LossHeadScope() {
    if (probe_ && std::uncaught_exceptions() == exceptions_) options_.head_probe(false);
  }
  LossHeadScope(const LossHeadScope&) = delete;
  LossHeadScope& operator=(const LossHeadScope&) = delete;

 private:
  const LossOptions& options_;
  const bool probe_;
  const int exceptions_;
  const MemoryScope component_{MemoryComponent::kLogits};
  const MemoryScope module_{std::string("loss head")};
};

class Model : public torch::nn::Module {
 public:
  // Summed loss over the batch's targets.
  virtual LossOutput loss(const Batch& batch) = 0;
  // The transformer blocks, in order.
  virtual std::vector<std::shared_ptr<Block>> blocks() = 0;
  // Whether the loss is a language-model head's cross-entropy over a vocabulary (what
  // --loss chunked changes).
  virtual bool has_lm_head() const { return false; }

  // Installs `runner` at `layer`, replacing what that layer held (empty: the layer passes
  // the block to the next one inward).
  void set_block_runner(RunnerLayer layer, LayeredBlockRunner runner);
  // Whether any layer holds a runner.
  bool has_block_runner() const;
  void set_loss_options(LossOptions options) { loss_options_ = std::move(options); }
  const LossOptions& loss_options() const { return loss_options_; }
  // --projections packed: every attention and gated MLP of the model multiplies its
  // projections that read one input as one product (models/common/layers.h).
  void set_packed_projections(bool packed);

  // LoRA (--lora-targets): adapters on the targeted projections of the blocks (common/lora.h),
  // drawn from `gen`, and every other parameter frozen (requires_grad false) but those of
  // lora_trainable(). Returns the adapted layers' names; empty when the model has none of
  // the targeted projections.
  std::vector<std::string> add_lora(const LoraOptions& options, at::Generator& gen);
  // Modules that keep training beside the adapters: a task head that starts untrained (ViT's
  // classifier, as PEFT's modules_to_save); none by default.
  virtual std::vector<std::string> lora_trainable() const { return {}; }
  // The module whose projections get adapters ("" = the whole model; NanoVLM: its decoder).
  virtual std::string lora_scope() const { return ""; }

 protected:
  // Runs `block` through the installed layers, outermost first.
  torch::Tensor run_block(Block& block, const torch::Tensor& x, const BlockContext& ctx) {
    return run_block_from(0, block, x, ctx);
  }

 private:
  torch::Tensor run_block_from(size_t layer, Block& block, const torch::Tensor& x,
                               const BlockContext& ctx);

  // The module path each block's allocations are labelled with (core/memory_scope.h): its
  // name in the model ("layers.3", "decoder.layers.3"), found on first use.
  const std::string& block_scope_name(const Block& block);

  std::array<LayeredBlockRunner, static_cast<size_t>(RunnerLayer::kCount)> runners_;
  LossOptions loss_options_;
  std::unordered_map<const Block*, std::string> block_scope_names_;
};

}  // namespace gradscope
