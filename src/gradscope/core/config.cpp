#include "gradscope/core/config.h"

#include <torch/torch.h>
#include "gradscope/core/rng.h"

namespace gradscope {

nlohmann::json canonical_config_json(const RunConfig& c) {
  nlohmann::json j;
  j["model"] = c.model;
  j["preset"] = c.preset;
  j["dataset"] = c.dataset;
  j["tokenizer"] = c.tokenizer;
  j["dropout"] = c.dropout ? nlohmann::json(*c.dropout) : nlohmann::json(nullptr);
  // Keys that are new since the first runs appear only when set, so old run ids still hold.
  if (!c.arch_overrides.empty()) j["arch_overrides"] = c.arch_overrides;
  j["optimizer"] = c.optimizer;
  j["lr"] = c.lr;
  if (c.lr_auto)
    j["lr_search"] = {{"trials", c.lr_search_trials},
                      {"steps", c.lr_search_steps},
                      {"span_decades", c.lr_search_span}};
  j["opt"] = c.opt;
  j["weight_decay"] = c.weight_decay;
  j["lr_schedule"] = c.lr_schedule;
  j["lr_warmup_steps"] = c.lr_warmup_steps;
  j["clip_grad_norm"] = c.clip_grad_norm;
  j["strategy"] = c.strategy;
  j["checkpoint_every"] = c.checkpoint_every;
  j["checkpoint_policy"] = c.checkpoint_policy;
  j["accum_steps"] = c.accum_steps;
  j["batch"] = c.batch;
  j["seq_len"] = c.seq_len;
  j["steps"] = c.steps;
  j["warmup_steps"] = c.warmup_steps;
  j["eval_every"] = c.eval_every;
  j["eval_batches"] = c.eval_batches;
  j["seed"] = c.seed;
  // The device kind matters (cpu vs cuda), its index does not.
  j["device"] = c.device.substr(0, c.device.find(':'));
  j["dtype"] = c.dtype;
  j["memory_cap_bytes"] = c.memory_cap_bytes;
  return j;
}

nlohmann::json config_to_json(const RunConfig& c) {
  nlohmann::json j = canonical_config_json(c);
  j["device"] = c.device;
  j["lr_auto"] = c.lr_auto;
  j["threads"] = c.threads;
  j["timeout_s"] = c.timeout_s;
  j["sample_period_s"] = c.sample_period_s;
  j["phase_timing"] = c.phase_timing;
  j["watts_per_core"] = c.watts_per_core;
  j["grid_g_per_kwh"] =
      c.grid_g_per_kwh > 0 ? nlohmann::json(c.grid_g_per_kwh) : nlohmann::json(nullptr);
  return j;
}

std::string run_id_of(const nlohmann::json& canonical) {
  // nlohmann::json keeps object keys sorted, so dump() is canonical.
  const std::string text = canonical.dump();
  // FNV-1a over the text, then two mixed halves: a stable 64-bit digest.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return fmt::format("{:016x}", mix64(h));
}

}  // namespace gradscope
