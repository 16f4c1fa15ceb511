// The settings table: one row per run setting, in the order --help shows them. This file holds
// what is trained and how it is optimized; settings_table_rows.cpp the rest.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/core/record.h"
#include "gradscope/core/setting_rows.h"
#include "gradscope/core/settings.h"

namespace gradscope {

using namespace setting_rows;

namespace {

// --lora-targets: names of lora_target_names(), each once, kept in that order.
std::vector<std::string> parse_lora_targets(const std::string& flag, const std::string& text) {
  const auto& valid = lora_target_names();
  std::set<std::string> given;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    check_usage(std::find(valid.begin(), valid.end(), item) != valid.end(),
                fmt::format("{} '{}': unknown projection '{}'", flag, text, item),
                "name projections among q, k, v, o, gate, up, down, e.g. " + flag + " q,v");
    check_usage(given.insert(item).second,
                fmt::format("{} '{}' names '{}' twice", flag, text, item),
                "name each projection once");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::vector<std::string> out;
  for (const auto& name : valid)
    if (given.count(name)) out.push_back(name);
  return out;
}

// The optimizers step float32 parameters with the rate as a float32 scalar: a rate beyond
// float32's range is no rate at all there (LibTorch refuses it at the first step), and a
// positive rate below its smallest value becomes 0, which trains nothing while the record
// names the rate given. A rate within the range that makes the loss blow up is a run that ends
// `diverged`.
void check_lr_representable(double lr, const std::string& text) {
  constexpr double kFloatMax = static_cast<double>(std::numeric_limits<float>::max());
  constexpr double kFloatLeast = static_cast<double>(std::numeric_limits<float>::denorm_min());
  check_usage(lr <= kFloatMax && (lr == 0 || lr >= kFloatLeast),
              fmt::format("--lr {} cannot be represented as a float32, the type the optimizers "
                          "step the parameters in (from {:.4g} to {:.4g})",
                          text, kFloatLeast, kFloatMax),
              "write e.g. --lr 3e-4");
}

// --lr-chosen-by's limit, in characters (code points): one line of a table.
constexpr size_t kMaxLrChosenBy = 200;

// The code points of well-formed UTF-8: every byte but the continuation bytes.
size_t utf8_characters(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char ch) {
    return (static_cast<unsigned char>(ch) & 0xc0) != 0x80;
  }));
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

}  // namespace

std::vector<Setting> build_settings_table() {
  using R = SettingRole;
  using S = SettingSection;
  using T = SettingType;
  std::vector<Setting> t;

  // --- what is trained ---
  t.push_back(member_row("model", "model", &RunConfig::model, T::kText, R::kDefines,
                         S::kModel, "Architecture (see `gradscope list`)"));
  t.push_back(member_row("preset", "preset", &RunConfig::preset, T::kText, R::kDefines,
                         S::kModel, "tiny (tests), small (CPU) or paper (published size)"));
  t.push_back(member_row("dataset", "dataset", &RunConfig::dataset, T::kText, R::kDefines,
                         S::kModel,
                         "Data set: sotu, moby-dick, brown, or a .txt file or folder (default: "
                         "the model's)"));
  t.push_back(member_row("tokenizer", "tokenizer", &RunConfig::tokenizer, T::kText,
                         R::kDefines, S::kModel,
                         "bytes, gpt2, llama3, or a Hugging Face tokenizer.json file (default: the "
                         "preset's, or the --init-from folder's)"));
  {
    Setting s = custom_row("dropout", "dropout", T::kNumber, R::kDefines, S::kModel,
                           "Dropout probability (default: the model's own; docs/usage.md "
                           "says where each comes from)");
    s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
      c.dropout = parse_number(flag, text);
    };
    s.text = [](const RunConfig& c) { return c.dropout ? number_text(*c.dropout) : std::string(); };
    s.check = [](const RunConfig& c) {
      if (c.dropout)
        check_usage(*c.dropout >= 0 && *c.dropout < 1,
                    fmt::format("dropout {} must lie in [0, 1)", *c.dropout),
                    "pass --dropout 0 to turn dropout off, or a probability below 1");
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      out["dropout"] = c.dropout ? json(*c.dropout) : json(nullptr);
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("dropout");
      if (it != in.end() && !it->is_null()) c.dropout = json_number("dropout", *it);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s =
        custom_row("init-from", "init_from", T::kText, R::kDefines, S::kModel,
                   "Start from these weights: a Hugging Face folder (config.json, "
                   "model.safetensors or a sharded set, tokenizer.json) or one "
                   ".safetensors file (default: initialised from --seed)");
    s.parse = [](RunConfig& c, const std::string& text) { c.init_from = text; };
    s.text = [](const RunConfig& c) { return c.init_from; };
    // Only when set: the key is newer than the first records, whose ids must hold.
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (!c.init_from.empty()) out["init_from"] = c.init_from;
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("init_from");
      if (it != in.end() && !it->is_null()) c.init_from = json_text("init_from", *it);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = custom_row(
        "init-adapters", "init_adapters", T::kText, R::kDefines, S::kModel,
        "With --lora-targets: start the adapters from this PEFT folder (adapter_config.json "
        "and adapter_model.safetensors, as PEFT's save_pretrained or --save-adapters writes "
        "them) instead of drawing them; its r and lora_alpha must be --lora-rank and "
        "--lora-alpha, and it must adapt exactly the modules --lora-targets names");
    s.parse = [](RunConfig& c, const std::string& text) { c.init_adapters = text; };
    s.text = [](const RunConfig& c) { return c.init_adapters; };
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(c.init_adapters.empty() || c.lora(), flag + " needs --lora-targets",
                  "add the --lora-targets, --lora-rank and --lora-alpha the adapters have");
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (!c.init_adapters.empty()) out["init_adapters"] = c.init_adapters;
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("init_adapters");
      if (it != in.end() && !it->is_null()) c.init_adapters = json_text("init_adapters", *it);
    };
    t.push_back(std::move(s));
  }
  // LoRA's settings enter the run id only when LoRA is on: the keys are newer than the first
  // records, whose ids must hold.
  {
    Setting s = custom_row(
        "lora-targets", "lora_targets", T::kText, R::kDefines, S::kModel,
        "Train low-rank adapters (LoRA) on these projections of every block and freeze the rest: "
        "a comma-separated list of q, k, v, o, gate, up, down (vit's fc1 is up and fc2 down; "
        "modernbert's Wi is gate and up, Wo down; nanovlm's decoder only). Default: full "
        "training");
    s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
      c.lora_targets = parse_lora_targets(flag, text);
    };
    s.text = [](const RunConfig& c) { return join_names(c.lora_targets); };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (c.lora()) out["lora_targets"] = c.lora_targets;
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("lora_targets");
      if (it == in.end() || it->is_null()) return;
      if (it->is_string()) {
        c.lora_targets = parse_lora_targets("lora_targets", it->get<std::string>());
        return;
      }
      if (!it->is_array()) wrong_type("lora_targets", *it, "a list of projection names");
      std::string text;
      for (const auto& item : *it)
        text += (text.empty() ? "" : ",") + json_text("lora_targets", item);
      c.lora_targets = parse_lora_targets("lora_targets", text);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = custom_row("lora-rank", "lora_rank", T::kInteger, R::kDefines,
                           S::kModel, "With --lora-targets: the adapters' rank r");
    s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
      c.lora_rank = parse_integer(flag, text);
    };
    s.text = [](const RunConfig& c) { return std::to_string(c.lora_rank); };
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(c.lora_rank >= 1, fmt::format("{} {} must be positive", flag, c.lora_rank),
                  "pass a rank of at least 1, e.g. --lora-rank 8");
      check_usage(c.lora() || c.lora_rank == RunConfig().lora_rank,
                  fmt::format("{} only applies with --lora-targets", flag),
                  "add --lora-targets, e.g. --lora-targets q,v");
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (c.lora()) out["lora_rank"] = c.lora_rank;
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("lora_rank");
      if (it != in.end() && !it->is_null()) c.lora_rank = json_integer("lora_rank", *it);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s =
        custom_row("lora-alpha", "lora_alpha", T::kNumber, R::kDefines, S::kModel,
                   "With --lora-targets: alpha; the adapters' update is scaled by "
                   "alpha / rank");
    s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
      c.lora_alpha = parse_number(flag, text);
    };
    s.text = [](const RunConfig& c) { return number_text(c.lora_alpha); };
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(std::isfinite(c.lora_alpha) && c.lora_alpha > 0,
                  fmt::format("{} {} must be positive", flag, c.lora_alpha),
                  "pass e.g. --lora-alpha 16 (twice the rank is common)");
      check_usage(c.lora() || c.lora_alpha == RunConfig().lora_alpha,
                  fmt::format("{} only applies with --lora-targets", flag),
                  "add --lora-targets, e.g. --lora-targets q,v");
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (c.lora()) out["lora_alpha"] = c.lora_alpha;
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("lora_alpha");
      if (it != in.end() && !it->is_null()) c.lora_alpha = json_number("lora_alpha", *it);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = custom_row("lora-dropout", "lora_dropout", T::kNumber, R::kDefines,
                           S::kModel,
                           "With --lora-targets: dropout on the adapters' input, in training");
    s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
      c.lora_dropout = parse_number(flag, text);
    };
    s.text = [](const RunConfig& c) { return number_text(c.lora_dropout); };
    s.check = [flag = s.flag()](const RunConfig& c) {
      check_usage(c.lora_dropout >= 0 && c.lora_dropout < 1,
                  fmt::format("{} {} must lie in [0, 1)", flag, c.lora_dropout),
                  "pass --lora-dropout 0 for none");
      check_usage(c.lora() || c.lora_dropout == RunConfig().lora_dropout,
                  fmt::format("{} only applies with --lora-targets", flag),
                  "add --lora-targets, e.g. --lora-targets q,v");
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (c.lora()) out["lora_dropout"] = c.lora_dropout;
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("lora_dropout");
      if (it != in.end() && !it->is_null()) c.lora_dropout = json_number("lora_dropout", *it);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = custom_row(
        "arch", "arch_overrides", T::kPairs, R::kDefines, S::kModel,
        "Override an architecture key NAME=VALUE (repeatable; Hugging Face names, e.g. --arch "
        "num_hidden_layers=4; toy problems: dim, condition)");
    s.parse = [](RunConfig& c, const std::string& text) {
      auto [name, value] = parse_pair("--arch", text, "num_hidden_layers=4");
      c.arch_overrides[name] = value;
    };
    // Only when set: the key is newer than the first records, whose ids must hold.
    s.write = [](const RunConfig& c, json& out, JsonPurpose) {
      if (!c.arch_overrides.empty()) out["arch_overrides"] = c.arch_overrides;
    };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("arch_overrides");
      if (it != in.end() && !it->is_null()) c.arch_overrides = json_pairs("arch_overrides", *it);
    };
    t.push_back(std::move(s));
  }

  // --- how it is optimized ---
  t.push_back(member_row("optimizer", "optimizer", &RunConfig::optimizer, T::kText,
                         R::kDefines, S::kOptimizer,
                         "Optimizer (see `gradscope list`)"));
  {
    Setting s =
        member_row("lr", "lr", &RunConfig::lr, T::kLr, R::kDefines, S::kOptimizer,
                   "Learning rate, or auto: a short search first (default: the "
                   "optimizer's for the model, see `gradscope list`)");
    s.parse = [](RunConfig& c, const std::string& text) {
      if (text == "auto") {
        c.lr_auto = true;
        c.lr = 0;
        return;
      }
      size_t pos = 0;
      double lr = 0;
      try {
        lr = std::stod(text, &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      check_usage(pos == text.size() && pos > 0, "cannot read --lr '" + text + "' as a number",
                  "write e.g. --lr 3e-4");
      check_usage(lr > 0 && std::isfinite(lr), fmt::format("--lr {} must be > 0", text),
                  "write e.g. --lr 3e-4");
      check_lr_representable(lr, text);
      c.lr = lr;
      c.lr_auto = false;
    };
    s.text = [](const RunConfig& c) {
      return c.lr_auto ? std::string("auto") : c.lr > 0 ? number_text(c.lr) : std::string();
    };
    s.check = [](const RunConfig& c) {
      check_usage(c.lr >= 0 && std::isfinite(c.lr), fmt::format("--lr {} must be > 0", c.lr),
                  "pass a positive learning rate, e.g. --lr 1e-3");
      check_lr_representable(c.lr, number_text(c.lr));
    };
    // The record says whether the rate was searched; the id knows it from "lr_search".
    s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
      out["lr"] = c.lr;
      if (purpose == JsonPurpose::kRecord) out["lr_auto"] = c.lr_auto;
    };
    s.read = [](RunConfig& c, const json& in) {
      if (in.contains("lr") && !in["lr"].is_null()) c.lr = json_number("lr", in["lr"]);
      if (in.contains("lr_auto") && !in["lr_auto"].is_null())
        c.lr_auto = json_bool("lr_auto", in["lr_auto"]);
      else if (in.contains("lr_search") && in["lr_search"].is_object())
        c.lr_auto = true;
    };
    t.push_back(std::move(s));
  }
  {
    // How a fixed rate was chosen says how the run was measured, not which run it is: in the
    // record only, so a run keeps its id whether or not it says. A record written before the
    // setting existed reads back with it empty.
    Setting s = member_row("lr-chosen-by", "lr_chosen_by", &RunConfig::lr_chosen_by, T::kText,
                           R::kMeasures, S::kOptimizer,
                           "How the fixed --lr was chosen, in words, for the record (e.g. "
                           "\"lowest validation loss of 5 rates at seed 100\"; at most "
                           "200 characters, not with --lr auto)");
    s.check = [flag = s.flag()](const RunConfig& c) {
      if (c.lr_chosen_by.empty()) return;
      check_usage(!c.lr_auto, flag + " says how a fixed --lr was chosen, not with --lr auto",
                  "give a fixed --lr, or leave " + flag + " out (--lr auto records its search)");
      check_usage(is_label_text(c.lr_chosen_by, 4 * kMaxLrChosenBy) &&
                      utf8_characters(c.lr_chosen_by) <= kMaxLrChosenBy,
                  fmt::format("{} must be at most {} characters of UTF-8 without control "
                              "characters",
                              flag, kMaxLrChosenBy),
                  "write one short line, e.g. " + flag + " \"lowest validation loss of 5 rates\"");
    };
    t.push_back(std::move(s));
  }
  // The search's three settings are one "lr_search" object of the record and the id, present
  // only with --lr auto.
  const auto search_row = [&](const char* name, const char* sub, auto member, SettingType type,
                              const char* help, std::function<void(const RunConfig&)> check) {
    Setting s =
        member_row(name, "lr_search", member, type, R::kDefines, S::kOptimizer, help);
    s.check = std::move(check);
    s.write = [member, sub](const RunConfig& c, json& out, JsonPurpose) {
      if (c.lr_auto) out["lr_search"][sub] = c.*member;
    };
    s.read = [member, sub](RunConfig& c, const json& in) {
      const auto it = in.find("lr_search");
      if (it == in.end() || !it->is_object() || !it->contains(sub)) return;
      const std::string key = std::string("lr_search.") + sub;
      using V = std::decay_t<decltype(c.*member)>;
      if constexpr (std::is_same_v<V, double>)
        c.*member = json_number(key, (*it)[sub]);
      else
        c.*member = json_integer(key, (*it)[sub]);
    };
    t.push_back(std::move(s));
  };
  search_row("lr-search-trials", "trials", &RunConfig::lr_search_trials, T::kInteger,
             "With --lr auto: learning rates tried, log-spaced around the default",
             [](const RunConfig& c) {
               check_usage(
                   c.lr_search_trials >= 1,
                   fmt::format("--lr-search-trials {} must be at least 1", c.lr_search_trials),
                   "pass e.g. --lr-search-trials 5");
             });
  search_row("lr-search-steps", "steps", &RunConfig::lr_search_steps, T::kInteger,
             "With --lr auto: steps of each trial (0 = a tenth of --steps, at least 10)",
             at_least(&RunConfig::lr_search_steps, "--lr-search-steps", 0,
                      "pass 0 for a tenth of --steps"));
  search_row("lr-search-span", "span_decades", &RunConfig::lr_search_span, T::kNumber,
             "With --lr auto: decades searched either side of the default",
             non_negative(&RunConfig::lr_search_span, "--lr-search-span",
                          "pass the decades either side of the default, e.g. --lr-search-span "
                          "1"));
  {
    Setting s = custom_row("opt", "opt", T::kPairs, R::kDefines, S::kOptimizer,
                           "Optimizer setting NAME=VALUE under PyTorch's name (repeatable), "
                           "e.g. --opt momentum=0.9 --opt nesterov=true, --opt betas=0.9,0.95");
    s.parse = [](RunConfig& c, const std::string& text) {
      auto [name, value] = parse_pair("--opt", text, "momentum=0.9");
      c.opt[name] = value;
    };
    s.write = [](const RunConfig& c, json& out, JsonPurpose) { out["opt"] = c.opt; };
    s.read = [](RunConfig& c, const json& in) {
      const auto it = in.find("opt");
      if (it != in.end() && !it->is_null()) c.opt = json_pairs("opt", *it);
    };
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("weight-decay", "weight_decay", &RunConfig::weight_decay, T::kNumber,
                           R::kDefines, S::kOptimizer,
                           "Weight decay (decoupled for AdamW, Lion, Adafactor; L2 in the "
                           "gradient otherwise)");
    t.push_back(std::move(s));
  }
  t.push_back(choice_row<LrSchedule>(
      "lr-schedule", "lr_schedule", &RunConfig::lr_schedule, S::kOptimizer,
      "constant, or cosine (linear warm-up over --lr-warmup-steps, then cosine to 0)",
      parse_lr_schedule, lr_schedule_name, lr_schedule_names()));
  {
    Setting s = member_row("lr-warmup-steps", "lr_warmup_steps", &RunConfig::lr_warmup_steps,
                           T::kInteger, R::kDefines, S::kOptimizer,
                           "Warm-up length of the cosine schedule");
    s.check =
        at_least(&RunConfig::lr_warmup_steps, s.flag(), 0, "pass 0 for no learning-rate warm-up");
    t.push_back(std::move(s));
  }
  {
    Setting s = member_row("clip-grad-norm", "clip_grad_norm", &RunConfig::clip_grad_norm,
                           T::kNumber, R::kDefines, S::kOptimizer,
                           "Clip the global gradient norm to this value (0 = off)");
    s.check = non_negative(&RunConfig::clip_grad_norm, s.flag(), "pass 0 to turn clipping off");
    t.push_back(std::move(s));
  }

  add_step_to_output_rows(t);
  return t;
}

}  // namespace gradscope
