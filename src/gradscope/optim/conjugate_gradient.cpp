#include "gradscope/optim/conjugate_gradient.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {

void ConjugateGradientOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(beta_rule);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(line_search);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(restart_every);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(c1);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(c2);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(backtrack);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_evals);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(tolerance_change);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
}

void ConjugateGradientOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::string, beta_rule);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::string, line_search);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, restart_every);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, c1);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, c2);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, backtrack);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, max_evals);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, tolerance_change);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
}

void ConjugateGradientParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(prev_grad);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(direction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step_size);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(slope);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(restarts);
}

void ConjugateGradientParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, prev_grad);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, direction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, step_size);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, slope);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, restarts);
}

namespace {

// Sums of per-parameter dot products, each accumulated in float64, read with one sync.
std::vector<double> dots(
    const std::vector<std::pair<const torch::Tensor*, const torch::Tensor*>>& pairs_per_sum,
    size_t params) {
  const size_t sums = pairs_per_sum.size() / params;
  std::vector<torch::Tensor> parts;
  parts.reserve(pairs_per_sum.size());
  for (const auto& [a, b] : pairs_per_sum) parts.push_back(a->mul(*b).sum(torch::kFloat64));
  auto all = torch::stack(parts).reshape({static_cast<int64_t>(sums), -1}).sum(1).cpu();
  std::vector<double> out(sums);
  for (size_t i = 0; i < sums; ++i) out[i] = all[static_cast<int64_t>(i)].item<double>();
  return out;
}

// A point on the line x + t d: the step, the loss and its slope f'(t) = g(x + t d).d.
struct LinePoint {
  double t = 0;
  double f = 0;
  double slope = 0;
};

// The minimizer of the cubic through two points with their slopes (Nocedal & Wright eq. 3.59),
// clamped to [lo, hi]; the midpoint when the cubic has no minimum.
double cubic_minimizer(const LinePoint& a, const LinePoint& b, double lo, double hi) {
  const double d1 = a.slope + b.slope - 3 * (a.f - b.f) / (a.t - b.t);
  const double square = d1 * d1 - a.slope * b.slope;
  if (square >= 0) {
    const double d2 = std::copysign(std::sqrt(square), b.t - a.t);
    const double t = b.t - (b.t - a.t) * (b.slope + d2 - d1) / (b.slope - a.slope + 2 * d2);
    if (std::isfinite(t)) return std::min(std::max(t, lo), hi);
  }
  return (lo + hi) / 2;
}

// The loss along x + t d, evaluated through the closure. The parameters move by the
// difference to the last evaluated step, so no copy of them is kept.
class Line {
 public:
  Line(std::vector<torch::Tensor> params, std::vector<torch::Tensor> directions,
       double weight_decay, const torch::optim::Optimizer::LossClosure& closure,
       int64_t& evaluations)
      : params_(std::move(params)),
        directions_(std::move(directions)),
        weight_decay_(weight_decay),
        closure_(closure),
        evaluations_(evaluations) {}

  void move_to(double t) {
    if (t == t_) return;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].add_(directions_[i], t - t_);
    t_ = t;
  }

  // f(x + t d) of the objective the search minimizes, the closure's loss plus
  // weight_decay / 2 ||x + t d||^2, and with_slope its slope (g + weight_decay x).d, so that
  // the search's conditions compare the value and the slope of one function.
  LinePoint at(double t, bool with_slope) {
    move_to(t);
    LinePoint point;
    point.t = t;
    {
      at::AutoGradMode enable_grad(true);
      point.f = closure_().item<double>();
    }
    ++evaluations_;
    std::vector<torch::Tensor> grads;
    std::vector<std::pair<const torch::Tensor*, const torch::Tensor*>> pairs;
    if (with_slope) {
      for (const auto& p : params_) {
        TORCH_CHECK(p.grad().defined(), "ConjugateGradient's closure left no gradient");
        grads.push_back(weight_decay_ != 0 ? p.grad().add(p, weight_decay_) : p.grad());
      }
      for (size_t i = 0; i < params_.size(); ++i) pairs.emplace_back(&grads[i], &directions_[i]);
    }
    if (weight_decay_ != 0)
      for (const auto& p : params_) pairs.emplace_back(&p, &p);
    if (pairs.empty()) return point;
    const auto s = dots(pairs, params_.size());  // [g.d,] [x.x]
    if (with_slope) point.slope = s.front();
    if (weight_decay_ != 0) point.f += 0.5 * weight_decay_ * s.back();
    return point;
  }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> directions_;
  double weight_decay_;
  const torch::optim::Optimizer::LossClosure& closure_;
  int64_t& evaluations_;
  double t_ = 0;
};

bool sufficient_decrease(const LinePoint& p, const LinePoint& origin, double c1) {
  return p.f <= origin.f + c1 * p.t * origin.slope;
}

// Backtracking from t0 until the Armijo condition holds; else the lowest loss seen (or 0).
double armijo_search(Line& line, const LinePoint& origin, double t0,
                     const ConjugateGradientOptions& o) {
  LinePoint best = origin;
  double t = t0;
  for (int64_t i = 0; i < o.max_evals(); ++i) {
    const LinePoint p = line.at(t, false);
    if (sufficient_decrease(p, origin, o.c1())) return t;
    if (p.f < best.f) best = p;
    t *= o.backtrack();
  }
  line.move_to(best.t);
  return best.t;
}

// Nocedal & Wright Algorithm 3.6: narrows [lo, hi], which holds a strong-Wolfe step; lo is the
// end with the lowest loss that satisfies sufficient decrease.
double zoom(Line& line, const LinePoint& origin, LinePoint lo, LinePoint hi, int64_t evals_left,
            double direction_scale, const ConjugateGradientOptions& o) {
  bool short_of_progress = false;
  for (; evals_left > 0; --evals_left) {
    const double a = std::min(lo.t, hi.t), b = std::max(lo.t, hi.t);
    if ((b - a) * direction_scale < o.tolerance_change()) break;
    double t = cubic_minimizer(lo, hi, a, b);
    // Safeguard: a trial hugging an end of the bracket twice in a row moves inwards.
    const double margin = 0.1 * (b - a);
    if (std::min(t - a, b - t) < margin) {
      if (short_of_progress) t = (t - a < b - t) ? a + margin : b - margin;
      short_of_progress = !short_of_progress;
    } else {
      short_of_progress = false;
    }
    const LinePoint p = line.at(t, true);
    if (!sufficient_decrease(p, origin, o.c1()) || p.f >= lo.f) {
      hi = p;
    } else {
      if (std::abs(p.slope) <= -o.c2() * origin.slope) return t;
      if (p.slope * (hi.t - lo.t) >= 0) hi = lo;
      lo = p;
    }
  }
  line.move_to(lo.t);
  return lo.t;
}

// Nocedal & Wright Algorithm 3.5: a step satisfying the strong Wolfe conditions, found by
// extrapolation from t0 and then zoom; else the best sufficient-decrease step seen (or 0).
double strong_wolfe_search(Line& line, const LinePoint& origin, double t0, double direction_scale,
                           const ConjugateGradientOptions& o) {
  LinePoint prev = origin;
  LinePoint best = origin;
  double t = t0;
  for (int64_t i = 0; i < o.max_evals(); ++i) {
    const LinePoint p = line.at(t, true);
    const int64_t left = o.max_evals() - i - 1;
    if (!sufficient_decrease(p, origin, o.c1()) || (i > 0 && p.f >= prev.f))
      return zoom(line, origin, prev, p, left, direction_scale, o);
    if (std::abs(p.slope) <= -o.c2() * origin.slope) return t;
    if (p.slope >= 0) return zoom(line, origin, p, prev, left, direction_scale, o);
    if (p.f < best.f) best = p;
    const double next = cubic_minimizer(prev, p, t + 0.01 * (t - prev.t), 10 * t);
    prev = p;
    t = next;
  }
  line.move_to(best.t);
  return best.t;
}

// beta of `rule` (fr, pr+, hs, dy) from the step's dot products: g.g, g.y, g_prev.g_prev and
// d_prev.y (y = g - g_prev). Sets `restart` and returns 0 when it has no finite value.
double conjugate_beta(const std::string& rule, double gg, double gy, double prev_prev, double dy,
                      bool& restart) {
  double numerator = 0, denominator = 0;
  if (rule == "fr") {
    numerator = gg, denominator = prev_prev;
  } else if (rule == "pr+") {
    numerator = gy, denominator = prev_prev;
  } else if (rule == "hs") {
    numerator = gy, denominator = dy;
  } else {  // dy
    numerator = gg, denominator = dy;
  }
  double beta = numerator / denominator;
  if (rule == "pr+") beta = std::max(0.0, beta);
  if (denominator == 0 || !std::isfinite(beta)) restart = true;
  return restart ? 0 : beta;
}

// The line search's step along `dirs` from `origin`: Armijo's from lr, or strong Wolfe's from
// lr at a restart and else from the last step's size scaled by the slopes (N&W eq. 3.60).
double search_step(Line& line, const std::vector<torch::Tensor>& dirs, const LinePoint& origin,
                   bool restart, const ConjugateGradientParamState& first,
                   const ConjugateGradientOptions& o) {
  if (o.line_search() == "armijo") return armijo_search(line, origin, o.lr(), o);
  double t0 = o.lr();
  if (!restart) {
    const double guess = first.step_size() * first.slope() / origin.slope;
    if (std::isfinite(guess) && guess > 0) t0 = guess;
  }
  double scale = 0;  // largest |d| entry: a bracket narrower than tolerance / scale
  for (const auto& d : dirs) scale = std::max(scale, d.abs().max().item<double>());
  return strong_wolfe_search(line, origin, t0, scale, o);
}

}  // namespace

ConjugateGradient::ConjugateGradient(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                     ConjugateGradientOptions defaults)
    : SerializingOptimizer(std::move(param_groups),
                           std::make_unique<ConjugateGradientOptions>(defaults)) {
  const auto& o = defaults;
  TORCH_CHECK(o.lr() > 0, "Invalid learning rate: ", o.lr(), " (must be > 0)");
  TORCH_CHECK(o.beta_rule() == "fr" || o.beta_rule() == "pr+" || o.beta_rule() == "hs" ||
                  o.beta_rule() == "dy",
              "Invalid beta_rule: '", o.beta_rule(), "' (valid: fr, pr+, hs, dy)");
  TORCH_CHECK(
      o.line_search() == "none" || o.line_search() == "armijo" || o.line_search() == "strong_wolfe",
      "Invalid line_search: '", o.line_search(), "' (valid: none, armijo, strong_wolfe)");
  TORCH_CHECK(o.restart_every() >= 0, "Invalid restart_every: ", o.restart_every(),
              " (must be >= 0)");
  TORCH_CHECK(o.c1() > 0 && o.c1() < o.c2() && o.c2() < 1, "Invalid c1, c2: ", o.c1(), ", ", o.c2(),
              " (need 0 < c1 < c2 < 1)");
  TORCH_CHECK(o.backtrack() > 0 && o.backtrack() < 1, "Invalid backtrack: ", o.backtrack(),
              " (must lie in (0, 1))");
  TORCH_CHECK(o.max_evals() >= 1, "Invalid max_evals: ", o.max_evals(), " (must be >= 1)");
  TORCH_CHECK(o.tolerance_change() >= 0, "Invalid tolerance_change: ", o.tolerance_change());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(param_groups_.size() == 1,
              "ConjugateGradient treats all parameters as one vector: give it one parameter "
              "group, not ",
              param_groups_.size());
}

torch::Tensor ConjugateGradient::step(LossClosure closure) {
  auto& group = param_groups_.at(0);
  const auto& o = static_cast<const ConjugateGradientOptions&>(group.options());
  const bool search = o.line_search() != "none";
  TORCH_CHECK(!search || closure != nullptr, "ConjugateGradient with line_search=", o.line_search(),
              " needs a closure that re-evaluates the loss and gradients");
  torch::NoGradGuard no_grad;
  last_evaluations_ = 0;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
    ++last_evaluations_;
  }

  std::vector<torch::Tensor> params, grads, prev, dirs;
  std::vector<ConjugateGradientParamState*> states;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    TORCH_CHECK(!p.grad().is_sparse(), "ConjugateGradient does not support sparse gradients");
    auto& slot = state_[param_state_key(p)];
    if (!slot) {
      auto state = std::make_unique<ConjugateGradientParamState>();
      state->prev_grad(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      state->direction(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      slot = std::move(state);
    }
    auto* state = static_cast<ConjugateGradientParamState*>(slot.get());
    params.push_back(p);
    grads.push_back(o.weight_decay() != 0 ? p.grad().add(p, o.weight_decay()) : p.grad());
    prev.push_back(state->prev_grad());
    dirs.push_back(state->direction());
    states.push_back(state);
  }
  if (params.empty()) return loss;
  const auto& first = *states.front();
  const int64_t k = first.step();
  bool restart =
      k == 0 || (o.restart_every() > 0 && k % o.restart_every() == 0) || first.step_size() == 0;

  // g.g, g.g_prev, g_prev.g_prev, d_prev.g, d_prev.g_prev (and x.x, for the decay term of a
  // search's f) in one pass and one sync.
  std::vector<std::pair<const torch::Tensor*, const torch::Tensor*>> pairs;
  for (size_t i = 0; i < params.size(); ++i) pairs.emplace_back(&grads[i], &grads[i]);
  for (size_t i = 0; i < params.size(); ++i) pairs.emplace_back(&grads[i], &prev[i]);
  for (size_t i = 0; i < params.size(); ++i) pairs.emplace_back(&prev[i], &prev[i]);
  for (size_t i = 0; i < params.size(); ++i) pairs.emplace_back(&dirs[i], &grads[i]);
  for (size_t i = 0; i < params.size(); ++i) pairs.emplace_back(&dirs[i], &prev[i]);
  const bool decay_in_f = search && o.weight_decay() != 0;
  if (decay_in_f)
    for (size_t i = 0; i < params.size(); ++i) pairs.emplace_back(&params[i], &params[i]);
  const auto s = dots(pairs, params.size());
  const double gg = s[0], g_prev = s[1], prev_prev = s[2], d_g = s[3], d_prev = s[4];
  const double xx = decay_in_f ? s[5] : 0;  // ||x_k||^2
  const double gy = gg - g_prev;            // g.y with y = g - g_prev
  const double dy = d_g - d_prev;           // d_prev.y

  double beta = restart ? 0 : conjugate_beta(o.beta_rule(), gg, gy, prev_prev, dy, restart);
  // d = -g + beta d_prev; its slope g.d = -g.g + beta d_prev.g.
  for (size_t i = 0; i < params.size(); ++i) dirs[i].mul_(beta).sub_(grads[i]);
  double slope = -gg + beta * d_g;
  if (!(slope < 0) && !restart) {  // not a descent direction: steepest descent instead
    for (size_t i = 0; i < params.size(); ++i) dirs[i].copy_(grads[i]).neg_();
    slope = -gg;
    beta = 0;
    restart = true;
  }
  last_beta_ = beta;
  for (size_t i = 0; i < params.size(); ++i) prev[i].copy_(grads[i]);
  grads.clear();  // may alias .grad, which a line search's closure replaces

  double t = 0;
  if (slope < 0) {  // else the gradient is 0: nothing to do
    if (!search) {
      t = o.lr();
      for (size_t i = 0; i < params.size(); ++i) params[i].add_(dirs[i], t);
    } else {
      // The search minimizes the objective whose gradient it follows: with weight decay (L2,
      // g + wd x above) that is f + wd / 2 ||x||^2, in the origin as at every trial point.
      const LinePoint origin{0, loss.item<double>() + 0.5 * o.weight_decay() * xx, slope};
      Line line(params, dirs, o.weight_decay(), closure, last_evaluations_);
      t = search_step(line, dirs, origin, restart, first, o);
    }
  }
  const int64_t restarts = first.restarts() + (restart && k > 0 ? 1 : 0);
  for (auto* state : states) {
    state->step(k + 1);
    state->step_size(slope < 0 ? t : first.step_size());
    state->slope(slope);
    state->restarts(restarts);
  }
  return loss;
}

int64_t ConjugateGradient::restarts() const {
  for (const auto& group : param_groups_)
    for (const auto& p : group.params()) {
      auto it = state_.find(param_state_key(p));
      if (it != state_.end())
        return static_cast<const ConjugateGradientParamState&>(*it->second).restarts();
    }
  return 0;
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& cg_keys() {
  static const std::vector<std::string> keys = {
      "beta_rule", "line_search", "restart_every", "c1", "c2", "backtrack", "max_evals",
      "tolerance_change"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_cg(std::vector<torch::Tensor> params,
                                                 const ParamInfo& /*info*/, double lr,
                                                 double weight_decay, const OptSettings& opt) {
  OptReader r("cg", opt, cg_keys());
  const auto rule = r.choice("beta_rule", "pr+", {"fr", "pr+", "hs", "dy"});
  const auto search = r.choice("line_search", "strong_wolfe", {"none", "armijo", "strong_wolfe"});
  const int64_t restart_every = r.integer("restart_every", 0);
  const double c1 = r.number("c1", 1e-4);
  const double c2 = r.number("c2", 0.1);
  const double backtrack = r.number("backtrack", 0.5);
  const int64_t max_evals = r.integer("max_evals", 25);
  const double tolerance = r.number("tolerance_change", 1e-12);
  check_range(
      restart_every >= 0,
      fmt::format("cg restart_every={} must be >= 0 (0 = no scheduled restarts)", restart_every));
  check_range(c1 > 0 && c1 < c2 && c2 < 1,
              fmt::format("cg c1={}, c2={} must satisfy 0 < c1 < c2 < 1", c1, c2));
  check_range(backtrack > 0 && backtrack < 1,
              fmt::format("cg backtrack={} must lie in (0, 1)", backtrack));
  check_range(max_evals >= 1, fmt::format("cg max_evals={} must be >= 1", max_evals));
  check_range(tolerance >= 0, fmt::format("cg tolerance_change={} must be >= 0", tolerance));
  auto options = ConjugateGradientOptions(lr)
                     .beta_rule(rule)
                     .line_search(search)
                     .restart_every(restart_every)
                     .c1(c1)
                     .c2(c2)
                     .backtrack(backtrack)
                     .max_evals(max_evals)
                     .tolerance_change(tolerance)
                     .weight_decay(weight_decay);
  return construct_optimizer<ConjugateGradient>("cg", std::move(params), options);
}

// The previous gradient and the direction; the line search's trial point and its gradient.
OptimizerMemory cg_memory(const MemoryRuleInput& in) {
  return {2 * in.total(), 2 * in.largest() + in.decay()};
}

}  // namespace

OptimizerEntry cg_entry() {
  OptimizerEntry e;
  e.make = make_cg;
  e.default_lr = 1e-2;
  e.keys = cg_keys();
  e.steps_with_closure = true;
  e.memory = cg_memory;
  e.compared_in_estimate = true;
  return e;
}

}  // namespace gradscope
