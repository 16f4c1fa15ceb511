// Replays tests/fixtures/golden/optimizers.json (written by
// scripts/golden/make_optimizer_golden.py from torch.optim, and for Lion and Adafactor, which
// torch.optim lacks, from the script's own Python versions) with gradscope's optimizer
// factory: the same float64 problem, the same initial parameters and data, and the
// parameters compared at every sampled step with allclose(rtol=1e-6, atol=1e-8).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "gradscope/optim/factory.h"
#include "test_util.h"

namespace gradscope {
namespace {

constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-8;  // torch.allclose's default

torch::Tensor from_json(const nlohmann::json& t) {
  const auto values = t.at("values").get<std::vector<double>>();
  const auto shape = t.at("shape").get<std::vector<int64_t>>();
  return torch::tensor(values, torch::kFloat64).reshape(shape).clone();
}

torch::Tensor from_flat(const nlohmann::json& values, const torch::Tensor& like) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kFloat64).reshape(like.sizes());
}

const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::fixture("golden/optimizers.json"));
    EXPECT_TRUE(in.good()) << "missing tests/fixtures/golden/optimizers.json";
    return nlohmann::json::parse(in);
  }();
  return j;
}

// Same as the script's loss_fn.
torch::Tensor loss_fn(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                      const torch::Tensor& y) {
  auto h = torch::linear(x, p[0], p[1]).tanh();  // (N, D_HIDDEN)
  auto out = torch::linear(h, p[2], p[3]);       // (N, D_OUT)
  return (out - y).pow(2).mean();
}

class GoldenTrajectory : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTrajectory, MatchesTorchOptim) {
  const auto& g = golden();
  const auto& problem = g.at("problem");
  const auto x = from_json(problem.at("x"));
  const auto y = from_json(problem.at("y"));
  const nlohmann::json* run = nullptr;
  for (const auto& r : g.at("runs"))
    if (r.at("name") == GetParam()) run = &r;
  ASSERT_NE(run, nullptr) << "no run " << GetParam() << " in the golden file";

  std::vector<torch::Tensor> params;
  for (const auto& t : problem.at("params")) params.push_back(from_json(t).requires_grad_(true));
  OptSettings settings;
  for (const auto& [k, v] : run->at("opt").items()) settings[k] = v.get<std::string>();
  auto optimizer =
      make_optimizer(run->at("optimizer").get<std::string>(), params, run->at("lr").get<double>(),
                     run->at("weight_decay").get<double>(), settings);

  const auto& samples = run->at("samples");
  const int64_t steps = g.at("steps").get<int64_t>();
  size_t next = 0;
  double worst_rel = 0;
  int64_t worst_step = 0;
  for (int64_t step = 1; step <= steps && next < samples.size(); ++step) {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    loss_fn(params, x, y).backward();
    optimizer->step();
    const auto& sample = samples[next];
    if (sample.at("step").get<int64_t>() != step) continue;
    ++next;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto want = from_flat(sample.at("params")[i], params[i]);
      const auto got = params[i].detach();
      const double rel = ((got - want).abs() / want.abs().clamp_min(1e-300)).max().item<double>();
      if (rel > worst_rel) {
        worst_rel = rel;
        worst_step = step;
      }
      EXPECT_TRUE(torch::allclose(got, want, kRtol, kAtol))
          << GetParam() << " parameter " << problem.at("param_names")[i] << " differs at step "
          << step << ": max |got - want| = " << (got - want).abs().max().item<double>();
    }
  }
  EXPECT_EQ(next, samples.size()) << "not every sampled step was compared";
  const std::string where =
      worst_rel == 0 ? "bit-identical" : "at step " + std::to_string(worst_step);
  std::printf("GOLDEN %s %s: worst relative difference %.3g (%s) over %zu sampled steps\n",
              GetParam().c_str(), HasFailure() ? "FAILED" : "OK", worst_rel, where.c_str(),
              samples.size());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, GoldenTrajectory,
                         ::testing::Values("sgd", "sgd_momentum", "sgd_nesterov", "adam", "adamw",
                                           "adagrad", "adadelta", "adadelta_decay", "lion",
                                           "adafactor", "adafactor_beta1_fixed_lr"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gradscope
