// `gradscope eval`: the loss of a model on held-out data, from weights (--init-from) or from a
// preset's seeded initialisation, printed and written as JSON.
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradscope/cli/commands.h"
#include "gradscope/cli/settings_options.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/settings.h"
#include "gradscope/train/data_source.h"
#include "gradscope/train/eval.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

struct EvalCliOptions {
  SettingOptions settings;
  std::string split = "val";
  std::string text;
  std::string json;
};

RunConfig eval_defaults() {
  RunConfig c;
  c.steps = 1;
  c.warmup_steps = 0;
  return c;
}

// The run settings `gradscope eval` takes, from the settings table: those of the sections that
// decide what a forward pass over held-out data computes (the model and its data, how a step's
// loss is computed, the batch's shape, evaluation, the device), less what only training reads.
// A setting added to those sections reaches eval unless it is named here, so that the loss of
// a run's model can always be reproduced.
std::vector<std::string> eval_settings() {
  static const std::set<std::string> kTrainingOnly = {
      "dropout", "lora-targets", "lora-rank", "lora-alpha", "lora-dropout",
      "init-adapters",  // model
      "strategy", "recompute", "checkpoint-policy", "checkpoint-every", "optimizer-step",
      "attention",                                                // how a step is computed
      "steps", "warmup-steps", "eval-every",                      // shape, evaluation
      "memory-cap", "nproc", "nnodes", "network", "shard", "grad-reduce", "bucket-size",
      "dist-timeout",
      "timeout"};  // device
  static const std::set<SettingSection> kSections = {
      SettingSection::kModel, SettingSection::kStep, SettingSection::kShape,
      SettingSection::kEvaluation, SettingSection::kDevice};
  std::vector<std::string> names;
  for (const Setting& s : run_settings())
    if (s.role != SettingRole::kOutput && kSections.count(s.section) &&
        !kTrainingOnly.count(s.name))
      names.push_back(s.name);
  return names;
}

// The result as `--json` writes it.
nlohmann::json eval_result(const Session& session, const Evaluation& e, const std::string& split,
                           bool causal) {
  const RunConfig& rc = session.config();
  return {{"model", rc.model},
          {"preset", rc.preset},
          {"init_from",
           rc.init_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(rc.init_from)},
          {"seed", rc.seed},
          {"run_id", session.resolved().run_id},
          {"dataset", rc.dataset},
          {"tokenizer",
           rc.tokenizer.empty() ? nlohmann::json(nullptr) : nlohmann::json(rc.tokenizer)},
          {"split", split},
          {"seq_len", rc.seq_len},
          {"dtype", dtype_name(rc.dtype)},
          {"batch", rc.batch},
          {"samples", e.samples},
          {"targets", e.targets},
          {"loss_nats", e.val_loss},
          {"perplexity", causal && std::isfinite(e.val_loss)
                             ? nlohmann::json(std::exp(e.val_loss))
                             : nlohmann::json(nullptr)},
          {"accuracy", e.accuracy ? nlohmann::json(*e.accuracy) : nlohmann::json(nullptr)},
          {"data", session.data().describe()}};
}

// What `gradscope eval` does once its options are read.
void run_eval(const EvalCliOptions& o) {
  RunConfig c = eval_defaults();
  o.settings.apply(c);
  std::string split = o.split;
  if (!o.text.empty()) {
    check_usage(!o.settings.given("dataset"), "--text and --dataset both name the data",
                "pass one of them");
    c.dataset = o.text;
    split = "all";
  }
  if (!o.json.empty()) {
    check_output_path(o.json);
    check_output_file("--json", o.json, OutputKind::kEvalResult);
  }
  const bool as_training = o.settings.given("eval-batches");
  check_usage(!(as_training && split == "all"),
              "--eval-batches reads training's validation windows, and --split all has none",
              "leave --eval-batches out to read every window once");
  const ResolvedRun resolved = resolve_run(c);
  const ModelFamily& family = model_registry().get(c.model);
  check_usage(family.kind != ModelKind::kToy,
              "toy problem '" + c.model + "' has no held-out data to evaluate",
              "its record's toy part says where the optimizer ended");
  SessionOptions options;
  options.updater = false;
  if (split == "all")
    options.data =
        make_data_source(family, resolved.arch, resolved.config, nullptr, DataSplit::kAll);
  Session session(c, options);
  const RunConfig& rc = session.config();
  EvalPass pass;
  pass.batch = rc.batch;
  pass.bf16 = rc.dtype == Dtype::kBf16;
  pass.whole = !as_training;
  pass.micro_batches =
      eval_micro_batches(rc.eval_batches, rc.accum_steps, rc.batch, session.data().val_samples());
  const Evaluation e = evaluate_model(session.model(), session.data(), session.device(), pass);

  const bool text = family.kind != ModelKind::kImageClassification;
  const bool causal =
      family.kind == ModelKind::kCausalLm || family.kind == ModelKind::kVisionLanguage;
  const std::string split_text =
      split == "all" ? "all" : (as_training ? "val, the windows training evaluates" : "val");
  fmt::print(
      "{} {} from {}\n", rc.model, rc.preset,
      rc.init_from.empty() ? fmt::format("its initialisation (seed {})", rc.seed) : rc.init_from);
  fmt::print("  data        {} ({}), {} samples, {} {}\n", rc.dataset.empty() ? "-" : rc.dataset,
             split_text, e.samples, e.targets,
             causal ? "predicted tokens" : (text ? "masked tokens" : "images"));
  fmt::print("  loss        {:.6f} nats per {}\n", e.val_loss, text ? "token" : "image");
  if (causal && std::isfinite(e.val_loss))
    fmt::print("  perplexity  {:.4f}\n", std::exp(e.val_loss));
  if (e.accuracy) fmt::print("  accuracy    {:.4f}\n", *e.accuracy);
  if (!o.json.empty())
    write_json_atomically(o.json, eval_result(session, e, split_text, causal));
}

}  // namespace

void add_eval_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<EvalCliOptions>();
  CLI::App* cmd = root.add_subcommand(
      "eval",
      "The loss of a model on held-out data, without training: weights from --init-from (a\n"
      "Hugging Face folder or a .safetensors file), or the preset's initialisation from --seed.\n"
      "Text (llama, modernbert): the data set's validation split (--split val: its last 2%),\n"
      "or every token of it (--split all; --text FILE is --dataset FILE --split all), tokenized\n"
      "whole with no BOS; windows of seq + 1 tokens stepped by seq, so that every token after\n"
      "the first is predicted once; a last partial window is dropped. llama: mean next-token\n"
      "loss in nats and its perplexity; modernbert: masked-token loss with the validation's\n"
      "seeded masks; vit: loss and accuracy on the test split; nanovlm: caption loss on the\n"
      "validation split. Every held-out window is read once, in micro-batches of --batch;\n"
      "with --eval-batches N, the windows training's evaluation reads instead (N x\n"
      "--accum-steps micro-batches of --batch): with the run's --batch, --accum-steps,\n"
      "--eval-batches, --dtype, --seed, --loss and --projections, the figure equals the\n"
      "validation loss of its record, bit for bit on the CPU.\n"
      "Exit 0, or 2 for bad input.\n"
      "Example: gradscope eval --model llama --preset tiny --init-from out/weights");
  o->settings.add_to(cmd, eval_defaults(), eval_settings());
  cmd->add_option("--split", o->split,
                  "val (the validation split, as training evaluates) or all (every token of "
                  "the data set; text models only)")
      ->check(CLI::IsMember({"val", "all"}));
  cmd->add_option("--text", o->text,
                  "Evaluate this text file whole (a shorthand for --dataset FILE --split all)");
  cmd->add_option("--json", o->json, "Also write the result to this JSON file");
  cmd->callback([o, &exit_code] {
    run_eval(*o);
    exit_code = 0;
  });
}

}  // namespace gradscope
