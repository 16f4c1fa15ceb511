// The settings table's rows from how a step is computed to the outputs, in --help's order
// (settings_table.cpp holds the rows before them and calls add_step_to_output_rows).
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/core/record.h"
#include "gradscope/core/setting_rows.h"
#include "gradscope/core/settings.h"

namespace gradscope {
namespace setting_rows {
namespace {

constexpr double kMinSamplePeriodS = 0.001;

std::vector<std::string> names_of(const std::vector<StrategyDescription>& list) {
  std::vector<std::string> out;
  for (const auto& d : list) out.push_back(d.name);
  return out;
}

// What --checkpoint-policy may name: what a recompute can be, but none.
std::vector<std::string> policy_names() {
  std::vector<std::string> out = recompute_names();
  out.erase(std::remove(out.begin(), out.end(), recompute_name(Recompute::kNone)), out.end());
  return out;
}

}  // namespace

void add_step_to_output_rows(std::vector<Setting>& t) {
  using R = SettingRole;
  using S = SettingSection;
  using T = SettingType;

  // --- how a step is computed ---
  {
    const auto& shorthands = strategy_shorthands();
    Setting s = choice_row<StrategyShorthand>(
        "strategy", "strategy", &RunConfig::strategy, S::kStep,
        "Memory strategy: a shorthand for the settings below (see `gradscope list`; default: what "
        "they say, standard when none is given)",
        parse_strategy, nullptr, names_of(shorthands));
    s.text = [](const RunConfig& c) {
      return c.strategy ? strategy_name(*c.strategy) : std::string();
    };
    // Written as what the step plan does, so a refined shorthand records its own name and the
    // study's five strategies keep the names (and the run ids) they had.
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      out["strategy"] = c.strategy_label();
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = choice_row<Recompute>(
        "recompute", "recompute", &RunConfig::recompute, S::kStep,
        "What a checkpointed block recomputes in backward: none, full (the whole block), "
        "attention or mlp (only that residual branch) (default: as --strategy says)",
        parse_recompute, recompute_name, recompute_names());
    // The id knows it through the strategy's name and checkpoint_policy (as it always has).
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kRecord)
        out["recompute"] = recompute_name(c.step_plan_as_given().recompute);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = choice_row<Recompute>(
        "checkpoint-policy", "checkpoint_policy", &RunConfig::checkpoint_policy, S::kStep,
        "With checkpointing, what a wrapped block recomputes in backward: full, attention or "
        "mlp (as --recompute)",
        parse_recompute, recompute_name, policy_names());
    const std::string flag = s.flag();
    s.parse = [flag](RunConfig& c, const std::string& text) {
      const auto v = parse_recompute(text);
      check_usage(v && *v != Recompute::kNone, fmt::format("unknown {} '{}'", flag, text),
                  "valid values: full, attention, mlp");
      c.checkpoint_policy = *v;
    };
    s.text = [](const RunConfig& c) {
      return std::string(recompute_name(c.checkpoint_policy.value_or(Recompute::kFull)));
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      const Recompute r = c.step_plan_as_given().recompute;
      out["checkpoint_policy"] = recompute_name(
          r != Recompute::kNone ? r
                                         : c.checkpoint_policy.value_or(Recompute::kFull));
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("checkpoint-every", "checkpoint_every", &RunConfig::checkpoint_every,
                           T::kInteger, R::kDefines, S::kStep,
                           "With recomputation: recompute every K-th block (1 = every block)");
    s.check = at_least(&RunConfig::checkpoint_every, s.flag(), 1,
                       "pass 1 to checkpoint every block, k to checkpoint every k-th block");
    t.push_back(std::move(s));
  }
  {
    Setting s = choice_row<Dtype>(
        "saved-input", "saved_input", &RunConfig::saved_input, S::kStep,
        "With recomputation: the dtype a checkpoint keeps its input in until backward, fp32 (as "
        "computed, exact) or bf16 (half the bytes; the recompute runs from the rounded input, "
        "so the gradients are approximate, docs/strategies.md)",
        parse_dtype, dtype_name, dtype_names());
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(c.saved_input == Dtype::kFp32 || c.step_plan_as_given().recompute !=
                                                      Recompute::kNone,
                  fmt::format("{} bf16 needs recomputation, which keeps the input", flag),
                  "add --strategy checkpoint or --recompute full, attention or mlp");
    };
    // In the id and the record only when bf16, so that the ids and records of runs without
    // it stay what they were.
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (c.saved_input != Dtype::kFp32) out["saved_input"] = dtype_name(c.saved_input);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("accum-steps", "accum_steps", &RunConfig::accum_steps, T::kInteger,
                           R::kDefines, S::kStep,
                           "Micro-batches per optimizer step (effective batch = batch x "
                           "accum-steps)");
    s.check = at_least(&RunConfig::accum_steps, s.flag(), 1,
                       "pass --accum-steps with a value of at least 1");
    t.push_back(std::move(s));
  }
  {
    Setting s = choice_row<OptimizerStep>(
        "optimizer-step", "optimizer_step", &RunConfig::optimizer_step, S::kStep,
        "Where the parameters are updated: after-backward, or in-backward (each as soon as its "
        "gradient is complete, then the gradient freed) (default: as --strategy says)",
        parse_optimizer_step, optimizer_step_name, optimizer_step_names());
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kRecord)
        out["optimizer_step"] = optimizer_step_name(c.step_plan_as_given().optimizer_step);
    };
    t.push_back(std::move(s));
  }

  {
    Setting s = choice_row<LossKind>(
        "loss", "loss", &RunConfig::loss, S::kStep,
        "Cross-entropy of a language-model head: full (the logits of every position at once) or "
        "chunked (--loss-chunk positions at a time, their gradients taken in forward; llama, "
        "nanovlm, modernbert)",
        parse_loss_kind, loss_kind_name, loss_kind_names());
    // In the id only when chunked: the key is newer than the first records, whose ids hold.
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kRecord || c.loss != LossKind::kFull)
        out["loss"] = loss_kind_name(c.loss);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("loss-chunk", "loss_chunk", &RunConfig::loss_chunk, T::kInteger,
                           R::kDefines, S::kStep,
                           "With --loss chunked: positions whose logits exist at once");
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(c.loss_chunk >= 1, fmt::format("{} {} must be at least 1", flag, c.loss_chunk),
                  "pass a chunk of at least one position, e.g. --loss-chunk 256");
      check_usage(c.loss == LossKind::kChunked || c.loss_chunk == RunConfig().loss_chunk,
                  fmt::format("{} only applies with --loss chunked", flag),
                  "add --loss chunked, or leave --loss-chunk out");
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kRecord || c.loss != LossKind::kFull)
        out["loss_chunk"] = c.loss_chunk;
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = choice_row<Projections>(
        "projections", "projections", &RunConfig::projections, S::kStep,
        "separate (one matrix product per projection) or packed (q, k and v as one product "
        "over a copy of their stacked weights, gate and up as one; the parameters stay separate "
        "tensors with their own names). Packs the attention of vit, llama, nanovlm and "
        "modernbert, and the SwiGLU of llama and nanovlm; modernbert's GeGLU (Wi) is one product "
        "already, vit has no gated MLP, toy has neither",
        parse_projections, projections_name, projections_names());
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kRecord ||
          c.projections != Projections::kSeparate)
        out["projections"] = projections_name(c.projections);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = choice_row<Attention>(
        "attention", "attention", &RunConfig::attention, S::kStep,
        "sdpa (LibTorch's scaled_dot_product_attention, which picks a fused kernel where the "
        "inputs allow one and falls back to its own math otherwise), math (softmax(QK^T / "
        "sqrt(d) + mask) V written out, the scores kept for backward) or auto (sdpa on CUDA, "
        "and on the CPU wherever no dropout is applied to the attention weights; math there)",
        parse_attention, attention_name, attention_names());
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kRecord || c.attention != Attention::kAuto)
        out["attention"] = attention_name(c.attention);
    };
    t.push_back(std::move(s));
  }

  // --- shape of the work ---
  {
    Setting s = member_row("batch", "batch", &RunConfig::batch, T::kInteger, R::kDefines,
                           S::kShape, "Micro-batch size (samples)");
    s.check = at_least(&RunConfig::batch, s.flag(), 1, "pass --batch with a value of at least 1");
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("seq", "seq_len", &RunConfig::seq_len, T::kInteger, R::kDefines,
                           S::kShape, "Sequence length (default: the preset's)");
    const auto base = s.parse;
    s.parse = [base](RunConfig& c, const std::string& text) {
      base(c, text);
      check_usage(c.seq_len > 0, fmt::format("--seq {} must be positive", c.seq_len),
                  "leave --seq out for the preset's sequence length");
    };
    s.text = [](const RunConfig& c) {
      return c.seq_len > 0 ? std::to_string(c.seq_len) : std::string();
    };
    s.check = [](const RunConfig& c) {
      check_usage(c.seq_len >= 0, fmt::format("--seq {} must be positive", c.seq_len),
                  "pass --seq with a value of at least 1, or leave it out for the preset's");
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("steps", "steps", &RunConfig::steps, T::kInteger, R::kDefines,
                           S::kShape, "Timed optimizer steps");
    s.check = at_least(&RunConfig::steps, s.flag(), 1, "pass --steps with a value of at least 1");
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("warmup-steps", "warmup_steps", &RunConfig::warmup_steps,
                           T::kInteger, R::kDefines, S::kShape,
                           "Untimed optimizer steps before the timed ones (they train too)");
    s.check =
        at_least(&RunConfig::warmup_steps, s.flag(), 0, "pass 0 for no untimed warm-up steps");
    t.push_back(std::move(s));
  }
  t.push_back(member_row("seed", "seed", &RunConfig::seed, T::kInteger, R::kDefines,
                         S::kShape, "Seed of weights, data order and dropout"));

  // --- evaluation ---
  {
    Setting s = member_row("eval-every", "eval_every", &RunConfig::eval_every, T::kInteger,
                           R::kDefines, S::kEvaluation,
                           "Evaluate on the validation split every N steps (0 = only at the "
                           "end)");
    s.check = at_least(&RunConfig::eval_every, s.flag(), 0, "pass 0 to evaluate only at the end");
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("eval-batches", "eval_batches", &RunConfig::eval_batches,
                           T::kInteger, R::kDefines, S::kEvaluation,
                           "Validation batches per evaluation, of the effective batch size "
                           "(batch x accum-steps), so that every strategy is evaluated on the "
                           "same samples");
    s.check = at_least(&RunConfig::eval_batches, s.flag(), 1,
                       "pass --eval-batches with a value of at least 1");
    t.push_back(std::move(s));
  }

  // --- where it runs ---
  {
    Setting s = member_row("device", "device", &RunConfig::device, T::kText, R::kDefines,
                           S::kDevice, "cpu, cuda or cuda:N");
    // The device kind defines the run (cpu or cuda), its index does not.
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      out["device"] = purpose == JsonPurpose::kIdentity
                          ? c.device.substr(0, c.device.find(':'))
                          : c.device;
    };
    t.push_back(std::move(s));
  }
  t.push_back(choice_row<Dtype>("dtype", "dtype", &RunConfig::dtype, S::kDevice,
                                "fp32, or bf16: bfloat16 autocast (matrix products in bfloat16; "
                                "parameters, gradients and optimizer state stay float32)",
                                parse_dtype, dtype_name, dtype_names()));
  {
    Setting s =
        member_row("threads", "threads", &RunConfig::threads, T::kInteger, R::kMeasures,
                   S::kDevice,
                   "Intra-op and BLAS threads (0 = LibTorch's default); at most 4 x the cores "
                   "this process may run on");
    s.check = at_least(&RunConfig::threads, s.flag(), 0, "pass 0 for LibTorch's default");
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("memory-cap", "memory_cap_bytes", &RunConfig::memory_cap_bytes,
                           T::kBytes, R::kDefines, S::kDevice,
                           "Refuse allocations beyond this many bytes (e.g. 512MiB, 8GiB): the "
                           "run behaves as on a smaller device and ends with status oom");
    s.parse = [](RunConfig& c, const std::string& text) { c.memory_cap_bytes = parse_bytes(text); };
    s.text = [](const RunConfig& c) {
      return c.memory_cap_bytes > 0 ? std::to_string(c.memory_cap_bytes) : std::string();
    };
    s.check = [](const RunConfig& c) {
      check_usage(c.memory_cap_bytes >= 0, "--memory-cap must be positive",
                  "write a size such as 512MiB or 8GiB");
    };
    t.push_back(std::move(s));
  }
  add_rank_rows(t);
  {
    Setting s = member_row("timeout", "timeout_s", &RunConfig::timeout_s, T::kNumber,
                           R::kMeasures, S::kDevice,
                           "Stop with status timeout after this many seconds (0 = no limit)");
    s.check = non_negative(&RunConfig::timeout_s, s.flag(), "pass 0 for no time limit");
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("diverge-above", "diverge_above", &RunConfig::diverge_above,
                           T::kNumber, R::kMeasures, S::kDevice,
                           "End with status diverged when the training loss rises above this "
                           "multiple of the first step's loss, a blow-up without a NaN (0 = only "
                           "a NaN or infinite loss; a first loss of 0 or below is not compared)");
    // A configuration written before the setting existed ran with none: read it back as 0.
    const auto read = s.read;
    s.read = [read](RunConfig& c, const json& in) {
      if (!in.contains("diverge_above")) c.diverge_above = 0;
      read(c, in);
    };
    s.check = [](const RunConfig& c) {
      check_usage(c.diverge_above == 0 || (c.diverge_above > 1 && std::isfinite(c.diverge_above)),
                  fmt::format("--diverge-above {} must be 0 (off) or above 1", c.diverge_above),
                  "pass e.g. --diverge-above 10, or 0 to end only on a NaN or infinite loss");
    };
    t.push_back(std::move(s));
  }

  // --- how it is measured ---
  {
    Setting s = member_row("sample-period", "sample_period_s", &RunConfig::sample_period_s,
                           T::kNumber, R::kMeasures, S::kMeasure,
                           "Seconds between samples of utilization, memory, power and energy "
                           "(0 = no sampler)");
    s.check = [](const RunConfig& c) {
      // The sampler keeps every sample until the run ends: one a millisecond is already a
      // few MB a minute of run, and its reads of /proc take a core of their own.
      check_usage(c.sample_period_s == 0 ||
                      (c.sample_period_s >= kMinSamplePeriodS && std::isfinite(c.sample_period_s)),
                  fmt::format("--sample-period must be 0 (no sampler) or at least {} s",
                              kMinSamplePeriodS),
                  "pass 0 to turn the sampler off, or a period such as 0.1");
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("no-phase-timing", "phase_timing", &RunConfig::phase_timing,
                           T::kFlag, R::kMeasures, S::kMeasure,
                           "Do not synchronize and read the clock at each phase (phase times "
                           "are then null)");
    // The flag says "no"; the record says whether phases were timed.
    s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
      c.phase_timing = !parse_flag(flag, text);
    };
    s.text = [](const RunConfig& c) { return std::string(c.phase_timing ? "false" : "true"); };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("no-grad-norm", "log_grad_norm", &RunConfig::log_grad_norm, T::kFlag,
                           R::kMeasures, S::kMeasure,
                           "Do not record the global gradient norm of every step (saves its "
                           "device synchronization; clipping still measures it)");
    s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
      c.log_grad_norm = !parse_flag(flag, text);
    };
    s.text = [](const RunConfig& c) { return std::string(c.log_grad_norm ? "false" : "true"); };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("watts-per-core", "watts_per_core", &RunConfig::watts_per_core,
                           T::kNumber, R::kMeasures, S::kMeasure,
                           "CPU energy estimate when nothing measures energy: CPU seconds x "
                           "this");
    s.check = [](const RunConfig& c) {
      check_usage(c.watts_per_core > 0 && std::isfinite(c.watts_per_core),
                  "--watts-per-core must be positive",
                  "pass the power of one busy core in watts, e.g. 10");
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("grid-intensity", "grid_g_per_kwh", &RunConfig::grid_g_per_kwh,
                           T::kNumber, R::kMeasures, S::kMeasure,
                           "Carbon intensity of the electricity in g CO2/kWh (0 = no carbon "
                           "figure)");
    s.check = [](const RunConfig& c) {
      check_usage(c.grid_g_per_kwh >= 0 && std::isfinite(c.grid_g_per_kwh),
                  "--grid-intensity must be >= 0",
                  "pass g CO2 per kWh, e.g. 400, or 0 for no carbon figure");
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kRecord)
        out["grid_g_per_kwh"] = c.grid_g_per_kwh > 0 ? json(c.grid_g_per_kwh) : json(nullptr);
    };
    t.push_back(std::move(s));
  }

  // --- outputs ---
  t.push_back(member_row("memory-snapshot", "", &RunConfig::memory_snapshot, T::kText,
                         R::kOutput, S::kOutput,
                         "Write the memory history to this file as the pickle PyTorch's "
                         "memory_viz reads (CPU: gradscope's labelled history of the "
                         "--memory-steps; CUDA: the caching allocator's, of the whole run)"));
  t.push_back(member_row("memory-timeline", "", &RunConfig::memory_timeline, T::kText,
                         R::kOutput, S::kOutput,
                         "Write every allocation and free of the --memory-steps to this file, "
                         "each labelled with its component, module and phase: the timeline "
                         "`gradscope report --memory-timeline` draws (docs/memory-timeline.md)"));
  {
    Setting s = member_row("memory-steps", "", &RunConfig::memory_steps, T::kText, R::kOutput,
                           S::kOutput,
                           "The steps --memory-timeline (and a CPU --memory-snapshot) records, "
                           "A or A-B, 1-based with the warm-up counted (default: the first timed "
                           "step)");
    s.check = [](const RunConfig& c) { memory_window_steps(c); };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("memory-timeline-cap", "", &RunConfig::memory_timeline_cap_bytes,
                           T::kBytes, R::kOutput, S::kOutput,
                           "The size cap of the --memory-timeline file (and of the one a CPU "
                           "--memory-snapshot is made from): past it, events are counted, not "
                           "written, and the file says so");
    s.parse = [](RunConfig& c, const std::string& text) {
      c.memory_timeline_cap_bytes = parse_bytes(text);
    };
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(c.memory_timeline_cap_bytes >= (int64_t{4} << 20),
                  fmt::format("{} {} is below 4MiB", flag, c.memory_timeline_cap_bytes),
                  "write a size such as 256MiB");
    };
    t.push_back(std::move(s));
  }
  t.push_back(member_row("db", "", &RunConfig::db_path, T::kText, R::kOutput,
                         S::kOutput, "SQLite results database"));
  t.push_back(member_row("json", "", &RunConfig::json_path, T::kText, R::kOutput,
                         S::kOutput, "Also write the run record to this JSON file"));
  {
    Setting s = member_row("sweep", "", &RunConfig::sweep, T::kText, R::kOutput,
                           S::kOutput,
                           "Name of the sweep this run belongs to (set by sweeps)");
    s.check = [](const RunConfig& c) {
      check_usage(c.sweep.empty() || is_label_text(c.sweep, kMaxSweepLabel),
                  fmt::format("--sweep must be at most {} bytes of UTF-8 without control characters",
                              kMaxSweepLabel),
                  "write e.g. --sweep my-study");
    };
    t.push_back(std::move(s));
  }
  t.push_back(member_row("save-weights", "", &RunConfig::save_weights, T::kText, R::kOutput,
                         S::kOutput,
                         "At the end, write the trained weights to this folder as Hugging "
                         "Face does: config.json and model.safetensors"));
  {
    Setting s = member_row("save-adapters", "", &RunConfig::save_adapters, T::kFlag,
                           R::kOutput, S::kOutput,
                           "With --lora-targets and --save-weights: write the adapters alone "
                           "(adapter_config.json and adapter_model.safetensors, as PEFT does) "
                           "instead of merging them into the base weights");
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(!c.save_adapters || (c.lora() && !c.save_weights.empty()),
                  flag + " needs --lora-targets and --save-weights",
                  "add --lora-targets and --save-weights DIR, or leave " + flag + " out");
    };
    t.push_back(std::move(s));
  }
  t.push_back(member_row("save-state", "", &RunConfig::save_state, T::kText, R::kOutput,
                         S::kOutput,
                         "Keep the training state (weights, optimizer, generators, step, "
                         "measurements) in this folder, so that --resume can continue the run"));
  {
    Setting s = member_row("state-every", "", &RunConfig::state_every, T::kInteger,
                           R::kOutput, S::kOutput,
                           "With --save-state: save every N steps (0 = only when stopped by "
                           "SIGTERM or SIGINT)");
    s.check = at_least(&RunConfig::state_every, s.flag(), 0,
                       "pass --state-every 0 to save only when the run is stopped");
    t.push_back(std::move(s));
  }
  t.push_back(member_row("resume", "", &RunConfig::resume, T::kText, R::kOutput,
                         S::kOutput,
                         "Continue the run whose training state is in this folder (written by "
                         "--save-state with the same settings)"));
  t.push_back(member_row("quiet", "", &RunConfig::quiet, T::kFlag, R::kOutput,
                         S::kOutput, "No progress and no summary"));
}

}  // namespace setting_rows
}  // namespace gradscope
