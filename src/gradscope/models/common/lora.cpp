#include "gradscope/models/common/lora.h"

#include <algorithm>
#include <cmath>

#include "gradscope/models/common/layers.h"

namespace gradscope {

namespace F = torch::nn::functional;

LoraAdapterImpl::LoraAdapterImpl(int64_t in_, int64_t out_, int64_t rank_, double scaling_,
                                 double dropout_)
    : in(in_), out(out_), rank(rank_), scaling(scaling_), dropout(dropout_) {
  reset();
}

void LoraAdapterImpl::reset() {
  TORCH_CHECK(in > 0 && out > 0 && rank > 0, "LoRA adapter needs positive sizes, got in ", in,
              ", out ", out, ", rank ", rank);
  A = register_parameter("A", torch::zeros({rank, in}));
  B = register_parameter("B", torch::zeros({out, rank}));
}

void LoraAdapterImpl::init(at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto drawn = torch::empty({rank, in}, torch::kFloat32).uniform_(-bound, bound, gen);
  A.copy_(drawn);
}

torch::Tensor LoraAdapterImpl::forward(const torch::Tensor& x) {
  auto h = is_training() ? gradscope::dropout(x, dropout) : x;
  return F::linear(F::linear(h, A), B) * scaling;  // (..., r) -> (..., out)
}

torch::Tensor LoraAdapterImpl::delta() const {
  const auto dtype = B.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  return B.detach().to(dtype).mm(A.detach().to(dtype)) * scaling;
}

LoraAdapterImpl* lora_adapter_of(const torch::nn::Module& layer) {
  const auto children = layer.named_children();
  const auto* child = children.find("lora");
  return child ? (*child)->as<LoraAdapterImpl>() : nullptr;
}

torch::Tensor adapted_linear(torch::nn::LinearImpl& layer, const torch::Tensor& x) {
  // ATen's linear, as PyTorch's nn.Linear calls it: with a bias it folds the leading
  // dimensions and adds the bias inside the matrix product (addmm). The C++ module's
  // forward multiplies and then adds the bias as a second pass over the output.
  auto y = torch::linear(x, layer.weight, layer.bias);
  if (auto* adapter = lora_adapter_of(layer)) y = y + adapter->forward(x);
  return y;
}

namespace {

bool targeted(const LoraOptions& options, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (std::find(options.targets.begin(), options.targets.end(), name) != options.targets.end())
      return true;
  return false;
}

}  // namespace

std::vector<std::string> attach_lora(torch::nn::Module& root, const LoraOptions& options,
                                     at::Generator& gen) {
  TORCH_CHECK(options.rank >= 1, "LoRA rank must be positive, got ", options.rank);
  const double scaling = options.alpha / static_cast<double>(options.rank);
  // The layers to adapt, found before any is changed (registering a child changes the tree).
  std::vector<std::pair<std::string, torch::nn::Linear>> chosen;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    auto add = [&](const char* name, const torch::nn::Linear& layer) {
      chosen.emplace_back(prefix + name, layer);
    };
    if (auto* m = item.value()->as<SelfAttentionImpl>()) {
      if (targeted(options, {"q"})) add("q_proj", m->q_proj);
      if (targeted(options, {"k"})) add("k_proj", m->k_proj);
      if (targeted(options, {"v"})) add("v_proj", m->v_proj);
      if (targeted(options, {"o"})) add("o_proj", m->o_proj);
    } else if (auto* m = item.value()->as<SwiGLUImpl>()) {
      if (targeted(options, {"gate"})) add("gate_proj", m->gate_proj);
      if (targeted(options, {"up"})) add("up_proj", m->up_proj);
      if (targeted(options, {"down"})) add("down_proj", m->down_proj);
    } else if (auto* m = item.value()->as<GeluMLPImpl>()) {
      if (targeted(options, {"up"})) add("fc1", m->fc1);
      if (targeted(options, {"down"})) add("fc2", m->fc2);
    } else if (auto* m = item.value()->as<GeGLUImpl>()) {
      if (targeted(options, {"gate", "up"})) add("Wi", m->Wi);
      if (targeted(options, {"down"})) add("Wo", m->Wo);
    }
  }
  std::vector<std::string> names;
  for (auto& [name, layer] : chosen) {
    TORCH_CHECK(!lora_adapter_of(*layer), name, " has an adapter already");
    const auto& w = layer->weight;
    const int64_t rank = options.rank;
    LoraAdapter adapter(w.size(1), w.size(0), rank, scaling, options.dropout);
    adapter->init(gen);
    adapter->to(w.device(), w.scalar_type());
    layer->register_module("lora", adapter);
    names.push_back(name);
  }
  return names;
}

std::vector<std::pair<std::string, LoraAdapterImpl*>> lora_adapters(torch::nn::Module& root) {
  std::vector<std::pair<std::string, LoraAdapterImpl*>> out;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (item.value()->as<LoraAdapterImpl>()) continue;
    if (auto* adapter = lora_adapter_of(*item.value())) out.emplace_back(item.key(), adapter);
  }
  return out;
}

void draw_lora_b(torch::nn::Module& root, double std, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, adapter] : lora_adapters(root)) {
    (void)name;
    adapter->B.copy_(torch::empty(adapter->B.sizes(), torch::kFloat32).normal_(0, std, gen));
  }
}

bool is_lora_parameter(const std::string& name) {
  return name.size() >= 7 && (name.compare(name.size() - 7, 7, ".lora.A") == 0 ||
                              name.compare(name.size() - 7, 7, ".lora.B") == 0);
}

std::map<std::string, torch::Tensor> lora_merged_weights(torch::nn::Module& root) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, adapter] : lora_adapters(root)) {
    const auto* layer = root.named_modules("", false)[name]->as<torch::nn::LinearImpl>();
    TORCH_CHECK(layer, name, " is not a linear layer");
    const auto& w = layer->weight;
    const auto delta = adapter->delta().to(w.device());
    out[name + ".weight"] = (w.detach().to(delta.scalar_type()) + delta).to(w.scalar_type());
  }
  return out;
}

}  // namespace gradscope
