// 8-bit Adam with block-wise dynamic quantization (Dettmers et al. 2022, "8-bit Optimizers
// via Block-wise Quantization", arXiv:2110.02861), in plain ATen ops (CPU and CUDA). For a
// parameter x with gradient g at step t (from 1), exactly torch.optim.Adam's update:
//
//   g <- g + weight_decay * x                        (L2, added to the gradient, like Adam)
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   x <- x - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// What differs is how m and v are kept between steps. A parameter with at least
// min_8bit_size elements stores each moment as one uint8 code per element plus one float32
// absmax per block of block_size consecutive elements (flattened, row-major; the last block
// may be partial). Each step dequantizes m and v (value = map[code] * absmax of the block),
// runs the update above in float32 (the parameter moves with the fresh float32 moments, as
// in bitsandbytes), then re-quantizes them with fresh per-block absmax: x / absmax is
// rounded to the nearest entry of the moment's quantization map. Smaller parameters (biases,
// norms) keep float32 moments (their own dtype when that is float64) and follow Adam exactly,
// as the paper recommends.
//
// Quantization maps, "dynamic tree quantization" (Section 2.2 of the paper, after Dettmers
// 2016): an 8-bit code is read from its most significant bit as
//   [sign bit] [e zero bits] [indicator bit 1] [f fraction bits]
// and stands for sign * 10^-e * fraction, the fraction linear in (0.1, 1]:
// fraction = 1 - 0.9 j / 2^f for the f-bit integer j (so j = 0 is exactly 1.0 and +-1.0, the
// normalized block maximum, is exact). A code with no indicator bit is 0. The signed map (for
// m) has e = 0..6: 127 positive values from 1e-6 to 1, their negatives and 0 (255 distinct
// values; the pattern "minus zero" duplicates 0). The unsigned map (for v >= 0) uses the sign
// bit as one more zero/fraction bit: e = 0..7, 255 positive values from 1e-7 to 1 and 0. Near
// 1 the fraction has 6 (signed) or 7 (unsigned) bits; each decade further down has one bit
// less, which keeps a relative precision over 7 decades instead of a uniform grid.
// The stored code is the index of the value in the sorted map (a relabelling of the bit
// patterns that keeps the values), so decoding is one index_select.
//
// Rounding error: at most half the largest gap of the map times the block absmax, i.e.
// 0.9 / 128 (signed) or 0.9 / 256 (unsigned) of the block's largest magnitude; 0 and the
// block maximum are exact.
// State per large parameter: 2 bytes per element + 8 bytes per block (about 1/4 of Adam's
// 8 bytes per element at block_size 2048); small parameters: 2x their float32 size.
#pragma once

#include <tuple>

#include <torch/torch.h>

#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {

// A quantization map: the values a code stands for, sorted, and the rounding thresholds.
struct QuantizationMap {
  torch::Tensor values;     // (N) float32, strictly increasing, N <= 256; code i -> values[i]
  torch::Tensor midpoints;  // (N - 1) float32, (values[i] + values[i + 1]) / 2
};

// The dynamic tree map, signed (for m) or unsigned (for v), on the given device. Built once
// per device and kept for the life of the process.
const QuantizationMap& dynamic_tree_map(bool is_signed, const c10::Device& device = torch::kCPU);

// x quantized block-wise: codes (numel x) uint8, flattened row-major, each the index of the
// map value nearest to x / absmax of its block; absmax (ceil(numel / block_size)) float32.
struct BlockwiseCodes {
  torch::Tensor codes;
  torch::Tensor absmax;
};
BlockwiseCodes quantize_blockwise(const torch::Tensor& x, const QuantizationMap& map,
                                  int64_t block_size);
// The float32 values, flattened (numel codes): map.values[code] * absmax of the block.
torch::Tensor dequantize_blockwise(const torch::Tensor& codes, const torch::Tensor& absmax,
                                   const QuantizationMap& map, int64_t block_size);

struct Adam8bitOptions : public torch::optim::OptimizerCloneableOptions<Adam8bitOptions> {
  Adam8bitOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);  // (m, v), each in [0, 1)
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;  // L2, added to the gradient, like Adam
  // Elements sharing one absmax. Smaller blocks isolate outliers (less rounding error for
  // the other elements) at 4 more bytes per block and moment; the paper uses 2048.
  TORCH_ARG(int64_t, block_size) = 2048;
  // Parameters with fewer elements keep float32 moments: they cost little memory and their
  // quantization error would be paid in full (bitsandbytes' default, 4096).
  TORCH_ARG(int64_t, min_8bit_size) = 4096;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

// Either the float moments (small parameters) or the 8-bit ones (large parameters) are set.
struct Adam8bitParamState : public torch::optim::OptimizerCloneableParamState<Adam8bitParamState>,
                            public StateBytes {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);            // m, the parameter's shape, float
  TORCH_ARG(torch::Tensor, exp_avg_sq);         // v, the parameter's shape, float
  TORCH_ARG(torch::Tensor, exp_avg_code);       // m, (numel) uint8, signed map
  TORCH_ARG(torch::Tensor, exp_avg_absmax);     // (blocks) float32
  TORCH_ARG(torch::Tensor, exp_avg_sq_code);    // v, (numel) uint8, unsigned map
  TORCH_ARG(torch::Tensor, exp_avg_sq_absmax);  // (blocks) float32

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override {
    return {exp_avg_,        exp_avg_sq_,      exp_avg_code_,
            exp_avg_absmax_, exp_avg_sq_code_, exp_avg_sq_absmax_};
  }
};

class Adam8bit : public SerializingOptimizer<Adam8bitParamState, Adam8bitOptions> {
 public:
  explicit Adam8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    Adam8bitOptions defaults = {});
  explicit Adam8bit(std::vector<torch::Tensor> params, Adam8bitOptions defaults = {})
      : Adam8bit({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
};

struct OptimizerEntry;
// The registry entry (factory.h).
OptimizerEntry adam8bit_entry();

}  // namespace gradscope
