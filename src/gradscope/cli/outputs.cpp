// `gradscope outputs`: one forward and backward pass on a training step's micro-batch, written
// to a safetensors file (the batch, the logits, the loss and every gradient under the published
// names) for comparing gradscope with another implementation of the same model.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gradscope/cli/commands.h"
#include "gradscope/cli/settings_options.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/safetensors.h"
#include "gradscope/core/settings.h"
#include "gradscope/models/common/layers.h"
#include "gradscope/train/batch_outputs.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

struct OutputsCliOptions {
  SettingOptions settings;
  std::string out;
  int64_t step = 1;
};

RunConfig outputs_defaults() {
  RunConfig c;
  c.steps = 1;
  c.warmup_steps = 0;
  return c;
}

// What decides the numbers of one forward and backward pass: the model, its weights and data,
// how attention and the projections are computed, the batch's shape and where it runs.
std::vector<std::string> outputs_settings() {
  return {"model",     "preset",       "dataset",    "tokenizer",     "init-from",
          "arch",      "lora-targets", "lora-rank",  "lora-alpha",    "init-adapters",
          "attention", "projections",  "batch",      "seq",           "seed",
          "device",    "dtype",        "threads"};
}

void run_outputs(const OutputsCliOptions& o) {
  RunConfig c = outputs_defaults();
  o.settings.apply(c);
  c.dropout = 0.0;  // a comparison: the same function on both sides
  check_output_path(o.out);
  check_output_file("--out", o.out, OutputKind::kBatchOutputs);
  SessionOptions options;
  options.updater = false;
  Session session(c, options);
  const BatchOutputs r = batch_outputs(session, o.step);
  const RunConfig& rc = session.config();
  // What was computed, as text (safetensors metadata holds strings only); the attention path
  // as it ran (auto resolved).
  std::string lora = "none";
  if (rc.lora())
    lora = fmt::format("targets {} rank {} alpha {}", fmt::join(rc.lora_targets, ","),
                       rc.lora_rank, rc.lora_alpha);
  write_safetensors(
      o.out, r.tensors,
      {{"content", "gradscope.outputs/1"},
       {"model", rc.model},
       {"preset", rc.preset},
       {"init_from", rc.init_from},
       {"lora", lora},
       {"init_adapters", rc.init_adapters},
       {"attention", attention_name(resolved_attention(rc.attention, session.device(), 0.0))},
       {"dtype", dtype_name(rc.dtype)},
       {"batch", std::to_string(rc.batch)},
       {"seq", std::to_string(rc.seq_len)},
       {"step", std::to_string(o.step)},
       {"run_id", session.resolved().run_id}});
  fmt::print("{} {} from {}: batch of {} (step {}), loss {:.8f} over {} targets, {} gradients "
             "-> {}\n",
             rc.model, rc.preset,
             rc.init_from.empty() ? fmt::format("its initialisation (seed {})", rc.seed)
                                  : rc.init_from,
             rc.batch, o.step, r.loss, r.targets, r.gradients, o.out);
}

}  // namespace

void add_outputs_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<OutputsCliOptions>();
  CLI::App* cmd = root.add_subcommand(
      "outputs",
      "One forward and backward pass, written for comparison with another implementation of\n"
      "the same model (Hugging Face transformers; docs/weights.md, \"Comparing with another\n"
      "implementation\"): the first micro-batch of training step --step (the first --batch\n"
      "samples of the training stream by default), the model in training mode with dropout\n"
      "0, the mean loss over the batch's targets under --dtype, and its backward. --out gets\n"
      "a safetensors file of batch.* (the inputs as the model read them: input_ids, targets\n"
      "(-100 where no loss is taken), images, labels, text_mask), logits, loss, and\n"
      "grad.NAME for every weight under its published name (docs/weights.md \"Names\"); with\n"
      "LoRA (--lora-targets, --init-adapters), the trainable heads' only: the base is frozen.\n"
      "Exit 0, or 2 for bad input.\n"
      "Example: gradscope outputs --model llama --preset tiny --init-from DIR --out llama.st");
  o->settings.add_to(cmd, outputs_defaults(), outputs_settings());
  cmd->add_option("--out", o->out, "The safetensors file to write")->required();
  cmd->add_option("--step", o->step,
                  "The training step whose batch is taken, counted from 1 as a run's steps are "
                  "(warm-up steps included; the record's memory.peak_step names one)")
      ->capture_default_str();
  cmd->callback([o, &exit_code] {
    run_outputs(*o);
    exit_code = 0;
  });
}

}  // namespace gradscope
