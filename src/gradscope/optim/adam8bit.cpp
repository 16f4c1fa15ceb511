#include "gradscope/optim/adam8bit.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

// The values of the dynamic tree map, sorted, built from the bit layout in the header:
// after the sign bit (signed map only), e zero bits, an indicator bit, f fraction bits.
std::vector<float> tree_values(bool is_signed) {
  const int magnitude_bits = is_signed ? 7 : 8;  // the bits after the sign bit
  std::vector<float> values = {0.0f};            // no indicator bit: 0
  for (int e = 0; e < magnitude_bits; ++e) {
    const int f = magnitude_bits - 1 - e;  // bits left after the zeros and the indicator
    const int64_t count = int64_t{1} << f;
    const double decade = std::pow(10.0, -e);  // exactly 1 for e = 0
    for (int64_t j = 0; j < count; ++j) {
      // Linear in (0.1, 1], j = 0 being exactly 1 (so the block maximum is exact).
      const double fraction = 1.0 - 0.9 * static_cast<double>(j) / static_cast<double>(count);
      values.push_back(static_cast<float>(decade * fraction));
      if (is_signed) values.push_back(static_cast<float>(-decade * fraction));
    }
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  TORCH_INTERNAL_ASSERT(values.size() == (is_signed ? 255u : 256u), "dynamic tree map has ",
                        values.size(), " values");
  return values;
}

QuantizationMap build_map(bool is_signed, const c10::Device& device) {
  const auto host = tree_values(is_signed);
  auto values = torch::from_blob(const_cast<float*>(host.data()),
                                 {static_cast<int64_t>(host.size())}, torch::kFloat)
                    .to(device, /*non_blocking=*/false, /*copy=*/true);  // (N)
  auto midpoints = values.narrow(0, 1, values.size(0) - 1)
                       .add(values.narrow(0, 0, values.size(0) - 1))
                       .div_(2);  // (N - 1)
  return {values, midpoints};
}

int64_t blocks_of(int64_t numel, int64_t block_size) {
  return (numel + block_size - 1) / block_size;
}

// The code of 0 in a map (so that a fresh state dequantizes to 0 whatever its absmax).
int64_t zero_code(const QuantizationMap& map) {
  return torch::searchsorted(map.midpoints.cpu(), torch::zeros({1})).item<int64_t>();
}

}  // namespace

const QuantizationMap& dynamic_tree_map(bool is_signed, const c10::Device& device) {
  // Never destroyed: CUDA tensors must not be freed after the CUDA runtime has shut down at
  // exit. References to the elements stay valid when the map grows.
  static auto* maps = new std::unordered_map<c10::Device, QuantizationMap>[2];
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  auto& of_kind = maps[is_signed ? 1 : 0];
  auto it = of_kind.find(device);
  if (it == of_kind.end()) it = of_kind.emplace(device, build_map(is_signed, device)).first;
  return it->second;
}

BlockwiseCodes quantize_blockwise(const torch::Tensor& x, const QuantizationMap& map,
                                  int64_t block_size) {
  TORCH_CHECK(block_size >= 1, "Invalid block_size: ", block_size);
  const int64_t n = x.numel();
  const int64_t blocks = blocks_of(n, block_size);
  const auto options = x.options().dtype(torch::kFloat);
  if (n == 0) {
    return {torch::empty({0}, options.dtype(torch::kByte)), torch::empty({0}, options)};
  }
  auto flat = x.reshape({-1}).to(torch::kFloat);  // (n)
  const int64_t pad = blocks * block_size - n;    // zeros leave every absmax unchanged
  auto grid = (pad > 0 ? at::constant_pad_nd(flat, {0, pad}) : flat)
                  .view({blocks, block_size});  // (blocks, block_size)
  auto absmax = grid.abs().amax(1);             // (blocks)
  // An all-zero block divides by 1 instead of 0: its values stay 0.
  auto scale = torch::where(absmax > 0, absmax, torch::ones_like(absmax)).unsqueeze(1);
  auto normalized = grid.div(scale).view({-1});  // (blocks * block_size), in [-1, 1]
  // Index of the nearest map value: the number of midpoints below the value (a value on a
  // midpoint goes to the lower neighbour).
  auto codes = torch::searchsorted(map.midpoints, normalized, /*out_int32=*/true)
                   .narrow(0, 0, n)
                   .to(torch::kByte);  // (n)
  return {codes, absmax};
}

torch::Tensor dequantize_blockwise(const torch::Tensor& codes, const torch::Tensor& absmax,
                                   const QuantizationMap& map, int64_t block_size) {
  TORCH_CHECK(block_size >= 1, "Invalid block_size: ", block_size);
  const int64_t n = codes.numel();
  const int64_t blocks = blocks_of(n, block_size);
  TORCH_CHECK(absmax.numel() == blocks, "8-bit state of ", n, " elements has ", absmax.numel(),
              " block maxima, but block_size ", block_size, " needs ", blocks,
              " (was it saved with another block_size?)");
  if (n == 0) return torch::empty({0}, absmax.options());
  auto values = map.values.index_select(0, codes.reshape({-1}).to(torch::kInt));  // (n)
  const int64_t pad = blocks * block_size - n;
  auto grid = (pad > 0 ? at::constant_pad_nd(values, {0, pad}) : values)
                  .view({blocks, block_size});  // (blocks, block_size)
  grid.mul_(absmax.view({blocks, 1}));
  return grid.view({-1}).narrow(0, 0, n);  // (n), contiguous
}

void Adam8bitOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(block_size);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(min_8bit_size);
}

void Adam8bitOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, block_size);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, min_8bit_size);
}

void Adam8bitParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_code);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_absmax);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_code);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_absmax);
}

void Adam8bitParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_code);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_absmax);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq_code);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq_absmax);
}

Adam8bit::Adam8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   Adam8bitOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<Adam8bitOptions>(defaults)) {
  const auto [beta1, beta2] = defaults.betas();
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "Invalid beta parameter at index 0: ", beta1,
              " (must lie in [0, 1))");
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "Invalid beta parameter at index 1: ", beta2,
              " (must lie in [0, 1))");
  TORCH_CHECK(defaults.eps() >= 0, "Invalid epsilon value: ", defaults.eps());
  TORCH_CHECK(defaults.weight_decay() >= 0,
              "Invalid weight_decay value: ", defaults.weight_decay());
  TORCH_CHECK(defaults.block_size() >= 1, "Invalid block_size value: ", defaults.block_size(),
              " (must be >= 1)");
  TORCH_CHECK(defaults.min_8bit_size() >= 0,
              "Invalid min_8bit_size value: ", defaults.min_8bit_size(), " (must be >= 0)");
}

torch::Tensor Adam8bit::step(LossClosure closure) {
  auto update_one = [](const Adam8bitOptions& options, torch::Tensor& p, auto& slot) {
    const auto [beta1, beta2] = options.betas();
    const int64_t block_size = options.block_size();
    TORCH_CHECK(p.is_floating_point(), "Adam8bit needs floating-point parameters, got ",
                p.scalar_type());
    if (!slot) {
      auto state = std::make_unique<Adam8bitParamState>();
      if (p.numel() >= options.min_8bit_size()) {
        const auto& m_map = dynamic_tree_map(/*is_signed=*/true, p.device());
        const auto& v_map = dynamic_tree_map(/*is_signed=*/false, p.device());
        const auto codes = p.options().dtype(torch::kByte);
        const auto floats = p.options().dtype(torch::kFloat);
        const int64_t blocks = blocks_of(p.numel(), block_size);
        state->exp_avg_code(torch::full({p.numel()}, zero_code(m_map), codes));
        state->exp_avg_absmax(torch::zeros({blocks}, floats));
        state->exp_avg_sq_code(torch::full({p.numel()}, zero_code(v_map), codes));
        state->exp_avg_sq_absmax(torch::zeros({blocks}, floats));
      } else {
        const auto dtype = p.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
        state->exp_avg(
            torch::zeros_like(p, p.options().dtype(dtype), at::MemoryFormat::Preserve));
        state->exp_avg_sq(
            torch::zeros_like(p, p.options().dtype(dtype), at::MemoryFormat::Preserve));
      }
      slot = std::move(state);
    }
    auto& state = static_cast<Adam8bitParamState&>(*slot);
    const bool quantized = state.exp_avg_code().defined();
    state.step(state.step() + 1);
    const double bias_correction1 = 1 - std::pow(beta1, state.step());
    const double bias_correction2 = 1 - std::pow(beta2, state.step());

    // The moments, in p's shape: the state itself, or float32 copies dequantized from it.
    torch::Tensor exp_avg, exp_avg_sq;
    if (quantized) {
      TORCH_CHECK(state.exp_avg_code().numel() == p.numel(), "Adam8bit state holds ",
                  state.exp_avg_code().numel(), " codes for a parameter of ", p.numel());
      const auto& m_map = dynamic_tree_map(/*is_signed=*/true, p.device());
      const auto& v_map = dynamic_tree_map(/*is_signed=*/false, p.device());
      exp_avg =
          dequantize_blockwise(state.exp_avg_code(), state.exp_avg_absmax(), m_map, block_size)
              .view(p.sizes());
      exp_avg_sq = dequantize_blockwise(state.exp_avg_sq_code(), state.exp_avg_sq_absmax(), v_map,
                                        block_size)
                       .view(p.sizes());
    } else {
      exp_avg = state.exp_avg();
      exp_avg_sq = state.exp_avg_sq();
    }

    // torch::optim::Adam's arithmetic, op for op, in the moments' dtype.
    auto grad = p.grad();
    if (options.weight_decay() != 0) grad = grad.add(p, options.weight_decay());
    grad = grad.to(exp_avg.scalar_type());
    exp_avg.mul_(beta1).add_(grad, 1 - beta1);
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    auto denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
    const double step_size = options.lr() / bias_correction1;
    if (p.scalar_type() == exp_avg.scalar_type()) {
      p.addcdiv_(exp_avg, denom, -step_size);
    } else {
      p.add_(exp_avg.div(denom).mul_(-step_size).to(p.scalar_type()));
    }

    if (quantized) {
      const auto m = quantize_blockwise(exp_avg, dynamic_tree_map(/*is_signed=*/true, p.device()),
                                        block_size);
      const auto v = quantize_blockwise(
          exp_avg_sq, dynamic_tree_map(/*is_signed=*/false, p.device()), block_size);
      state.exp_avg_code().copy_(m.codes);
      state.exp_avg_absmax().copy_(m.absmax);
      state.exp_avg_sq_code().copy_(v.codes);
      state.exp_avg_sq_absmax().copy_(v.absmax);
    }
  };
  return step_each_parameter<Adam8bitOptions>(*this, "Adam8bit", closure, update_one);
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& adam8bit_keys() {
  static const std::vector<std::string> keys = {"betas", "eps", "block_size", "min_8bit_size"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_adam8bit(std::vector<torch::Tensor> params,
                                                       const ParamInfo& /*info*/, double lr,
                                                       double weight_decay,
                                                       const OptSettings& opt) {
  OptReader r("adam8bit", opt, adam8bit_keys());
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  const double block_size = r.number("block_size", 2048);
  const double min_8bit_size = r.number("min_8bit_size", 4096);
  check_betas("adam8bit", betas);
  check_range(eps >= 0, fmt::format("adam8bit eps={} must be >= 0", eps));
  // Whole numbers, and small enough to convert to int64_t exactly.
  check_range(block_size >= 1 && block_size == std::floor(block_size) && block_size < 9.0e15,
              fmt::format("adam8bit block_size={} must be a positive integer", block_size));
  check_range(
      min_8bit_size >= 0 && min_8bit_size == std::floor(min_8bit_size) && min_8bit_size < 9.0e15,
      fmt::format("adam8bit min_8bit_size={} must be an integer >= 0", min_8bit_size));
  auto options = Adam8bitOptions(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .weight_decay(weight_decay)
                     .block_size(static_cast<int64_t>(block_size))
                     .min_8bit_size(static_cast<int64_t>(min_8bit_size));
  return construct_optimizer<Adam8bit>("adam8bit", std::move(params), options);
}

// Two 8-bit moments with a float32 scale per block for tensors of at least min_8bit_size
// elements; float32 moments below it. An update dequantizes one tensor's moments. The
// optimizer's own defaults, so that the two cannot drift apart.
OptimizerMemory adam8bit_memory(const MemoryRuleInput& in) {
  const Adam8bitOptions defaults;
  const auto block = static_cast<int64_t>(in.setting("block_size", defaults.block_size()));
  const auto min8 = static_cast<int64_t>(in.setting("min_8bit_size", defaults.min_8bit_size()));
  const int64_t f = kOptimizerFloatBytes;
  int64_t state = 0;
  for (const ParamExtent& p : in.params()) {
    const int64_t n = p.bytes / f;
    state += n >= min8 ? 2 * (n + (n + block - 1) / block * f) : 2 * p.bytes;
  }
  return {state, 4 * in.largest() + in.decay()};
}

}  // namespace

OptimizerEntry adam8bit_entry() {
  OptimizerEntry e;
  e.make = make_adam8bit;
  e.default_lr = 1e-3;
  e.keys = adam8bit_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.memory = adam8bit_memory;
  e.compared_in_estimate = true;
  return e;
}

}  // namespace gradscope
