#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "gradscope/models/llama.h"
#include "gradscope/strategy/checkpoint.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/train/trainer.h"
#include "strategy/tiny_llama.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::text_batch;
using testing::tiny_llama;

// Rows [first, first + count) of a batch.
Batch rows(const Batch& batch, int64_t first, int64_t count) {
  Batch out;
  out.input_ids = batch.input_ids.narrow(0, first, count);
  out.targets = batch.targets.narrow(0, first, count);
  out.samples = count;
  out.tokens = count * batch.input_ids.size(1);
  out.targets_count = out.targets.ne(kIgnoreIndex).sum().item<int64_t>();
  return out;
}

// Micro-batch i of k equal parts of `batch`.
MicroBatchSource split(const Batch& batch, int64_t k) {
  const int64_t each = batch.samples / k;
  return [batch, each](int64_t i) { return rows(batch, i * each, each); };
}

struct PhaseLog : PhaseObserver {
  std::vector<Phase> phases;
  void enter(Phase phase) override { phases.push_back(phase); }
};

// The parameters' gradients (zeros where none), cloned; the parameters' .grad is freed.
std::vector<torch::Tensor> take_grads(Model& model) {
  std::vector<torch::Tensor> out;
  for (auto& p : model.parameters()) {
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    p.mutable_grad() = torch::Tensor();
  }
  return out;
}

// The strategy `name` (a --strategy shorthand) over k micro-batches per step.
std::unique_ptr<Strategy> make_strategy(const std::string& name, RunConfig config = {},
                                        int64_t k = 1) {
  find_setting("strategy")->parse(config, name);
  config.accum_steps = k;
  return std::make_unique<Strategy>(config.step_plan());
}

// One step of `strategy` on a fresh tiny Llama (same weights every time), with the dropout
// generator seeded identically before it. Returns the gradients.
std::vector<torch::Tensor> step_grads(const Strategy& strategy, Model& model,
                                      const MicroBatchSource& next, StepOutput* output = nullptr) {
  PhaseLog log;
  torch::manual_seed(1234);
  StepOutput out = strategy.compute_gradients(model, next, log);
  if (output) *output = out;
  return take_grads(model);
}

std::vector<torch::Tensor> strategy_grads(const std::string& name, double dropout, int64_t k,
                                          const Batch& batch, StepOutput* output = nullptr,
                                          const RunConfig& config = {}) {
  auto model = tiny_llama(dropout);
  auto strategy = make_strategy(name, config, k);
  strategy->attach(*model);
  return step_grads(*strategy, *model, split(batch, k), output);
}

// ||a - b|| / ||b||, per tensor; the largest over the lists.
double max_relative_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double ref = b[i].norm().item<double>();
    const double diff = (a[i] - b[i]).norm().item<double>();
    worst = std::max(worst, ref > 0 ? diff / ref : diff);
  }
  return worst;
}

bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

bool all_nonzero(const std::vector<torch::Tensor>& grads) {
  for (const auto& g : grads)
    if (g.abs().sum().item<double>() == 0) return false;
  return true;
}

// ---------------------------------------------------------------------------------------
// Registry

TEST(StrategyRegistry, ListsTheStrategiesAndWhichAccumulate) {
  EXPECT_FALSE(parse_strategy("standard")->accumulation);
  EXPECT_FALSE(parse_strategy("checkpoint")->accumulation);
  EXPECT_TRUE(parse_strategy("accumulation")->accumulation);
  EXPECT_TRUE(parse_strategy("checkpoint+accumulation")->accumulation);
  for (const auto& s : strategy_shorthands()) {
    EXPECT_FALSE(s.description.empty()) << s.name;
    ASSERT_TRUE(parse_strategy(s.name).has_value()) << s.name;
    EXPECT_EQ(strategy_name(*parse_strategy(s.name)), s.name);
  }
}

TEST(StrategyRegistry, CheckpointSettingsAreChecked) {
  auto usage_error = [](const std::string& name, const std::function<void(RunConfig&)>& edit) {
    RunConfig c;
    try {
      edit(c);
      make_strategy(name, c);
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kUsage;
    }
    return false;
  };
  const auto policy = [](const char* name) {
    return [name](RunConfig& c) { find_setting("checkpoint-policy")->parse(c, name); };
  };
  for (const std::string name : {"checkpoint", "checkpoint+accumulation"}) {
    EXPECT_TRUE(usage_error(name, [](RunConfig& c) { c.checkpoint_every = 0; })) << name;
    EXPECT_FALSE(usage_error(name, policy("attention")));
    EXPECT_FALSE(usage_error(name, policy("mlp")));
    EXPECT_TRUE(usage_error(name, policy("half")));
    EXPECT_FALSE(usage_error(name, [](RunConfig& c) { c.checkpoint_every = 3; }));
  }
}

// (ix) `checkpoint` has no micro-batches: the trainer's check refuses --accum-steps > 1
// before anything is loaded.
TEST(StrategyRegistry, CheckpointRefusesAccumSteps) {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.strategy = parse_strategy("checkpoint");
  c.accum_steps = 2;
  c.dataset = testing::fixture("text/sotu-excerpt.txt");
  try {
    Trainer trainer(c);
    FAIL() << "checkpoint with --accum-steps 2 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("accum-steps"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_strategy("checkpoint", {}, 2), Error);
}

// ---------------------------------------------------------------------------------------
// Checkpointing

// (i) Bitwise equal to plain backward on the CPU in fp32 with dropout on, because the
// recompute draws the same dropout masks.
TEST(Checkpoint, BitwiseEqualToStandardWithDropout) {
  const Batch batch = text_batch(4, 32, 11);
  const auto standard = strategy_grads("standard", 0.1, 1, batch);
  const auto checkpointed = strategy_grads("checkpoint", 0.1, 1, batch);
  EXPECT_TRUE(all_nonzero(checkpointed));
  EXPECT_TRUE(bitwise_equal(checkpointed, standard))
      << "largest relative difference " << max_relative_diff(checkpointed, standard);
}

// (ii) The same comparison fails when the generator state is not restored: the recompute
// then draws other masks. This is what the restore is for.
TEST(Checkpoint, DiffersWithoutRngRestore) {
  const Batch batch = text_batch(4, 32, 11);
  const auto standard = strategy_grads("standard", 0.1, 1, batch);

  auto model = tiny_llama(0.1);
  CheckpointOptions options;
  options.restore_rng = false;
  auto runner = install_checkpointing(*model, options);
  auto strategy = make_strategy("standard");
  const auto unrestored = step_grads(*strategy, *model, split(batch, 1));
  EXPECT_EQ(runner->counters().recomputed, 2);
  EXPECT_FALSE(bitwise_equal(unrestored, standard));
  EXPECT_GT(max_relative_diff(unrestored, standard), 1e-3);
}

// A block that runs as one function (no sub-layers).
class TanhBlockForPolicy : public Block {
 public:
  torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx) override {
    return torch::tanh(x);
  }
};

// Selective checkpointing recomputes one residual branch of each block: bitwise equal
// gradients with dropout on, one recompute per block, and without the generator restore
// the comparison fails (the branch's dropout masks change).
TEST(Checkpoint, SelectivePoliciesAreBitwiseAndRecomputeOneBranch) {
  const Batch batch = text_batch(4, 32, 11);
  const auto standard = strategy_grads("standard", 0.1, 1, batch);
  for (const auto policy : {Recompute::kAttention, Recompute::kMlp}) {
    for (const bool restore : {true, false}) {
      auto model = tiny_llama(0.1);
      CheckpointOptions options;
      options.policy = policy;
      options.restore_rng = restore;
      auto runner = install_checkpointing(*model, options);
      auto strategy = make_strategy("standard");
      const auto grads = step_grads(*strategy, *model, split(batch, 1));
      EXPECT_EQ(runner->counters().checkpointed, 2);  // one branch in each of 2 blocks
      EXPECT_EQ(runner->counters().recomputed, 2);
      EXPECT_TRUE(all_nonzero(grads));
      if (restore)
        EXPECT_TRUE(bitwise_equal(grads, standard))
            << "largest relative difference " << max_relative_diff(grads, standard);
      else
        EXPECT_GT(max_relative_diff(grads, standard), 1e-3);
    }
  }
}

// Blocks that run as one function cannot have a branch checkpointed: refused as usage.
TEST(Checkpoint, SelectivePolicyNeedsSubLayers) {
  std::vector<std::shared_ptr<Block>> blocks = {std::make_shared<TanhBlockForPolicy>()};
  CheckpointOptions options;
  options.policy = Recompute::kMlp;
  testing::expect_usage_error([&] { CheckpointRunner runner(blocks, options); });
  options.policy = Recompute::kFull;
  CheckpointRunner full(blocks, options);  // whole blocks need nothing more
}

// The rest of the run sees the random stream it would see without checkpointing.
TEST(Checkpoint, LeavesTheGeneratorWhereStandardDoes) {
  const Batch batch = text_batch(2, 16, 3);
  auto after_step = [&](const std::string& name) {
    auto model = tiny_llama(0.1);
    auto strategy = make_strategy(name);
    strategy->attach(*model);
    step_grads(*strategy, *model, split(batch, 1));
    return torch::rand({8});
  };
  EXPECT_TRUE(torch::equal(after_step("checkpoint"), after_step("standard")));
}

// A tiny float64 block: y = tanh(x W^T + b) * ctx.rope_cos + x.
class TanhBlock : public Block {
 public:
  explicit TanhBlock(int64_t c) {
    linear = register_module("linear", torch::nn::Linear(c, c));
    to(torch::kFloat64);
  }
  torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx) override {
    ++calls;
    return torch::tanh(linear(x)) * ctx.rope_cos + x;
  }
  torch::nn::Linear linear{nullptr};
  int calls = 0;
};

// (iii) The checkpoint function's gradients (input and parameters) against central
// differences of the plain forward.
TEST(Checkpoint, FiniteDifferencesOnAFloat64Block) {
  torch::manual_seed(5);
  const int64_t b = 2, t = 3, c = 4;
  auto block = std::make_shared<TanhBlock>(c);
  BlockContext ctx;
  ctx.rope_cos = torch::rand({t, c}, torch::kFloat64) + 0.5;  // (T, C)
  const auto x0 = torch::randn({b, t, c}, torch::kFloat64);
  const auto w = torch::randn({b, t, c}, torch::kFloat64);  // L = sum(y * w)

  auto x = x0.clone().requires_grad_(true);
  torch::Tensor loss = (checkpoint_block(*block, x, ctx) * w).sum();
  EXPECT_EQ(block->calls, 1);
  loss.backward();
  EXPECT_EQ(block->calls, 2);  // recomputed once in backward

  auto plain_loss = [&](const torch::Tensor& input) {
    torch::NoGradGuard no_grad;
    return (block->forward(input, ctx) * w).sum().item<double>();
  };
  const double eps = 1e-6;
  auto central = [&](torch::Tensor target, const torch::Tensor& input) {
    torch::NoGradGuard no_grad;
    auto flat = target.view({-1});
    auto grad = torch::zeros_like(flat);
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double keep = flat[i].item<double>();
      flat[i] = keep + eps;
      const double up = plain_loss(input);
      flat[i] = keep - eps;
      const double down = plain_loss(input);
      flat[i] = keep;
      grad[i] = (up - down) / (2 * eps);
    }
    return grad.view(target.sizes());
  };
  auto input = x0.clone();
  const auto fd_x = central(input, input);
  const auto fd_weight = central(block->linear->weight, x0);
  const auto fd_bias = central(block->linear->bias, x0);
  EXPECT_LT((x.grad() - fd_x).abs().max().item<double>(), 1e-7);
  EXPECT_LT((block->linear->weight.grad() - fd_weight).abs().max().item<double>(), 1e-7);
  EXPECT_LT((block->linear->bias.grad() - fd_bias).abs().max().item<double>(), 1e-7);
  EXPECT_GT(fd_weight.abs().max().item<double>(), 1e-3);  // not trivially zero
}

// The pitfall: an input that needs no gradient must not make autograd skip the block, or
// its parameters would silently get none.
TEST(Checkpoint, ParametersGetGradientsWhenTheInputNeedsNone) {
  torch::manual_seed(6);
  auto block = std::make_shared<TanhBlock>(4);
  BlockContext ctx;
  ctx.rope_cos = torch::ones({3, 4}, torch::kFloat64);
  const auto x = torch::randn({2, 3, 4}, torch::kFloat64);  // requires no grad
  auto y = checkpoint_block(*block, x, ctx);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_TRUE(block->linear->weight.grad().defined());
  const auto checkpointed = block->linear->weight.grad().clone();
  block->linear->weight.mutable_grad() = torch::Tensor();
  block->linear->bias.mutable_grad() = torch::Tensor();
  block->forward(x, ctx).sum().backward();
  EXPECT_TRUE(torch::allclose(checkpointed, block->linear->weight.grad(), 0, 1e-12));
  EXPECT_FALSE(x.grad().defined());
}

// Under NoGradGuard (evaluation) blocks run as usual and nothing is recomputed.
TEST(Checkpoint, EvaluationRunsBlocksPlainly) {
  auto model = tiny_llama(0);
  model->eval();
  const Batch batch = text_batch(2, 16, 4);
  torch::Tensor reference;
  {
    torch::NoGradGuard no_grad;
    reference = model->loss(batch).loss_sum;
  }
  auto runner = install_checkpointing(*model, CheckpointOptions{});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model->loss(batch).loss_sum, reference));
  EXPECT_EQ(runner->counters().checkpointed, 0);
  EXPECT_EQ(runner->counters().plain, 2);
}

// (viii) --checkpoint-every 2 wraps blocks 0 and 2 of 4, and only those are recomputed.
TEST(Checkpoint, EveryKWrapsEveryKthBlock) {
  const Batch batch = text_batch(2, 16, 8);
  auto plain_model = tiny_llama(0, 4);
  auto standard = make_strategy("standard");
  const auto reference = step_grads(*standard, *plain_model, split(batch, 1));

  auto model = tiny_llama(0, 4);
  CheckpointOptions options;
  options.every = 2;
  auto runner = install_checkpointing(*model, options);
  EXPECT_TRUE(runner->wraps(0));
  EXPECT_FALSE(runner->wraps(1));
  EXPECT_TRUE(runner->wraps(2));
  EXPECT_FALSE(runner->wraps(3));
  const auto grads = step_grads(*standard, *model, split(batch, 1));
  EXPECT_EQ(runner->counters().checkpointed, 2);
  EXPECT_EQ(runner->counters().plain, 2);
  EXPECT_EQ(runner->counters().recomputed, 2);
  EXPECT_TRUE(bitwise_equal(grads, reference));

  runner->reset_counters();
  options.every = 3;  // blocks 0 and 3
  auto runner3 = install_checkpointing(*model, options);
  step_grads(*standard, *model, split(batch, 1));
  EXPECT_EQ(runner3->counters().checkpointed, 2);
  EXPECT_EQ(runner3->counters().plain, 2);
  EXPECT_EQ(runner->counters().checkpointed, 0);  // the old runner is no longer installed
}

// Under autocast the checkpointed forward runs without a graph inside the scope its
// recompute runs in, so a low-precision weight copy cached there (without autograd history)
// could be reused by the recompute and the weight would get no gradient. The forward runs
// with autocast's cache off; the recompute, and everything after, with it as it was.
TEST(Checkpoint, ForwardWithoutAGraphBypassesTheAutocastCache) {
  std::vector<std::pair<bool, bool>> seen;  // (grad mode, cache enabled) at each call
  const SubLayerFn fn = [&seen](const torch::Tensor& in) {
    seen.emplace_back(torch::GradMode::is_enabled(), at::autocast::is_autocast_cache_enabled());
    return in * 2;
  };
  ASSERT_TRUE(at::autocast::is_autocast_cache_enabled());
  const torch::Tensor x = torch::ones({2, 3}, torch::requires_grad());
  const torch::Tensor y = checkpoint_function(fn, x);
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  y.sum().backward();
  const std::vector<std::pair<bool, bool>> expected = {{false, false}, {true, true}};
  EXPECT_EQ(seen, expected);
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({2, 3}, 2.0)));
}

// ---------------------------------------------------------------------------------------
// Accumulation

// (iv) k = 4 micro-batches give the gradient of the whole batch (dropout off: micro-batches
// draw their masks in another order by construction).
TEST(Accumulation, EqualsTheFullBatch) {
  const Batch batch = text_batch(8, 32, 21);
  StepOutput full_out, acc_out;
  const auto full = strategy_grads("standard", 0, 1, batch, &full_out);
  const auto accumulated = strategy_grads("accumulation", 0, 4, batch, &acc_out);
  EXPECT_TRUE(all_nonzero(accumulated));
  EXPECT_LE(max_relative_diff(accumulated, full), 1e-5);
  EXPECT_EQ(acc_out.target_count, full_out.target_count);
  EXPECT_EQ(acc_out.samples, 8);
  EXPECT_EQ(acc_out.tokens, 8 * 32);
}

// (v) Exact with padding: the micro-batches hold very different numbers of targets, and the
// step is normalized by the count of the whole batch. Normalizing each micro-batch by its
// own count and averaging over k (a mean of means) gives another gradient.
TEST(Accumulation, ExactWithPaddedMicroBatchesOfDifferentCounts) {
  const Batch batch = text_batch(8, 32, 22, {32, 32, 9, 4, 20, 32, 3, 12});
  const int64_t k = 4;
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < k; ++i) counts.push_back(rows(batch, 2 * i, 2).targets_count);
  ASSERT_EQ(counts, (std::vector<int64_t>{64, 13, 52, 15}));

  const auto full = strategy_grads("standard", 0, 1, batch);
  const auto accumulated = strategy_grads("accumulation", 0, k, batch);
  EXPECT_LE(max_relative_diff(accumulated, full), 1e-5);

  // Mean of means: each micro-batch's own mean, divided by k.
  auto model = tiny_llama(0);
  for (int64_t i = 0; i < k; ++i) {
    LossOutput out = model->loss(rows(batch, 2 * i, 2));
    (out.loss_sum / static_cast<double>(out.target_count) / static_cast<double>(k)).backward();
  }
  const auto mean_of_means = take_grads(*model);
  EXPECT_GT(max_relative_diff(mean_of_means, full), 1e-2);
}

// (vi) Checkpointing and accumulation together equal the full batch.
TEST(Accumulation, WithCheckpointEqualsTheFullBatch) {
  const Batch batch = text_batch(8, 32, 23, {32, 5, 32, 17, 32, 32, 1, 30});
  const auto full = strategy_grads("standard", 0, 1, batch);
  const auto both = strategy_grads("checkpoint+accumulation", 0, 4, batch);
  EXPECT_TRUE(all_nonzero(both));
  EXPECT_LE(max_relative_diff(both, full), 1e-5);
}

// (vii) The logged loss is the mean per target over the whole step, not divided by k.
TEST(Accumulation, LoggedLossIsTheFullBatchMean) {
  const Batch batch = text_batch(8, 32, 24, {32, 7, 32, 32, 19, 32, 2, 32});
  StepOutput full_out, acc_out;
  strategy_grads("standard", 0, 1, batch, &full_out);
  strategy_grads("accumulation", 0, 4, batch, &acc_out);
  ASSERT_EQ(acc_out.target_count, full_out.target_count);
  const double full_loss = full_out.loss_sum.item<double>() / full_out.target_count;
  const double acc_loss = acc_out.loss_sum.item<double>() / acc_out.target_count;
  EXPECT_NEAR(acc_loss, full_loss, 1e-6 * full_loss);
  EXPECT_GT(acc_loss, 4.0);  // about ln(320) = 5.8 at initialisation; a /k would give ~1.4
}

// Phases are announced per micro-batch: all data first (the step's target count is needed
// before any backward), then forward and backward of each.
TEST(Accumulation, AnnouncesPhasesPerMicroBatch) {
  auto model = tiny_llama(0);
  auto strategy = make_strategy("accumulation", {}, 3);
  PhaseLog log;
  strategy->compute_gradients(*model, split(text_batch(6, 8, 2), 3), log);
  using P = Phase;
  // Data again before each later micro-batch: its move to the device.
  const std::vector<Phase> expected = {P::kData,    P::kData,     P::kData,
                                       P::kForward, P::kBackward, P::kData,
                                       P::kForward, P::kBackward, P::kData,
                                       P::kForward, P::kBackward};
  EXPECT_EQ(log.phases, expected);
}

// Counts, at each forward, the micro-batches whose device copies are alive: a device copy is a
// fresh tensor made by the source's to_device, watched through a weak reference, so it counts
// until the last owner (the strategy, the autograd graph) lets it go.
struct DeviceResidency : PhaseObserver {
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> moved;
  std::vector<int64_t> resident_at_forward;
  std::vector<int64_t> moved_at_forward;
  int64_t fetched = 0;

  void enter(Phase phase) override {
    if (phase != Phase::kForward) return;
    int64_t alive = 0;
    for (const auto& w : moved) alive += w.expired() ? 0 : 1;
    resident_at_forward.push_back(alive);
    moved_at_forward.push_back(static_cast<int64_t>(moved.size()));
  }

  MicroBatchSource source(const Batch& batch, int64_t k) {
    const int64_t each = batch.samples / k;
    return MicroBatchSource(
        [this, batch, each](int64_t i) {
          ++fetched;
          return rows(batch, i * each, each);
        },
        [this](const Batch& host) {
          Batch device = host;
          device.input_ids = host.input_ids.clone();
          device.targets = host.targets.clone();
          moved.emplace_back(device.input_ids.getIntrusivePtr());
          return device;
        });
  }
};

// Accumulation keeps the step's micro-batches on the host (their target counts are all known
// before the first backward) and moves each to the device just before its forward, dropping
// it after its backward: at every forward exactly one micro-batch is on the device, and the
// later ones have not been moved yet. Moving all k first would hold k there at the first.
TEST(Accumulation, MovesOneMicroBatchToTheDeviceAtATime) {
  const int64_t k = 4;
  const Batch batch = text_batch(8, 16, 25, {16, 3, 16, 9, 16, 16, 5, 16});
  auto model = tiny_llama(0);
  auto strategy = make_strategy("accumulation", {}, k);
  DeviceResidency residency;
  const StepOutput out = strategy->compute_gradients(*model, residency.source(batch, k), residency);
  EXPECT_EQ(residency.fetched, k);
  EXPECT_EQ(residency.resident_at_forward, std::vector<int64_t>(k, 1));
  EXPECT_EQ(residency.moved_at_forward, (std::vector<int64_t>{1, 2, 3, 4}));
  for (const auto& w : residency.moved) EXPECT_TRUE(w.expired());  // none left behind
  // Still the whole step's target count, and still the full batch's gradient.
  EXPECT_EQ(out.target_count, batch.targets_count);
  EXPECT_LE(max_relative_diff(take_grads(*model), strategy_grads("standard", 0, 1, batch)), 1e-5);
}

// Whole runs through the trainer: with dropout on, checkpointing changes no loss of any
// step (the generator is left where standard training leaves it); accumulation of 2
// micro-batches of 2 follows standard training on batches of 4 (dropout off).
TEST(Accumulation, TrainerRunsMatchStandard) {
  auto run = [](const std::string& strategy, int64_t batch, int64_t accum, double dropout) {
    RunConfig c;
    c.model = "llama";
    c.preset = "tiny";
    c.optimizer = "sgd";
    c.lr = 0.1;
    c.strategy = parse_strategy(strategy);
    c.batch = batch;
    c.accum_steps = accum;
    c.seq_len = 32;
    c.steps = 3;
    c.warmup_steps = 0;
    c.eval_batches = 1;
    c.dropout = dropout;
    c.dataset = testing::fixture("text/sotu-excerpt.txt");
    c.quiet = true;
    Trainer trainer(c);
    auto record = record_to_json(trainer.run(nullptr));
    EXPECT_EQ(record["status"], "ok") << record["failure"].dump();
    std::vector<double> losses;
    for (const auto& s : record["steps"]) losses.push_back(s["loss"].get<double>());
    return losses;
  };
  EXPECT_EQ(run("checkpoint", 4, 1, 0.1), run("standard", 4, 1, 0.1));
  const auto standard = run("standard", 4, 1, 0);
  const auto accumulated = run("accumulation", 2, 2, 0);
  ASSERT_EQ(accumulated.size(), standard.size());
  for (size_t i = 0; i < standard.size(); ++i)
    EXPECT_NEAR(accumulated[i], standard[i], 1e-5 * standard[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace gradscope
