// The settings table: one row per setting, from which the options, the TOML keys, the
// record's config, the run id and the report's grouping key all come.
#include <gtest/gtest.h>

#include <set>

#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "test_util.h"

namespace gradscope {
namespace {

using nlohmann::json;

RunConfig parsed(const std::vector<std::pair<std::string, std::string>>& settings) {
  RunConfig c;
  for (const auto& [name, value] : settings) find_setting(name)->parse(c, value);
  return c;
}

TEST(SettingsTable, EveryRowIsNamedOnceAndDescribed) {
  std::set<std::string> names, keys;
  for (const Setting& s : run_settings()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_EQ(s.toml_key().find('-'), std::string::npos) << s.name;
    EXPECT_EQ(find_setting(s.name), &s);
    EXPECT_EQ(find_setting(s.toml_key()), &s);
    if (s.type == SettingType::kChoice) EXPECT_FALSE(s.choices.empty()) << s.name;
    // Recorded settings have a record key; outputs are not recorded.
    EXPECT_EQ(s.key.empty(), s.role == SettingRole::kOutput) << s.name;
    // The three --lr-search-* settings share one "lr_search" object; every other key is one row's.
    if (s.key != "lr_search" && !s.key.empty()) EXPECT_TRUE(keys.insert(s.key).second) << s.key;
  }
  EXPECT_EQ(find_setting("no-such-setting"), nullptr);
}

TEST(SettingsTable, BadValuesAreUsageErrorsNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> bad = {{"batch", "0"},
                                                                {"batch", "eight"},
                                                                {"steps", "-3"},
                                                                {"seq", "0"},
                                                                {"lr", "0"},
                                                                {"lr", "fast"},
                                                                {"dtype", "fp16"},
                                                                {"lr-schedule", "saw"},
                                                                {"strategy", "magic"},
                                                                {"recompute", "half"},
                                                                {"checkpoint-policy", "none"},
                                                                {"memory-cap", "12parsecs"},
                                                                {"dropout", "1.5"},
                                                                {"optimizer-step", "sideways"},
                                                                {"opt", "momentum"},
                                                                {"arch", "=4"},
                                                                {"sample-period", "-1"}};
  for (const auto& [name, value] : bad) {
    try {
      RunConfig c;
      find_setting(name)->parse(c, value);
      check_config(c);
      ADD_FAILURE() << "--" << name << " " << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << name;
      const std::string all = std::string(e.what()) + " " + e.hint();
      const bool named =
          all.find("--" + name) != std::string::npos || all.find(value) != std::string::npos;
      EXPECT_TRUE(named) << "--" << name << " " << value << ": " << all;
    }
  }
  // An unknown value of a setting with a fixed set lists the valid ones.
  try {
    RunConfig c;
    find_setting("dtype")->parse(c, "fp16");
  } catch (const Error& e) {
    EXPECT_NE(e.hint().find("fp32, bf16"), std::string::npos) << e.hint();
  }
  RunConfig search;
  search.lr_search_trials = 3;  // without --lr auto
  testing::expect_usage_error([&] { check_config(search); });
}

TEST(SettingsTable, TheRecordsConfigRoundTrips) {
  const RunConfig c = parsed({{"model", "vit"},
                              {"lr", "auto"},
                              {"lr-search-trials", "3"},
                              {"opt", "momentum=0.9"},
                              {"arch", "num_hidden_layers=3"},
                              {"dropout", "0.1"},
                              {"strategy", "checkpoint"},
                              {"recompute", "mlp"},
                              {"checkpoint-every", "2"},
                              {"dtype", "bf16"},
                              {"lr-schedule", "cosine"},
                              {"memory-cap", "1GiB"},
                              {"threads", "3"},
                              {"no-grad-norm", "true"},
                              {"no-phase-timing", "true"},
                              {"grid-intensity", "400"},
                              {"seed", "7"}});
  const json j = config_to_json(c);
  EXPECT_EQ(j["strategy"], "checkpoint");
  EXPECT_EQ(j["recompute"], "mlp");
  EXPECT_EQ(j["checkpoint_policy"], "mlp");
  EXPECT_EQ(j["lr_search"]["trials"], 3);
  EXPECT_EQ(j["lr_auto"], true);
  EXPECT_EQ(j["memory_cap_bytes"], int64_t{1} << 30);
  EXPECT_EQ(j["log_grad_norm"], false);
  EXPECT_EQ(j["phase_timing"], false);
  EXPECT_EQ(j["dtype"], "bf16");
  EXPECT_EQ(config_to_json(config_from_json(j)), j);
  EXPECT_EQ(canonical_config_json(config_from_json(j)), canonical_config_json(c));
  // Outputs are not recorded.
  RunConfig out = c;
  out.db_path = "elsewhere.db";
  out.json_path = "r.json";
  out.quiet = true;
  EXPECT_EQ(config_to_json(out), j);
  // A key of the wrong type is a usage error naming it.
  json bad = j;
  bad["batch"] = "eight";
  try {
    config_from_json(bad);
    ADD_FAILURE() << "a text batch was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.batch"), std::string::npos) << e.what();
  }
}

TEST(SettingsTable, TheIdentityHoldsWhatDefinesTheRun) {
  const RunConfig base;
  const std::string id = run_id_of(canonical_config_json(base));
  // How it is measured, and where results go, leave the id alone.
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"threads", "2"},
                                                        {"timeout", "60"},
                                                        {"sample-period", "0"},
                                                        {"no-phase-timing", "true"},
                                                        {"no-grad-norm", "true"},
                                                        {"watts-per-core", "12"},
                                                        {"grid-intensity", "300"},
                                                        {"db", "x.db"},
                                                        {"json", "x.json"},
                                                        {"device", "cpu"}}) {
    RunConfig c = base;
    find_setting(name)->parse(c, value);
    EXPECT_EQ(run_id_of(canonical_config_json(c)), id) << name;
  }
  // What defines it changes it, evaluation included (the record then holds other evaluations).
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"seed", "1"},
                                                        {"batch", "4"},
                                                        {"eval-batches", "2"},
                                                        {"eval-every", "10"},
                                                        {"strategy", "checkpoint"},
                                                        {"accum-steps", "2"},
                                                        {"optimizer-step", "in-backward"},
                                                        {"memory-cap", "1GiB"},
                                                        {"dtype", "bf16"}}) {
    RunConfig c = base;
    find_setting(name)->parse(c, value);
    EXPECT_NE(run_id_of(canonical_config_json(c)), id) << name;
  }
  // A strategy given by name or by its parts is the same run.
  EXPECT_EQ(canonical_config_json(parsed({{"strategy", "accumulation"}, {"accum-steps", "4"}})),
            canonical_config_json(parsed({{"accum-steps", "4"}})));
  EXPECT_EQ(canonical_config_json(parsed({{"strategy", "fused"}})),
            canonical_config_json(parsed({{"optimizer-step", "in-backward"}})));
  EXPECT_EQ(canonical_config_json(parsed({{"strategy", "checkpoint"}, {"recompute", "mlp"}})),
            canonical_config_json(parsed({{"recompute", "mlp"}})));
}

// --lr-chosen-by says how a fixed rate was chosen: it is recorded and read back, but the run
// is the same run (same id, same configuration) whether or not it says.
TEST(SettingsTable, HowTheRateWasChosenIsRecordedButNotTheRunsIdentity) {
  const RunConfig plain = parsed({{"lr", "0.01"}});
  const RunConfig said =
      parsed({{"lr", "0.01"}, {"lr-chosen-by", "lowest validation loss of 5 rates, \"seed\" 100"}});
  check_config(said);
  const json j = config_to_json(said);
  EXPECT_EQ(j["lr_chosen_by"], "lowest validation loss of 5 rates, \"seed\" 100");
  EXPECT_EQ(config_to_json(plain)["lr_chosen_by"], "");
  EXPECT_EQ(config_from_json(j).lr_chosen_by, said.lr_chosen_by);
  EXPECT_EQ(run_id_of(canonical_config_json(said)), run_id_of(canonical_config_json(plain)));
  EXPECT_EQ(canonical_config_json(said).count("lr_chosen_by"), 0u);
  EXPECT_EQ(grouping_key(said, json::object()), grouping_key(plain, json::object()));
  // A record written before the setting existed reads back without it.
  json old = j;
  old.erase("lr_chosen_by");
  EXPECT_EQ(config_from_json(old).lr_chosen_by, "");
  // 200 characters, some of them two bytes, are one line of a table; 201 are refused.
  std::string longest;
  for (int i = 0; i < 100; ++i) longest += "a\xc3\xa9";  // "aé"
  check_config(parsed({{"lr", "0.01"}, {"lr-chosen-by", longest}}));
  // Refused, naming the flag: with --lr auto (the search says how), a control character, a
  // line break, more than 200 characters, text that is not UTF-8.
  for (const auto& [lr, text] : std::vector<std::pair<std::string, std::string>>{
           {"auto", "a grid"},
           {"0.01", "a\tgrid"},
           {"0.01", "a grid\nsecond line"},
           {"0.01", "a grid \x1b[31m"},
           {"0.01", longest + "a"},
           {"0.01", "\xff"}}) {
    try {
      check_config(parsed({{"lr", lr}, {"lr-chosen-by", text}}));
      ADD_FAILURE() << "--lr " << lr << " --lr-chosen-by '" << text << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find("--lr-chosen-by"), std::string::npos) << e.what();
    }
  }
}

TEST(SettingsTable, TheGroupingKeyIsTheIdentityButTheSeed) {
  const json arch = {{"hidden_size", 64}};
  const RunConfig a;
  RunConfig b = a;
  b.seed = 3;
  b.threads = 2;
  EXPECT_EQ(grouping_key(a, arch), grouping_key(b, arch));
  RunConfig c = a;
  c.eval_batches = 2;
  EXPECT_NE(grouping_key(a, arch), grouping_key(c, arch));
  EXPECT_NE(grouping_key(a, arch), grouping_key(a, json{{"hidden_size", 32}}));
  // Two seeds of --lr auto may each find another rate: still one configuration.
  RunConfig s1 = parsed({{"lr", "auto"}}), s2 = s1;
  s1.lr = 1e-3;
  s2.lr = 3e-3;
  s2.seed = 1;
  EXPECT_EQ(grouping_key(s1, arch), grouping_key(s2, arch));
  const auto flat = identity_settings(parsed({{"opt", "momentum=0.9"}}), arch);
  EXPECT_EQ(flat.at("opt.momentum"), "\"0.9\"");
  EXPECT_EQ(flat.at("arch.hidden_size"), "64");
  EXPECT_EQ(flat.count("seed"), 0u);
  EXPECT_EQ(identity_section("eval_batches"), SettingSection::kEvaluation);
  EXPECT_EQ(identity_section("arch.hidden_size"), SettingSection::kModel);
  EXPECT_EQ(identity_section("opt.momentum"), SettingSection::kOptimizer);
}

}  // namespace
}  // namespace gradscope
