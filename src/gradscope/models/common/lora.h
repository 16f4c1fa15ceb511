// LoRA, low-rank adaptation (Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large Language
// Models", arXiv:2106.09685): a frozen linear layer W (out, in) gets a trainable update of
// rank r,
//
//   y = x W^T (+ b) + (alpha / r) * dropout(x) A^T B^T,      A (r, in), B (out, r)
//
// with A drawn as torch.nn.Linear draws its weight (uniform in +-1/sqrt(in), what PEFT's
// kaiming_uniform_(a=sqrt(5)) gives) and B zero, so the adapted model starts equal to the
// base. The adapter is a child module "lora" of the linear layer it adapts, so its parameters
// are named after it ("layers.0.self_attn.q_proj.lora.A") and the layer keeps its own names
// and tensors. The layers of models/common/layers.h add an adapter's update wherever they
// call a linear layer (adapted_linear), packed projections included. W + (alpha / r) B A is
// the merged weight a saved model gets.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace gradscope {

struct LoraOptions {
  // Projections to adapt, among q, k, v, o, gate, up, down (RunConfig's lora_target_names()).
  // GELU MLPs: fc1 is up, fc2 down. GeGLU: Wi (gate and up in one matrix) is adapted when
  // gate or up is named, Wo is down.
  std::vector<std::string> targets;
  int64_t rank = 8;
  double alpha = 16;
  double dropout = 0;  // on the adapter's input, in training only
};

class LoraAdapterImpl : public torch::nn::Cloneable<LoraAdapterImpl> {
 public:
  LoraAdapterImpl(int64_t in, int64_t out, int64_t rank, double scaling, double dropout);
  void reset() override;  // A and B zero; draw A with init()
  // A uniform in +-1/sqrt(in) from `gen` (float32 on the CPU, then A's dtype and device).
  void init(at::Generator& gen);
  // (..., in) -> (..., out): scaling * dropout(x) A^T B^T
  torch::Tensor forward(const torch::Tensor& x);
  // scaling * B A, (out, in), in float32 or wider
  torch::Tensor delta() const;

  int64_t in, out, rank;
  double scaling, dropout;
  torch::Tensor A;  // (r, in)
  torch::Tensor B;  // (out, r)
};
TORCH_MODULE(LoraAdapter);

// The adapter of `layer`, or nullptr.
LoraAdapterImpl* lora_adapter_of(const torch::nn::Module& layer);

// layer(x), plus its adapter's update when it has one.
torch::Tensor adapted_linear(torch::nn::LinearImpl& layer, const torch::Tensor& x);

// Adds an adapter to each linear layer under `root` that `options` targets: the projections
// of every SelfAttention, SwiGLU, GeluMLP and GeGLU. Draws the A matrices in module order from
// `gen`. Returns the adapted layers' names under root ("layers.0.self_attn.q_proj").
std::vector<std::string> attach_lora(torch::nn::Module& root, const LoraOptions& options,
                                     at::Generator& gen);

// Every adapter under `root`, by the name of the layer it adapts.
std::vector<std::pair<std::string, LoraAdapterImpl*>> lora_adapters(torch::nn::Module& root);

// Draws every adapter's B under `root` from normal(0, std) with `gen`, in module order, so that
// a check sees adapters whose A gets a gradient (B = 0 at the start gives A none).
void draw_lora_b(torch::nn::Module& root, double std, at::Generator& gen);

// Whether `name` (as named_parameters() gives it) is an adapter's parameter.
bool is_lora_parameter(const std::string& name);

// The merged weight W + scaling B A of every adapted layer under `root`, by the name of the
// layer's weight ("layers.0.self_attn.q_proj.weight"), in W's dtype.
std::map<std::string, torch::Tensor> lora_merged_weights(torch::nn::Module& root);

}  // namespace gradscope
