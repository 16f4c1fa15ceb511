// LoRA as a user runs it: the record separates what trains from what is frozen, the merged
// save reloads as a plain model with the run's validation loss, the adapters save apart in
// PEFT's layout and read back (--init-adapters) to the merged model's loss, and bad settings
// are exit 2.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace gradscope {
namespace lora_cli_test {

using testing::contains;
using testing::run_gradscope;
using testing::slurp;
using testing::TempDir;

const std::string kText = std::string(GRADSCOPE_FIXTURES) + "/text/sotu-excerpt.txt";
const std::string kTiny = "--model llama --preset tiny --seq 32 --batch 4 --dataset " + kText;
const std::string kRun = "run " + kTiny +
                         " --steps 3 --warmup-steps 0 --eval-batches 2 --quiet --no-db"
                         " --sample-period 0 --lora-targets v,q,down --lora-rank 4";

TEST(LoraCli, TheRecordSeparatesTrainableAndFrozenAndTheMergedSaveReloads) {
  TempDir tmp;
  const auto run =
      run_gradscope(kRun + " --json " + tmp.file("run.json") + " --save-weights " + tmp.file("w"));
  ASSERT_EQ(run.code, 0) << run.err;
  const auto r = nlohmann::json::parse(slurp(tmp.file("run.json")));
  EXPECT_EQ(r["config"]["lora_targets"], nlohmann::json::array({"q", "v", "down"}));
  EXPECT_EQ(r["config"]["lora_rank"], 4);
  const int64_t params = r["params"], trainable = r["trainable_params"];
  EXPECT_GT(trainable, 0);
  EXPECT_LT(trainable * 20, params);
  const auto& m = r["memory"];
  EXPECT_EQ(m["params_bytes"].get<int64_t>() - m["frozen_params_bytes"].get<int64_t>(),
            4 * trainable);
  EXPECT_EQ(m["grads_bytes"].get<int64_t>(), 4 * trainable);
  EXPECT_EQ(m["optimizer_state_bytes"].get<int64_t>(), 2 * 4 * trainable);  // Adam: m and v
  EXPECT_EQ(m["breakdown"]["frozen_params"], m["frozen_params_bytes"]);
  // The merged weights evaluate to the run's own validation loss in a run without LoRA.
  const auto eval = run_gradscope("eval " + kTiny + " --eval-batches 2 --init-from " +
                                  tmp.file("w") + " --json " + tmp.file("eval.json"));
  ASSERT_EQ(eval.code, 0) << eval.err;
  const auto out = nlohmann::json::parse(slurp(tmp.file("eval.json")));
  EXPECT_NEAR(out["loss_nats"].get<double>(), r["final_val_loss"].get<double>(), 1e-5);
}

TEST(LoraCli, AdaptersSaveApartInPeftsLayout) {
  TempDir tmp;
  const auto run = run_gradscope(kRun + " --json " + tmp.file("r.json") + " --save-weights " +
                                 tmp.file("a") + " --save-adapters");
  ASSERT_EQ(run.code, 0) << run.err;
  const auto config = nlohmann::json::parse(slurp(tmp.file("a/adapter_config.json")));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_TRUE(contains(config["target_modules"].dump(), "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(contains(config["target_modules"].dump(), "model.layers.1.mlp.down_proj"));
  EXPECT_TRUE(contains(slurp(tmp.file("a/adapter_model.safetensors")),
                       "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"));
  // An adapters folder is not written over by a weights save, and the other way round.
  const auto merged =
      run_gradscope(kRun + " --json " + tmp.file("m.json") + " --save-weights " + tmp.file("a"));
  EXPECT_EQ(merged.code, 2) << merged.err;
}

TEST(LoraCli, BadSettingsAreExitTwo) {
  TempDir tmp;
  const std::string json = " --json " + tmp.file("r.json");
  for (const std::string& extra :
       {std::string(" --lora-targets q,x"), std::string(" --lora-targets q,q"),
        std::string(" --lora-targets q --lora-rank 0"),
        std::string(" --lora-targets q --lora-alpha -1"),
        std::string(" --lora-targets q --lora-dropout 1")}) {
    const auto r = run_gradscope("run " + kTiny + " --steps 1 --no-db --quiet" + json + extra);
    EXPECT_EQ(r.code, 2) << extra << ": " << r.err;
  }
  const auto rank_alone = run_gradscope("run " + kTiny + " --steps 1 --no-db --lora-rank 4" + json);
  EXPECT_EQ(rank_alone.code, 2);
  EXPECT_TRUE(contains(rank_alone.err, "--lora-targets")) << rank_alone.err;
  const auto apart = run_gradscope("run " + kTiny + " --steps 1 --no-db --save-adapters" + json);
  EXPECT_EQ(apart.code, 2);
  const auto vit =
      run_gradscope("run --model vit --preset tiny --steps 1 --no-db --lora-targets gate" + json);
  EXPECT_EQ(vit.code, 2);
  EXPECT_TRUE(contains(vit.err, "no projection")) << vit.err;
}

// The loss `gradscope outputs` prints ("... loss 5.12345678 over ...").
double outputs_loss(const std::string& out) {
  const size_t at = out.find(", loss ");
  return at == std::string::npos ? -1 : std::stod(out.substr(at + 7));
}

TEST(LoraCli, SavedAdaptersReadBackGiveTheMergedModelsLoss) {
  TempDir tmp;
  const auto merged = run_gradscope(kRun + " --json " + tmp.file("m.json") + " --save-weights " +
                                    tmp.file("m"));
  ASSERT_EQ(merged.code, 0) << merged.err;
  const auto apart = run_gradscope(kRun + " --json " + tmp.file("a.json") + " --save-weights " +
                                   tmp.file("a") + " --save-adapters");
  ASSERT_EQ(apart.code, 0) << apart.err;
  const std::string outputs = "outputs " + kTiny + " --attention math";
  const auto from_merged =
      run_gradscope(outputs + " --init-from " + tmp.file("m") + " --out " + tmp.file("m.st"));
  ASSERT_EQ(from_merged.code, 0) << from_merged.err;
  const std::string lora = " --lora-targets v,q,down --lora-rank 4";
  const auto from_adapters = run_gradscope(outputs + lora + " --init-adapters " + tmp.file("a") +
                                           " --out " + tmp.file("a.st"));
  ASSERT_EQ(from_adapters.code, 0) << from_adapters.err;
  const auto base = run_gradscope(outputs + " --out " + tmp.file("b.st"));
  ASSERT_EQ(base.code, 0) << base.err;
  const double m = outputs_loss(from_merged.out), a = outputs_loss(from_adapters.out);
  ASSERT_GT(m, 0) << from_merged.out;
  EXPECT_NEAR(a, m, 1e-5 * m) << from_adapters.out;
  EXPECT_GT(std::abs(outputs_loss(base.out) - m), 1e-4 * m);  // the adapters changed it
  // What the folder cannot be read into is exit 2, naming what differs.
  const auto rank = run_gradscope(outputs + " --lora-targets v,q,down --lora-rank 8"
                                  " --init-adapters " + tmp.file("a") + " --out " +
                                  tmp.file("x.st"));
  EXPECT_EQ(rank.code, 2);
  EXPECT_TRUE(contains(rank.err, "--lora-rank 4")) << rank.err;
  const auto fewer = run_gradscope(outputs + " --lora-targets v,q --lora-rank 4 --init-adapters " +
                                   tmp.file("a") + " --out " + tmp.file("x.st"));
  EXPECT_EQ(fewer.code, 2);
  EXPECT_TRUE(contains(fewer.err, "down_proj")) << fewer.err;
  for (const std::string& bad :
       {" --init-adapters " + tmp.file("a"), lora + " --init-adapters " + tmp.file("none"),
        lora + " --init-adapters " + tmp.file("m")}) {
    const auto r = run_gradscope(outputs + bad + " --out " + tmp.file("x.st"));
    EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.file("x.st")));
}

TEST(LoraCli, AdapterConfigsItCannotComputeAreExitTwoNamingTheKey) {
  namespace fs = std::filesystem;
  TempDir tmp;
  const auto apart = run_gradscope(kRun + " --json " + tmp.file("a.json") + " --save-weights " +
                                   tmp.file("a") + " --save-adapters");
  ASSERT_EQ(apart.code, 0) << apart.err;
  const auto config = nlohmann::json::parse(slurp(tmp.file("a/adapter_config.json")));
  const std::string outputs =
      "outputs " + kTiny + " --lora-targets v,q,down --lora-rank 4 --out " + tmp.file("x.st");
  const std::vector<std::pair<std::string, nlohmann::json>> changes = {
      {"use_dora", true},
      {"alora_invocation_tokens", nlohmann::json::array({1, 2})},
      {"init_lora_weights", "pissa"},
      {"bias", "all"},
      {"rank_pattern", {{"q_proj|v_proj", 8}}},
      {"peft_type", "IA3"}};
  for (const auto& [key, value] : changes) {
    const std::string dir = tmp.file("changed");
    fs::remove_all(dir);
    fs::copy(tmp.file("a"), dir);
    nlohmann::json changed = config;
    changed[key] = value;
    std::ofstream(dir + "/adapter_config.json") << changed.dump();
    const auto r = run_gradscope(outputs + " --init-adapters " + dir);
    EXPECT_EQ(r.code, 2) << key << ": " << r.err;
    EXPECT_TRUE(contains(r.err, key == "peft_type" ? "LORA" : key)) << key << ": " << r.err;
  }
  // Keys that say where the adapters came from change nothing.
  const std::string dir = tmp.file("informed");
  fs::copy(tmp.file("a"), dir);
  nlohmann::json informed = config;
  informed["revision"] = "main";
  informed["peft_version"] = "0.21.2";
  std::ofstream(dir + "/adapter_config.json") << informed.dump();
  EXPECT_EQ(run_gradscope(outputs + " --init-adapters " + dir).code, 0);
  // A run does not save over the adapters it started from.
  const auto over = run_gradscope(kRun + " --json " + tmp.file("o.json") + " --init-adapters " +
                                  tmp.file("a") + " --save-weights " + tmp.file("a") +
                                  " --save-adapters");
  EXPECT_EQ(over.code, 2) << over.err;
  EXPECT_TRUE(contains(over.err, "--init-adapters folder")) << over.err;
}

TEST(LoraCli, OutputsRefusesWhatItCannotWrite) {
  TempDir tmp;
  const std::string outputs = "outputs " + kTiny;
  const auto toy = run_gradscope("outputs --model quadratic --out " + tmp.file("t.st"));
  EXPECT_EQ(toy.code, 2) << toy.err;
  {
    std::ofstream(tmp.file("mine.txt")) << "a file of the user's";
  }
  const auto theirs = run_gradscope(outputs + " --out " + tmp.file("mine.txt"));
  EXPECT_EQ(theirs.code, 2) << theirs.err;
  EXPECT_EQ(slurp(tmp.file("mine.txt")), "a file of the user's");
  // Its own earlier output is written over.
  ASSERT_EQ(run_gradscope(outputs + " --out " + tmp.file("o.st")).code, 0);
  EXPECT_EQ(run_gradscope(outputs + " --batch 2 --out " + tmp.file("o.st")).code, 0);
}

}  // namespace lora_cli_test
}  // namespace gradscope
