#include "gradscope/train/estimate.h"

#include <algorithm>

#include "gradscope/core/error.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"
#include "gradscope/models/vit.h"
#include "gradscope/optim/adam8bit.h"
#include "gradscope/optim/factory.h"
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
  ck.enabled = plan.recompute != Recompute::kRecomputeNone;
  ck.every = std::max<int64_t>(1, plan.recompute_every);
  if (plan.recompute == Recompute::kRecomputeAttention)
    ck.unit = MemoryTrace::Unit::kUnitAttention;
  else if (plan.recompute == Recompute::kRecomputeMlp)
    ck.unit = MemoryTrace::Unit::kUnitMlp;
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
  if (plan.recompute == Recompute::kRecomputeNone) return r;
  const int64_t every = std::max<int64_t>(1, plan.recompute_every);
  const bool attention = plan.recompute != Recompute::kRecomputeMlp;
  const bool mlp = plan.recompute != Recompute::kRecomputeAttention;
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
  trace.set_packed_projections(config.projections == Projections::kProjectionsPacked);
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
  const bool grad_buffer = plan.optimizer_step != OptimizerStep::kOptimizerStepInBackward;
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
  if (config.dtype != Dtype::kDtypeFp32)
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
  return {{"peak_bytes", e.peak_bytes},
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
          {"model_flops_per_step", e.model_flops_per_step},
          {"hardware_flops_per_step", e.hardware_flops_per_step},
          {"recompute_flops_per_step", e.recompute_flops_per_step},
          {"recompute_flops_by_tower", e.recompute_flops_by_tower},
          {"notes", e.notes}};
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
  if (config.device != "cpu" || family.kind == ModelKind::kModelKindToy) return 0;
  int64_t bytes = 0;
  make_data_source(family, resolve_arch(config), config, &bytes);
  return bytes;
}

}  // namespace gradscope
