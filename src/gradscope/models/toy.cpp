#include "gradscope/models/toy.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

using json = nlohmann::json;

int64_t dim_of(const json& arch, const char* model, int64_t at_least) {
  const int64_t n = arch.at("dim").get<int64_t>();
  check_usage(n >= at_least, fmt::format("{} dim={} must be at least {}", model, n, at_least),
              "pass e.g. --arch dim=10");
  return n;
}

class Quadratic : public ToyModel {
 public:
  Quadratic(int64_t n, double condition, uint64_t problem_seed) {
    torch::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(problem_seed);
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    auto gaussian = torch::empty({n, n}, f64).normal_(0.0, 1.0, gen);
    auto q = std::get<0>(at::linalg_qr(gaussian));  // (n, n) orthogonal
    auto lambda = n == 1 ? torch::ones({1}, f64)
                         : torch::logspace(0, std::log10(condition), n, 10.0, f64);  // (n)
    a_ = register_buffer("a", q.mm(torch::diag(lambda)).mm(q.t()));                  // (n, n)
    a_ = (a_ + a_.t()) / 2;  // exactly symmetric
    x_star_ = register_buffer("x_star", torch::empty({n}, f64).normal_(0.0, 1.0, gen));
    x_ = register_parameter("x", torch::zeros({n}, f64));
  }
  torch::Tensor minimizer() const override { return x_star_; }

 protected:
  torch::Tensor value(const torch::Tensor& x) override {
    auto e = x - x_star_;          // (n)
    return 0.5 * e.dot(a_.mv(e));  // ()
  }

 private:
  torch::Tensor a_, x_star_;
};

class Rosenbrock : public ToyModel {
 public:
  explicit Rosenbrock(int64_t n) {
    auto start = torch::ones({n}, torch::kFloat64);
    start.index_put_({torch::indexing::Slice(0, torch::indexing::None, 2)}, -1.2);
    x_ = register_parameter("x", start);
  }
  torch::Tensor minimizer() const override { return torch::ones_like(x_).detach(); }

 protected:
  torch::Tensor value(const torch::Tensor& x) override {
    const int64_t n = x.size(0);
    auto head = x.narrow(0, 0, n - 1);                                         // x_i, i < n
    auto tail = x.narrow(0, 1, n - 1);                                         // x_{i+1}
    return (100.0 * (tail - head * head).pow(2) + (1.0 - head).pow(2)).sum();  // ()
  }
};

json check_preset(const std::string& model, const std::string& preset, json tiny, json small) {
  if (preset == "tiny") return tiny;
  if (preset == "small") return small;
  fail_usage("model '" + model + "' has no preset '" + preset + "'",
             "toy problems have tiny (2-D) and small (100-D); set the size with --arch dim=N");
}

}  // namespace

LossOutput ToyModel::loss(const Batch& batch) {
  LossOutput out;
  out.loss_sum = value(x_);
  out.target_count = 1;
  return out;
}

int64_t toy_count_params(const json& arch) { return arch.at("dim").get<int64_t>(); }

json quadratic_preset(const std::string& preset) {
  return check_preset("quadratic", preset,
                      {{"dim", 2}, {"condition", 10.0}, {"problem_seed", 0}, {"seq_len", 1}},
                      {{"dim", 100}, {"condition", 1000.0}, {"problem_seed", 0}, {"seq_len", 1}});
}

std::shared_ptr<Model> make_quadratic(const json& arch, uint64_t /*seed*/) {
  const int64_t n = dim_of(arch, "quadratic", 1);
  const double condition = arch.at("condition").get<double>();
  check_usage(std::isfinite(condition) && condition >= 1,
              fmt::format("quadratic condition={} must be at least 1", condition),
              "pass e.g. --arch condition=100");
  return std::make_shared<Quadratic>(n, condition, arch.at("problem_seed").get<uint64_t>());
}

double quadratic_forward_flops(const json& arch, int64_t /*seq_len*/) {
  const double n = static_cast<double>(arch.at("dim").get<int64_t>());
  return 2 * n * n + 3 * n;  // A e (2n^2), e = x - x* (n), e.(A e) (2n)
}

json rosenbrock_preset(const std::string& preset) {
  return check_preset("rosenbrock", preset, {{"dim", 2}, {"seq_len", 1}},
                      {{"dim", 100}, {"seq_len", 1}});
}

std::shared_ptr<Model> make_rosenbrock(const json& arch, uint64_t /*seed*/) {
  return std::make_shared<Rosenbrock>(dim_of(arch, "rosenbrock", 2));
}

double rosenbrock_forward_flops(const json& arch, int64_t /*seq_len*/) {
  const double n = static_cast<double>(arch.at("dim").get<int64_t>());
  return 8 * (n - 1);  // per term: square, difference, square, scale; 1 - x, square; sums
}

}  // namespace gradscope
