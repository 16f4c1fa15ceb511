#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "gradscope/data/text.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/measure/clock.h"
#include "gradscope/measure/memory.h"
#include "gradscope/train/estimate.h"
#include "gradscope/train/phase_timer.h"
#include "gradscope/train/record_parts.h"
#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

// The tiny Llama on a committed excerpt of the State of the Union addresses: no fetch needed.
RunConfig fixture_config() {
  RunConfig c = testing::tiny_llama_config();
  c.optimizer = "adam";
  c.lr = 3e-3;
  c.batch = 4;
  c.steps = 6;
  c.warmup_steps = 1;
  c.eval_batches = 2;
  return c;
}

std::vector<double> losses(const nlohmann::json& record) {
  std::vector<double> out;
  for (const auto& s : record["steps"]) out.push_back(s["loss"].get<double>());
  return out;
}

TEST(Trainer, RecordHasTheDesignedShape) {
  RunConfig c = fixture_config();
  Trainer trainer(c);
  const nlohmann::json r = record_to_json(trainer.run());
  ASSERT_EQ(r["status"], "ok") << r.dump(2);
  EXPECT_EQ(r["schema"], "gradscope.run/2");
  EXPECT_EQ(r["run_id"].get<std::string>().size(), 16u);
  EXPECT_EQ(r["params"].get<int64_t>(), trainer.params());
  ASSERT_EQ(r["steps"].size(), 7u);  // warm-up steps train too
  for (const auto& s : r["steps"]) {
    EXPECT_EQ(s["samples"], 4);
    EXPECT_EQ(s["tokens"], 4 * 32);
    EXPECT_EQ(s["targets"], 4 * 32);
    EXPECT_GT(s["time_s"].get<double>(), 0);
    EXPECT_GT(s["grad_norm"].get<double>(), 0);
  }
  EXPECT_EQ(r["time"]["timed_steps"], 6);
  const double phases = r["time"]["data_s"].get<double>() + r["time"]["forward_s"].get<double>() +
                        r["time"]["backward_s"].get<double>() +
                        r["time"]["optimizer_s"].get<double>();
  const double total = r["time"]["total_s"].get<double>();
  EXPECT_LE(phases, total * 1.0001);
  EXPECT_GE(phases, total * 0.8);  // the phases cover the step, bar bookkeeping
  // Memory: the peak holds at least the parameters, and Adam's state is twice their size.
  const auto& m = r["memory"];
  const int64_t params_bytes = m["params_bytes"].get<int64_t>();
  EXPECT_EQ(params_bytes, trainer.params() * 4);
  EXPECT_EQ(m["optimizer_state_bytes"].get<int64_t>(), 2 * params_bytes);
  EXPECT_EQ(m["grads_bytes"].get<int64_t>(), params_bytes);
  EXPECT_GE(m["peak_bytes"].get<int64_t>(), 3 * params_bytes);
  EXPECT_GT(m["activations_peak_bytes"].get<int64_t>(), 0);
  EXPECT_GT(m["peak_rss_bytes"].get<int64_t>(), m["peak_bytes"].get<int64_t>());
  // What cannot be measured on a CPU is null, never 0; energy without RAPL is an estimate,
  // labelled as one.
  EXPECT_GT(r["energy"]["joules"].get<double>(), 0);
  EXPECT_TRUE(r["energy"]["source"] == "estimate" || r["energy"]["source"] == "rapl");
  EXPECT_TRUE(r["estimate"]["peak_bytes"].is_number());
  EXPECT_TRUE(r["memory"]["reserved_peak_bytes"].is_null());
  EXPECT_TRUE(r["flops"]["mfu"].is_null());
  EXPECT_GT(r["flops"]["per_step"].get<double>(), 0);
  EXPECT_GT(r["throughput"]["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(r["eval"].size(), 1u);
  EXPECT_GT(r["utilization"]["mean_pct"].get<double>(), 0);
}

TEST(Trainer, SameSeedSameLossesOtherSeedDifferent) {
  RunConfig c = fixture_config();
  const auto a = losses(record_to_json(Trainer(c).run()));
  const auto b = losses(record_to_json(Trainer(c).run()));
  EXPECT_EQ(a, b);  // bitwise
  c.seed = 1;
  const auto d = losses(record_to_json(Trainer(c).run()));
  EXPECT_NE(a, d);
}

TEST(Trainer, ThreadsDoNotChangeTheRunId) {
  RunConfig c = fixture_config();
  c.steps = 1;
  const auto a = record_to_json(Trainer(c).run());
  c.threads = 2;
  c.db_path = "other.db";
  const auto b = record_to_json(Trainer(c).run());
  EXPECT_EQ(a["run_id"], b["run_id"]);
}

TEST(Trainer, DivergenceStopsTheRun) {
  RunConfig c = fixture_config();
  c.optimizer = "sgd";
  c.lr = 1e12;
  c.steps = 20;
  const auto r = record_to_json(Trainer(c).run());
  EXPECT_EQ(r["status"], "diverged");
  ASSERT_TRUE(r["failure"].is_object());
  EXPECT_LT(r["steps"].size(), 21u);
  EXPECT_TRUE(r["final_loss"].is_null());
}

TEST(Trainer, MemoryCapGivesOomWithStepAndPhase) {
  RunConfig c = fixture_config();
  c.batch = 16;
  c.seq_len = 64;
  // Parameters and Adam's state fit; a forward at this batch does not.
  c.memory_cap_bytes = 3 * 1024 * 1024;
  Trainer trainer(c);
  const auto r = record_to_json(trainer.run());
  EXPECT_EQ(r["status"], "oom") << r["failure"].dump();
  EXPECT_EQ(r["failure"]["step"], 1);
  EXPECT_TRUE(r["failure"]["phase"] == "forward" || r["failure"]["phase"] == "backward")
      << r["failure"].dump();
}

TEST(Trainer, RefusesBadConfigurations) {
  auto refused = [](const std::function<void(RunConfig&)>& edit) {
    RunConfig c = fixture_config();
    try {
      edit(c);
      Trainer t(c);
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kUsage;
    }
    return false;
  };
  EXPECT_TRUE(refused([](RunConfig& c) { c.steps = 0; }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.batch = -1; }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.seq_len = -5; }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.lr = -1e-3; }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.model = "gpt5"; }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.preset = "huge"; }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.optimizer = "adamax"; }));
  EXPECT_TRUE(refused([](RunConfig& c) { find_setting("strategy")->parse(c, "magic"); }));
  EXPECT_TRUE(refused([](RunConfig& c) {  // standard has no micro-batches
    c.strategy = parse_strategy("standard");
    c.accum_steps = 4;
  }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.device = "tpu"; }));
  EXPECT_TRUE(refused([](RunConfig& c) { c.dataset = "/nonexistent/corpus.txt"; }));
  EXPECT_TRUE(refused([](RunConfig& c) { find_setting("lr-schedule")->parse(c, "sawtooth"); }));
}

TEST(Trainer, CosineScheduleWarmsUpAndDecays) {
  RunConfig c = fixture_config();
  c.lr_schedule = LrSchedule::kCosine;
  c.lr_warmup_steps = 2;
  c.warmup_steps = 0;
  c.steps = 6;
  const auto r = record_to_json(Trainer(c).run());
  std::vector<double> lr;
  for (const auto& s : r["steps"]) lr.push_back(s["lr"].get<double>());
  ASSERT_EQ(lr.size(), 6u);
  EXPECT_DOUBLE_EQ(lr[0], 1.5e-3);
  EXPECT_DOUBLE_EQ(lr[1], 3e-3);
  for (size_t i = 2; i + 1 < lr.size(); ++i) EXPECT_GT(lr[i], lr[i + 1]);
  EXPECT_NEAR(lr[5], 3e-3 * 0.5 * (1 + std::cos(M_PI * 3.0 / 4.0)), 1e-12);
}

TEST(Trainer, GradientClippingBoundsTheUpdate) {
  RunConfig c = fixture_config();
  c.optimizer = "sgd";
  c.lr = 0.1;
  c.steps = 1;
  c.warmup_steps = 0;
  c.clip_grad_norm = 1e-3;
  Trainer clipped(c);
  std::vector<torch::Tensor> before;
  for (const auto& p : clipped.model().parameters()) before.push_back(p.detach().clone());
  const auto r = record_to_json(clipped.run());
  // The recorded norm is the norm before clipping; SGD moved by lr x the clipped gradient.
  EXPECT_GT(r["steps"][0]["grad_norm"].get<double>(), 1e-3);
  std::vector<torch::Tensor> moves;
  const auto params = clipped.model().parameters();
  for (size_t i = 0; i < params.size(); ++i)
    moves.push_back((params[i].detach() - before[i]).flatten());
  EXPECT_NEAR(torch::cat(moves).norm().item<double>(), 0.1 * 1e-3, 1e-7);
}

// --no-grad-norm: the record takes no gradient norm (and the step no device sync for it),
// unless clipping needs the norm anyway; training itself is the same.
TEST(Trainer, NoGradNormLeavesTheNormOutUnlessClippingNeedsIt) {
  RunConfig c = fixture_config();
  c.steps = 3;
  const auto with_norm = record_to_json(Trainer(c).run());
  c.log_grad_norm = false;
  const auto without = record_to_json(Trainer(c).run());
  ASSERT_EQ(without["status"], "ok");
  EXPECT_EQ(without["config"]["log_grad_norm"], false);
  EXPECT_EQ(without["run_id"], with_norm["run_id"]);  // how it is measured, not what it is
  EXPECT_EQ(losses(without), losses(with_norm));
  for (const auto& s : without["steps"]) EXPECT_TRUE(s["grad_norm"].is_null());
  for (const auto& s : with_norm["steps"]) EXPECT_GT(s["grad_norm"].get<double>(), 0);
  c.clip_grad_norm = 1.0;
  const auto clipped = record_to_json(Trainer(c).run());
  for (const auto& s : clipped["steps"]) EXPECT_GT(s["grad_norm"].get<double>(), 0);
}

// The acceptance test: on the real State of the Union corpus the tiny Llama gets at least
// 10% below the corpus's unigram entropy, so it uses context.
TEST(Trainer, TinyLlamaLearnsContextOnSotu) {
  if (!testing::have_data("text/sotu")) GTEST_SKIP() << "run scripts/fetch-data.sh text";
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.optimizer = "adam";
  c.lr = 3e-3;
  c.batch = 16;
  c.steps = 300;
  c.warmup_steps = 0;
  c.eval_batches = 16;
  c.quiet = true;
  Trainer trainer(c);
  const auto r = record_to_json(trainer.run());
  ASSERT_EQ(r["status"], "ok");

  // The unigram entropy, counted here from the training split.
  auto tok = make_tokenizer("bytes", data_dir());
  TextCorpus corpus("sotu", *tok, data_dir(), 64, 0);
  std::map<int32_t, int64_t> counts;
  for (int64_t i = 0; i < corpus.train_tokens(); ++i) ++counts[corpus.tokens()[i]];
  double entropy = 0;
  const double n = static_cast<double>(corpus.train_tokens());
  for (const auto& [id, k] : counts) entropy -= k / n * std::log(k / n);
  EXPECT_NEAR(r["data"]["unigram_entropy_nats"].get<double>(), entropy, 1e-9);

  const double val = r["final_val_loss"].get<double>();
  std::printf("unigram entropy %.4f nats, validation loss %.4f (%.1f%% below)\n", entropy, val,
              100 * (1 - val / entropy));
  EXPECT_LE(val, 0.9 * entropy);
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

RunConfig toy_config(const std::string& model, const std::string& optimizer) {
  RunConfig c;
  c.model = model;
  c.optimizer = optimizer;
  c.batch = 1;
  c.warmup_steps = 0;
  c.eval_batches = 1;
  c.quiet = true;
  return c;
}

// The example: CG with its default strong-Wolfe search takes Rosenbrock's classic
// start to (1, 1); the record holds the final point and how far it is from the known minimum.
TEST(TrainerToy, CgTakesRosenbrockToItsMinimumAndRecordsThePoint) {
  RunConfig c = toy_config("rosenbrock", "cg");
  c.steps = 60;
  Trainer trainer(c);
  const auto record = record_to_json(trainer.run());
  ASSERT_EQ(record["status"], "ok") << record["failure"];
  const auto x = record["final_params"].get<std::vector<double>>();
  ASSERT_EQ(x.size(), 2u);
  EXPECT_NEAR(x[0], 1.0, 1e-6);
  EXPECT_NEAR(x[1], 1.0, 1e-6);
  EXPECT_LE(record["known_minimum"]["distance"].get<double>(), 1e-6);
  EXPECT_EQ(record["known_minimum"]["params"], nlohmann::json({1.0, 1.0}));
  EXPECT_DOUBLE_EQ(record["steps"][0]["loss"].get<double>(), 24.2);
  int64_t evaluations = 0;
  for (const auto& s : record["steps"]) evaluations += s["evaluations"].get<int64_t>();
  EXPECT_GT(evaluations, c.steps) << "a line search evaluates more than once per step";
  // One evaluation of f per step for the formula: 3 x 8 (n - 1) FLOPs.
  EXPECT_DOUBLE_EQ(record["flops"]["per_step"].get<double>(), 24.0);
}

TEST(TrainerToy, PlainOptimizersEvaluateOncePerStepAndRecordNoExtraPasses) {
  RunConfig c = toy_config("quadratic", "sgd");
  c.steps = 5;
  Trainer trainer(c);
  const auto record = record_to_json(trainer.run());
  for (const auto& s : record["steps"]) EXPECT_EQ(s["evaluations"], 1);
  EXPECT_EQ(record["final_params"].size(), 2u);
  EXPECT_FALSE(record.contains("final_params") && record["config"]["model"] == "llama");
}

TEST(TrainerToy, ALossAboveTheFactorTimesTheFirstEndsTheRunAsDiverged) {
  // Past 2 / L on the quadratic of condition 10: the loss grows ~16x a step and stays finite
  // for far longer than the run, a blow-up no NaN check sees.
  RunConfig c = toy_config("quadratic", "sgd");
  c.lr = 0.5;
  c.steps = 20;
  const auto blown = record_to_json(Trainer(c).run());
  EXPECT_EQ(blown["status"], "diverged");
  EXPECT_LE(blown["steps"].size(), 3u);
  const std::string why = blown["failure"]["message"].get<std::string>();
  EXPECT_NE(why.find("above 10 times the first step's"), std::string::npos) << why;
  // Off, it runs to the end with the loss it reached.
  c.diverge_above = 0;
  const auto off = record_to_json(Trainer(c).run());
  EXPECT_EQ(off["status"], "ok");
  EXPECT_GT(off["final_loss"].get<double>(), 1e20);
  // A run that only descends is never stopped by it.
  c = toy_config("quadratic", "sgd");
  c.steps = 20;
  EXPECT_EQ(record_to_json(Trainer(c).run())["status"], "ok");
}

TEST(TrainerToy, LanguageModelRecordsHaveNoFinalParams) {
  RunConfig c = fixture_config();
  c.steps = 1;
  const auto record = record_to_json(Trainer(c).run());
  EXPECT_FALSE(record.contains("final_params"));
  EXPECT_FALSE(record.contains("known_minimum"));
}

TEST(TrainerToy, ToyProblemsRefuseDataSettings) {
  RunConfig c = toy_config("quadratic", "adam");
  c.dataset = "sotu";
  testing::expect_usage_error([&] { Trainer t(c); });
  c.dataset.clear();
  c.seq_len = 8;
  testing::expect_usage_error([&] { Trainer t(c); });
}

// CG on the tiny Llama: the step's batch is evaluated first where the step starts (that loss
// is the step's), then along the line; each step's first evaluation is also timed as forward
// and backward. Clipping cannot apply to gradients the optimizer evaluates itself.
TEST(TrainerCg, LineSearchEvaluatesTheStepsBatchAndLowersTheLoss) {
  RunConfig c = fixture_config();
  c.optimizer = "cg";
  c.lr = 0;  // its default
  c.steps = 8;
  c.warmup_steps = 0;
  const auto record = record_to_json(Trainer(c).run());
  ASSERT_EQ(record["status"], "ok") << record["failure"];
  int64_t evaluations = 0;
  for (const auto& s : record["steps"]) {
    EXPECT_GE(s["evaluations"].get<int64_t>(), 2) << "strong Wolfe needs a trial point";
    EXPECT_TRUE(s["grad_norm"].is_number());
    evaluations += s["evaluations"].get<int64_t>();
  }
  const auto l = losses(record);
  EXPECT_LT(l.back(), l.front());
  EXPECT_GT(record["time"]["forward_s"].get<double>(), 0);
  EXPECT_EQ(record["memory"]["optimizer_state_bytes"].get<int64_t>(),
            2 * record["memory"]["params_bytes"].get<int64_t>());
  RunConfig clipped = c;
  clipped.clip_grad_norm = 1.0;
  testing::expect_usage_error([&] { Trainer t(clipped); });
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// bf16 autocast: the matrix products round to bfloat16, so the losses move off fp32's by
// bf16's precision (not bitwise equal, within a few percent), the parameters stay float32,
// and training still lowers the loss.
TEST(TrainerDtype, Bf16AutocastTrainsCloseToFp32) {
  RunConfig c = fixture_config();
  c.steps = 8;
  const auto fp32 = record_to_json(Trainer(c).run());
  c.dtype = Dtype::kBf16;
  Trainer trainer(c);
  const auto bf16 = record_to_json(trainer.run());
  ASSERT_EQ(bf16["status"], "ok") << bf16["failure"];
  EXPECT_EQ(bf16["config"]["dtype"], "bf16");
  const auto a = losses(fp32), b = losses(bf16);
  EXPECT_NE(a.front(), b.front()) << "autocast changed nothing";
  EXPECT_NEAR(b.front(), a.front(), 0.02 * a.front());
  EXPECT_LT(b.back(), b.front());
  for (const auto& p : trainer.model().parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
  EXPECT_NE(bf16["run_id"], fp32["run_id"]);
  RunConfig bad = c;
  testing::expect_usage_error([&] { find_setting("dtype")->parse(bad, "fp16"); });
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// ---------------------------------------------------------------------------------------
// Energy and utilization over the timed steps alone

// Evaluations between the timed steps (--eval-every 1, each over every validation window at
// batch 1, several times a step's work) must add nothing to the energy or the utilization.
RunConfig evaluating_config() {
  RunConfig c = fixture_config();
  c.batch = 1;
  c.steps = 4;
  c.warmup_steps = 1;
  c.eval_every = 1;
  c.eval_batches = 1000;  // capped at the validation windows there are
  return c;
}

TEST(TrainerEnergy, EstimateWithoutSamplerCoversTheTimedStepsNotEvaluation) {
  RunConfig c = evaluating_config();
  c.sample_period_s = 0;
  const RunRecord r = Trainer(c).run();
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.energy && r.energy->joules && r.utilization && r.utilization->mean_pct);
  EXPECT_EQ(r.energy->source, "estimate");
  // Both are the timed steps' CPU seconds: joules = cpu x W, utilization = cpu / (total_s x
  // threads). Had either counted the evaluations, the two would disagree by the wall time
  // the evaluations took.
  const int threads = std::max(r.env->threads, r.env->blas_threads);
  const double cpu_s = *r.utilization->mean_pct / 100.0 * *r.time->total_s * threads;
  EXPECT_NEAR(*r.energy->joules, cpu_s * c.watts_per_core, 1e-6 * *r.energy->joules)
      << "joules " << *r.energy->joules << ", utilization " << *r.utilization->mean_pct
      << "%, total_s " << *r.time->total_s << ", wall_s " << *r.time->wall_s;
}

TEST(TrainerEnergy, EachTimedStepCarriesItsEnergyAndTheyMakeTheTotal) {
  for (const double period : {0.0, 0.05}) {
    RunConfig c = evaluating_config();
    c.sample_period_s = period;
    const RunRecord r = Trainer(c).run();
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(r.energy && r.energy->joules) << period;
    double sum = 0;
    int64_t with_energy = 0;
    for (const StepEntry& s : r.steps) {
      EXPECT_EQ(s.energy_j.has_value(), !s.warmup) << "step " << s.step;
      if (s.energy_j) {
        EXPECT_GE(*s.energy_j, 0);
        sum += *s.energy_j;
        ++with_energy;
      }
    }
    EXPECT_EQ(with_energy, c.steps);
    EXPECT_NEAR(*r.energy->joules, sum, 1e-9 * sum) << period;
    EXPECT_NE(r.energy->detail->find("evaluation excluded"), std::string::npos)
        << *r.energy->detail;
    // The step entries keep their energy through the record's JSON.
    const RunRecord back = record_from_json(record_to_json(r));
    EXPECT_EQ(back.steps.back().energy_j, r.steps.back().energy_j);
    EXPECT_FALSE(back.steps.front().energy_j.has_value());
  }
}

// ---------------------------------------------------------------------------------------
// Hardware FLOPs

// Adafactor has no memory model in the estimate (its state needs the parameters' shapes), so
// the estimate is null; the FLOPs a checkpoint recomputes must be counted all the same.
TEST(TrainerFlops, CheckpointedAdafactorRunCountsTheRecomputeInHfu) {
  RunConfig c = fixture_config();
  c.optimizer = "adafactor";
  c.lr = 1e-2;
  c.strategy = parse_strategy("checkpoint");
  c.steps = 2;
  c.warmup_steps = 0;
  c.sample_period_s = 0;
  RunRecord r = Trainer(c).run();
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.flops);
  EXPECT_GT(r.flops->hardware_per_step, r.flops->per_step);
  // A peak from a probe, so that MFU and HFU are computed.
  apply_device_peak(r, {{"peak", {{"fp32", 1e12}}}, {"created_at", "test"}});
  ASSERT_TRUE(r.flops->mfu && r.flops->hfu);
  EXPECT_GT(*r.flops->hfu, *r.flops->mfu);
}

TEST(TrainerFlops, HardwareFlopsAddTheRecomputedSubLayers) {
  RunConfig c = fixture_config();
  c.recompute = Recompute::kAttention;
  c.steps = 1;
  c.warmup_steps = 0;
  c.sample_period_s = 0;
  Trainer trainer(c);
  const RunRecord r = trainer.run();
  ASSERT_TRUE(r.ok());
  const double recomputed =
      recompute_flops(trainer.config(), trainer.arch(), trainer.config().seq_len).per_step;
  EXPECT_GT(recomputed, 0);
  EXPECT_DOUBLE_EQ(r.flops->hardware_per_step, r.flops->per_step + recomputed);
}

// ---------------------------------------------------------------------------------------
// Memory at the moment of the peak

// A meter whose allocations the test makes by hand.
class HandMeter final : public MemoryMeter {
 public:
  void alloc(int64_t n) {
    current_ += n;
    peak_ = std::max(peak_, current_);
  }
  void free(int64_t n) { current_ -= n; }
  int64_t current_bytes() const override { return current_; }
  int64_t peak_bytes() const override { return peak_; }
  void reset_peak() override { peak_ = current_; }
  std::optional<int64_t> reserved_peak_bytes() const override { return std::nullopt; }

 private:
  int64_t current_ = 0, peak_ = 0;
};

// Two steps: the first's forward holds large activations (the highest forward peak); the
// second's update allocates a large temporary, with the gradients and the optimizer state
// allocated, which makes the run's peak. Parameters 100, gradients 100, state 200, batch 10.
struct TwoSteps {
  FakeClock clock;
  HandMeter meter;
  PhaseTimer timer{clock, meter, torch::Device(torch::kCPU), true};
  RunTally tally;
  TwoSteps() {
    meter.alloc(100);  // parameters
    meter.reset_peak();
    timer.begin_step();
    timer.enter(Phase::kData);
    meter.alloc(10);  // batch
    timer.enter(Phase::kForward);
    meter.alloc(700);  // activations: 810 allocated
    timer.enter(Phase::kBackward);
    meter.free(700);
    meter.alloc(100);  // gradients
    timer.enter(Phase::kOptimizer);
    meter.alloc(200);  // the state, made by the first update
    meter.free(100);   // gradients freed
    meter.free(10);    // batch
    timer.close();
    timer.begin_step();
    timer.enter(Phase::kData);
    meter.alloc(10);
    timer.enter(Phase::kForward);
    meter.alloc(100);
    timer.enter(Phase::kBackward);
    meter.free(100);
    meter.alloc(100);
    timer.enter(Phase::kOptimizer);
    meter.alloc(500);  // a temporary of the update: 910 allocated, the run's peak
    meter.free(500);
    meter.free(100);
    meter.free(10);
    timer.close();
    tally.state_bytes = 200;
  }
};

TEST(MemoryAtPeak, ComponentsAreThoseAtThePeakAndSumToIt) {
  TwoSteps run;
  const RunMemory m = memory_part(run.tally, run.timer, run.meter, 100, 0, int64_t{100}, true);
  EXPECT_EQ(m.peak_bytes, 910);
  const MemoryBreakdown& b = m.breakdown;
  const int64_t sum =
      b.params + b.grads.value_or(0) + b.optimizer_state + b.activations.value_or(0) + b.other;
  EXPECT_EQ(sum, m.peak_bytes);
  EXPECT_EQ(b.params, 100);
  EXPECT_EQ(b.grads, 100);
  EXPECT_EQ(b.optimizer_state, 200);
  EXPECT_EQ(b.activations, 0);  // none were left when the update's temporary peaked
  EXPECT_EQ(b.other, 510);      // the batch and the temporary
  // The per-phase peaks keep their own moments.
  ASSERT_TRUE(m.phase_peak_bytes && m.activations_peak_bytes);
  EXPECT_EQ(m.phase_peak_bytes->forward, 810);
  EXPECT_EQ(m.phase_peak_bytes->optimizer, 910);
  EXPECT_EQ(*m.activations_peak_bytes, 700);
}

// One step whose forward makes the peak: parameters 100, batch 10, activations 700 (810
// allocated), freed in backward, which then makes 100 bytes of gradients.
struct ForwardPeak {
  FakeClock clock;
  HandMeter meter;
  PhaseTimer timer{clock, meter, torch::Device(torch::kCPU), true};
  ForwardPeak() {
    meter.alloc(100);
    timer.begin_step();
    timer.enter(Phase::kData);
    meter.alloc(10);
    timer.enter(Phase::kForward);
    meter.alloc(700);
    timer.enter(Phase::kBackward);
    meter.free(700);
    meter.alloc(100);
    timer.close();
  }
};

TEST(MemoryAtPeak, RecordSaysWhenThePeakHappened) {
  TwoSteps run;
  const RunMemory m = memory_part(run.tally, run.timer, run.meter, 100, 0, int64_t{100}, true);
  EXPECT_EQ(m.peak_phase, "optimizer");
  EXPECT_EQ(m.peak_step, 2);
  // A peak in a forward: activations are what the forward added, no gradient exists yet.
  ForwardPeak run_f;
  const RunMemory f = memory_part(RunTally{}, run_f.timer, run_f.meter, 100, 0, int64_t{100}, true);
  EXPECT_EQ(f.peak_bytes, 810);
  EXPECT_EQ(f.peak_phase, "forward");
  EXPECT_EQ(f.breakdown.grads, 0);
  EXPECT_EQ(f.breakdown.activations, 700);
  EXPECT_EQ(f.breakdown.other, 10);
}

TEST(MemoryAtPeak, LogitsAreTheLossHeadsPartOfThePass) {
  // A forward peak of 700 bytes above its start, of which the head kept 300 (logits_bytes).
  ForwardPeak run;
  const PhaseTimer& timer = run.timer;
  const HandMeter& meter = run.meter;
  RunTally tally;
  tally.logits_bytes = 300;
  const RunMemory m = memory_part(tally, timer, meter, 100, 0, std::nullopt, true);
  EXPECT_EQ(m.logits_bytes, 300);
  EXPECT_EQ(m.breakdown.logits, 300);
  // A part of activations, which keep their meaning: the parts without it sum to the peak.
  EXPECT_EQ(m.breakdown.activations, 700);
  EXPECT_EQ(m.breakdown.params + m.breakdown.activations.value_or(0) + m.breakdown.other,
            m.peak_bytes);
  // Never more than the activations at the peak.
  tally.logits_bytes = 5000;
  const RunMemory capped = memory_part(tally, timer, meter, 100, 0, std::nullopt, true);
  EXPECT_EQ(capped.breakdown.logits, 700);
  EXPECT_EQ(capped.breakdown.activations, 700);
  // Without a language-model head the part is unmeasured (null), not 0.
  EXPECT_FALSE(memory_part(RunTally{}, timer, meter, 100, 0, std::nullopt, true).breakdown.logits);
}

TEST(MemoryAtPeak, RealRunBreakdownSumsToThePeak) {
  RunConfig c = fixture_config();
  c.steps = 2;
  const RunRecord r = Trainer(c).run();
  ASSERT_TRUE(r.ok() && r.memory);
  const MemoryBreakdown& b = r.memory->breakdown;
  EXPECT_EQ(
      b.params + b.grads.value_or(0) + b.optimizer_state + b.activations.value_or(0) + b.other,
      r.memory->peak_bytes);
  EXPECT_LE(b.logits.value_or(0), b.activations.value_or(0));
  EXPECT_TRUE(r.memory->peak_phase.has_value());
}

}  // namespace
}  // namespace gradscope
