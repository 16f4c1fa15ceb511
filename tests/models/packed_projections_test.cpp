// --projections packed: q, k and v (and gate and up) as one matrix product over stacked
// weights, while the parameters stay the separate tensors they are. Checked against the
// separate path on the tiny Llama, ViT and NanoVLM: the same parameters, the same loss and
// gradients within rounding, and a memory trace that knows the stacked copies.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gradscope/models/common/layers.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/vit.h"
#include "gradscope/train/autocast.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace {

using testing::random_ids;
using testing::random_normal;

struct Case {
  std::string name;
  std::shared_ptr<Model> (*make)(const nlohmann::json&, uint64_t);
  nlohmann::json arch;
  int64_t attentions, swiglus;  // modules set_packed_projections must reach
};

// Dropout off everywhere: the two paths must see the same function.
nlohmann::json without_dropout(nlohmann::json arch) {
  for (const char* key : {"hidden_dropout", "attention_dropout", "embedding_dropout"})
    if (arch.contains(key)) arch[key] = 0.0;
  return arch;
}

std::vector<Case> cases() {
  const auto llama = without_dropout(llama_preset("tiny"));
  const auto vit = without_dropout(vit_preset("tiny"));
  const auto vlm = without_dropout(nanovlm_preset("tiny"));
  const auto layers = [](const nlohmann::json& arch, const char* key) {
    return arch.at(key).get<int64_t>();
  };
  return {
      {"llama", make_llama, llama, layers(llama, "num_hidden_layers"),
       layers(llama, "num_hidden_layers")},
      {"vit", make_vit, vit, layers(vit, "num_hidden_layers"), 0},
      {"nanovlm", make_nanovlm, vlm,
       layers(vlm, "vision_num_hidden_layers") + layers(vlm, "num_hidden_layers"),
       layers(vlm, "num_hidden_layers")},
  };
}

Batch batch_for(const std::string& name) {
  Batch b;
  if (name == "llama") {
    b.input_ids = random_ids(2, 16, 320, 21);
    b.targets = random_ids(2, 16, 320, 22);
  } else if (name == "vit") {
    b.images = random_normal({3, 3, 28, 28}, 23);
    b.labels = torch::tensor({1, 7, 4}, torch::kLong);
  } else {
    b.images = random_normal({2, 3, 32, 32}, 24);
    b.input_ids = random_ids(2, 8, 256, 25);
    b.targets = random_ids(2, 8, 256, 26);
  }
  return b;
}

struct Outcome {
  torch::Tensor loss;                          // () float64
  std::map<std::string, torch::Tensor> grads;  // float64 copies, by parameter name
};

// One forward and backward from freed gradients; everything returned in float64.
Outcome step(Model& model, const Batch& batch, bool bf16) {
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
  Outcome out;
  torch::Tensor loss;
  {
    AutocastScope autocast(torch::Device(torch::kCPU), bf16);
    loss = model.loss(batch).loss_sum;
  }
  loss.backward();
  out.loss = loss.detach().to(torch::kDouble);
  for (const auto& item : model.named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
    if (item.value().grad().defined())
      out.grads[item.key()] = item.value().grad().to(torch::kDouble);
  }
  return out;
}

double l2(const torch::Tensor& t) { return t.norm().item<double>(); }

// Unit roundoff of the dtype the products run in.
double unit_roundoff(bool bf16) {
  return bf16 ? std::ldexp(1.0, -8) : std::numeric_limits<float>::epsilon() / 2;
}

// The tolerance: packed and separate are evaluations of the same function that differ only
// in the order the products' sums are rounded, so each lies about as far from the exact value
// as the other. The same model in float64 stands in for the exact value, and by the triangle
// inequality |packed - separate| <= |packed - exact| + |separate - exact| ~ 2 |separate -
// exact| (norms over each tensor's elements). A floor of a few roundings of the tensor itself
// covers a tensor the separate path happens to get nearly exact.
void expect_same(const Outcome& packed, const Outcome& separate, const Outcome& exact, bool bf16,
                 const std::string& label) {
  const double u = unit_roundoff(bf16);
  double worst = 0;  // the largest |packed - separate| / tolerance, reported
  std::string worst_name;
  auto check = [&](const torch::Tensor& p, const torch::Tensor& s, const torch::Tensor& e,
                   const std::string& what) {
    const double diff = l2(p - s), own = l2(s - e);
    const double tolerance = 2 * own + 4 * u * l2(e);
    if (diff / tolerance > worst) {
      worst = diff / tolerance;
      worst_name = what;
    }
    EXPECT_LE(diff, tolerance) << label << " " << what << ": |packed - separate| " << diff
                               << ", |separate - float64| " << own;
  };
  check(packed.loss, separate.loss, exact.loss, "loss");
  ASSERT_EQ(packed.grads.size(), separate.grads.size()) << label;
  for (const auto& [name, g] : separate.grads) {
    ASSERT_TRUE(packed.grads.count(name)) << label << " " << name;
    check(packed.grads.at(name), g, exact.grads.at(name), name);
  }
  std::cout << label << ": largest |packed - separate| / tolerance " << worst << " (" << worst_name
            << ")\n";
}

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(Model& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& item : model.named_parameters())
    shapes.emplace_back(item.key(), item.value().sizes().vec());
  return shapes;
}

TEST(PackedProjections, ReachesEveryAttentionAndGatedMlp) {
  auto all = cases();
  all.push_back({"modernbert", make_modernbert, modernbert_preset("tiny"),
                 modernbert_preset("tiny").at("num_hidden_layers").get<int64_t>(), 0});
  for (const auto& c : all) {
    auto model = c.make(c.arch, 1);
    for (bool packed : {true, false}) {
      model->set_packed_projections(packed);
      int64_t attentions = 0, swiglus = 0;
      for (const auto& module : model->modules()) {
        if (auto* a = module->as<SelfAttentionImpl>()) {
          ++attentions;
          EXPECT_EQ(a->packed(), packed) << c.name;
        }
        if (auto* m = module->as<SwiGLUImpl>()) {
          ++swiglus;
          EXPECT_EQ(m->packed(), packed) << c.name;
        }
      }
      EXPECT_EQ(attentions, c.attentions) << c.name;
      EXPECT_EQ(swiglus, c.swiglus) << c.name;
    }
  }
}

TEST(PackedProjections, KeepsParameterNamesCountsAndShapes) {
  for (const auto& c : cases()) {
    auto model = c.make(c.arch, 2);
    const auto before = parameter_shapes(*model);
    const auto buffers = model->buffers().size();
    model->set_packed_projections(true);
    EXPECT_EQ(parameter_shapes(*model), before) << c.name;
    EXPECT_EQ(model->buffers().size(), buffers) << c.name;
    // A step with packing leaves a gradient on every separate parameter, of its own shape.
    model->train();
    const auto out = step(*model, batch_for(c.name), /*bf16=*/false);
    for (const auto& [name, shape] : before) {
      ASSERT_TRUE(out.grads.count(name)) << c.name << " " << name;
      EXPECT_EQ(out.grads.at(name).sizes().vec(), shape) << c.name << " " << name;
    }
  }
}

void compare_paths(bool bf16) {
  for (const auto& c : cases()) {
    auto model = c.make(c.arch, 3);
    model->train();
    const Batch batch = batch_for(c.name);
    model->set_packed_projections(false);
    const auto separate = step(*model, batch, bf16);
    model->set_packed_projections(true);
    const auto packed = step(*model, batch, bf16);
    // The same weights in float64, separate products, no autocast.
    auto exact_model = c.make(c.arch, 3);
    exact_model->to(torch::kDouble);
    exact_model->train();
    Batch exact_batch = batch;
    if (exact_batch.images.defined()) exact_batch.images = exact_batch.images.to(torch::kDouble);
    const auto exact = step(*exact_model, exact_batch, /*bf16=*/false);
    expect_same(packed, separate, exact, bf16, c.name + (bf16 ? " bf16" : " fp32"));
  }
}

TEST(PackedProjections, LossAndGradientsMatchSeparateInFloat32) { compare_paths(false); }

TEST(PackedProjections, LossAndGradientsMatchSeparateUnderBf16Autocast) { compare_paths(true); }

// The comparison above can fail: a packed path that mixed up k and v (same widths in a
// grouped-query Llama) is far outside the tolerance.
TEST(PackedProjections, ToleranceCatchesSwappedProjections) {
  const auto c = cases()[0];
  auto model = c.make(c.arch, 4);
  model->train();
  const Batch batch = batch_for(c.name);
  const auto separate = step(*model, batch, false);
  auto exact_model = c.make(c.arch, 4);
  exact_model->to(torch::kDouble);
  const auto exact = step(*exact_model, batch, false);
  // Swap the k and v weights of the first layer and take the separate path again.
  auto swapped_model = c.make(c.arch, 4);
  for (const auto& module : swapped_model->modules()) {
    if (auto* a = module->as<SelfAttentionImpl>()) {
      torch::NoGradGuard no_grad;
      auto k = a->k_proj->weight.clone();
      a->k_proj->weight.copy_(a->v_proj->weight);
      a->v_proj->weight.copy_(k);
      break;
    }
  }
  const auto swapped = step(*swapped_model, batch, false);
  const double u = unit_roundoff(false);
  const double diff = l2(swapped.loss - separate.loss);
  EXPECT_GT(diff, 2 * l2(separate.loss - exact.loss) + 4 * u * l2(exact.loss));
}

// The layer itself, with biases (ViT's attention has them): the packed output is the
// separate one, and so are the gradients of each weight and bias.
TEST(PackedProjections, PackedLinearSplitsOutputsAndGradients) {
  torch::nn::Linear a(torch::nn::LinearOptions(8, 6)), b(torch::nn::LinearOptions(8, 4));
  auto x = random_normal({3, 5, 8}, 27).requires_grad_(true);
  auto parts = packed_linear(x, {*a, *b});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].sizes(), torch::IntArrayRef({3, 5, 6}));
  EXPECT_EQ(parts[1].sizes(), torch::IntArrayRef({3, 5, 4}));
  EXPECT_TRUE(torch::allclose(parts[0], a(x), 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(parts[1], b(x), 1e-6, 1e-6));
  auto ga = random_normal({3, 5, 6}, 28), gb = random_normal({3, 5, 4}, 29);
  ((parts[0] * ga).sum() + (parts[1] * gb).sum()).backward();
  const auto packed_grads = std::vector<torch::Tensor>{
      a->weight.grad().clone(), a->bias.grad().clone(), b->weight.grad().clone(),
      b->bias.grad().clone(), x.grad().clone()};
  for (auto* p : {&a->weight, &a->bias, &b->weight, &b->bias, &x}) p->mutable_grad().reset();
  ((a(x) * ga).sum() + (b(x) * gb).sum()).backward();
  const auto separate_grads = std::vector<torch::Tensor>{
      a->weight.grad(), a->bias.grad(), b->weight.grad(), b->bias.grad(), x.grad()};
  for (size_t i = 0; i < separate_grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(packed_grads[i], separate_grads[i], 1e-5, 1e-6)) << i;
}

// The trace of a packed Llama: the same parameters, and for backward it keeps, in every layer,
// one stacked copy of the q, k and v weights and one of the gate and up weights more than the
// separate trace; its three (two) outputs become one, of the same size. SDPA saves v as it
// is given (grouped heads are not copied): in the packed trace a view of the one product's
// output, which keeps all of that output where the separate trace keeps v alone.
TEST(PackedProjectionsTrace, LlamaKeepsTheStackedWeightsForBackward) {
  const auto arch = llama_preset("tiny");
  const auto c = llama_config(arch);
  MemoryTrace separate, packed;
  packed.set_packed_projections(true);
  llama_trace_step(arch, 2, separate);
  llama_trace_step(arch, 2, packed);
  EXPECT_EQ(packed.param_sizes(), separate.param_sizes());
  const MemoryTrace::Checkpointing none;
  const auto s = separate.replay(none, false, true);
  const auto p = packed.replay(none, false, true);
  const int64_t qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  const int64_t stacked =
      (qkv * c.hidden_size + 2 * c.intermediate_size * c.hidden_size) * MemoryTrace::kFloat;
  const int64_t tokens = 2 * arch["seq_len"].get<int64_t>();
  const int64_t packed_output = tokens * qkv * MemoryTrace::kFloat;
  const int64_t v = tokens * c.num_key_value_heads * c.head_dim * MemoryTrace::kFloat;
  EXPECT_EQ(p.saved_bytes - s.saved_bytes, c.num_hidden_layers * (stacked + packed_output - v));
  EXPECT_EQ(p.grads_bytes, s.grads_bytes);
  EXPECT_GT(p.backward_peak, s.backward_peak);
}

// ViT's attention (with biases, no rotary): the stacked q, k and v weights per layer.
TEST(PackedProjectionsTrace, VitKeepsTheStackedAttentionWeights) {
  const auto arch = vit_preset("tiny");
  MemoryTrace separate, packed;
  packed.set_packed_projections(true);
  vit_trace_step(arch, 2, separate);
  vit_trace_step(arch, 2, packed);
  EXPECT_EQ(packed.param_sizes(), separate.param_sizes());
  const MemoryTrace::Checkpointing none;
  const int64_t C = arch["hidden_size"];
  const int64_t layers = arch["num_hidden_layers"];
  EXPECT_EQ(
      packed.replay(none, false, true).saved_bytes - separate.replay(none, false, true).saved_bytes,
      layers * 3 * C * C * MemoryTrace::kFloat);
}

}  // namespace
}  // namespace gradscope
