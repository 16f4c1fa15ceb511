// LoRA as a user runs it: the record separates what trains from what is frozen, the merged
// save reloads as a plain model with the run's validation loss, the adapters save apart in
// PEFT's layout, and bad settings are exit 2.
#include <gtest/gtest.h>

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

}  // namespace lora_cli_test
}  // namespace gradscope
