// The resolved configuration of one run. Every field says what it means, its default and,
// where there is one, the trade-off. Field names match the run record's "config" keys.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gradscope {

struct RunConfig {
  // --- what is trained ---
  std::string model = "llama";    // registry name: see `gradscope list`
  std::string preset = "tiny";    // tiny (tests), small (CPU), paper (published size)
  std::string dataset;            // "" = the model's default data set
  std::string tokenizer;          // "" = the preset's tokenizer
  std::optional<double> dropout;  // unset = the model's published dropout
  // --arch NAME=VALUE: overrides of the preset's architecture keys (Hugging Face names, or a
  // toy problem's dim/condition), e.g. num_hidden_layers=4.
  std::map<std::string, std::string> arch_overrides;

  // --- how it is optimized ---
  std::string optimizer = "adam";
  double lr = 0;  // 0 = the optimizer's default for this model family
  // --lr auto: train `lr_search_trials` short runs of `lr_search_steps` steps each (0 = a tenth
  // of --steps, at least 10) at learning rates log-spaced over `lr_search_span` decades either
  // side of the default, then the run itself with the one of lowest validation loss.
  bool lr_auto = false;
  int64_t lr_search_trials = 5;
  int64_t lr_search_steps = 0;
  double lr_search_span = 1.0;
  std::map<std::string, std::string> opt;  // --opt NAME=VALUE, PyTorch's names
  double weight_decay = 0;  // decoupled for AdamW, Lion, Adafactor; L2 in the gradient otherwise
  std::string lr_schedule = "constant";  // constant | cosine (linear warm-up, then cosine)
  int64_t lr_warmup_steps = 0;           // linear warm-up length of the cosine schedule
  double clip_grad_norm = 0;             // 0 = off; the norm is recorded every step either way

  // --- memory strategy ---
  std::string strategy = "standard";
  int64_t checkpoint_every = 1;  // with checkpointing: every k-th block
  int64_t accum_steps = 1;       // micro-batches per optimizer step
  // With checkpointing: what a wrapped block recomputes in backward. full (the whole block:
  // least memory, one extra forward of it), attention or mlp (only that residual branch:
  // keeps the other's activations, recomputes less).
  std::string checkpoint_policy = "full";

  // --- shape of the work ---
  int64_t batch = 8;         // micro-batch size; effective batch = batch * accum_steps
  int64_t seq_len = 0;       // 0 = the preset's sequence length
  int64_t steps = 100;       // timed optimizer steps
  int64_t warmup_steps = 2;  // untimed steps before the timed ones (they train too)
  int64_t eval_every = 0;    // 0 = evaluate only at the end
  int64_t eval_batches = 8;  // validation batches per evaluation
  uint64_t seed = 0;

  // --- where it runs ---
  std::string device = "cpu";    // cpu | cuda | cuda:N
  std::string dtype = "fp32";    // fp32 | bf16 (autocast)
  int threads = 0;               // intra-op threads; 0 = LibTorch's default
  int64_t memory_cap_bytes = 0;  // 0 = no cap
  double timeout_s = 0;          // 0 = no limit; stops with status "timeout"

  // --- how it is measured (not part of the run id) ---
  double sample_period_s = 0.1;  // sampler thread period; 0 = no sampler
  bool phase_timing = true;      // synchronize and read the clock at every phase change
  double watts_per_core = 10.0;  // CPU energy estimate when nothing measures energy
  double grid_g_per_kwh = 0;     // carbon intensity of the electricity; 0 = no carbon figure
  std::string memory_snapshot;   // CUDA allocator history file ("" = none)

  // --- outputs (not part of the run id) ---
  std::string db_path = "gradscope.db";
  std::string json_path;  // "" = no JSON record
  std::string sweep;      // sweep name the run belongs to, "" for a single run
  bool quiet = false;

  // The effective batch of one optimizer step.
  int64_t effective_batch() const { return batch * accum_steps; }
};

// Canonical JSON of the settings that define the run (no threads, device index, paths or
// output settings), so that a resumed or re-threaded run keeps its id.
nlohmann::json canonical_config_json(const RunConfig& config);
// Everything, for the record.
nlohmann::json config_to_json(const RunConfig& config);
// Hex digest (16 chars) of canonical_config_json plus the resolved architecture.
std::string run_id_of(const nlohmann::json& canonical);

}  // namespace gradscope
