// The model and batches the strategy tests train on: the tiny Llama and random token batches,
// each from its own generator so that two strategies see the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "gradscope/models/llama.h"

namespace gradscope::testing {

inline constexpr int64_t kTinyVocab = 320;
inline constexpr int64_t kBytesPad = 258;  // the bytes tokenizer's PAD id

// The tiny Llama (hidden 64) with `layers` blocks and dropout p on both the residual branches
// and the attention weights; identical weights for the same seed.
inline std::shared_ptr<Model> tiny_llama(double dropout = 0, int64_t layers = 2,
                                         uint64_t seed = 7) {
  auto arch = llama_preset("tiny");
  arch["hidden_dropout"] = dropout;
  arch["attention_dropout"] = dropout;
  arch["num_hidden_layers"] = layers;
  auto model = make_llama(arch, seed);
  model->train();
  return model;
}

// A batch of random tokens from its own generator. Row i has lengths[i] real positions
// (all t when lengths is empty); the rest is padding, with no loss taken there.
inline Batch text_batch(int64_t b, int64_t t, uint64_t seed,
                        const std::vector<int64_t>& lengths = {}) {
  auto gen = at::detail::createCPUGenerator(seed);
  Batch batch;
  batch.input_ids = torch::randint(kTinyVocab, {b, t}, gen, torch::kLong);
  batch.targets = torch::randint(kTinyVocab, {b, t}, gen, torch::kLong);
  for (size_t i = 0; i < lengths.size(); ++i) {
    batch.input_ids[i].narrow(0, lengths[i], t - lengths[i]).fill_(kBytesPad);
    batch.targets[i].narrow(0, lengths[i], t - lengths[i]).fill_(kIgnoreIndex);
  }
  batch.samples = b;
  batch.tokens = b * t;
  batch.targets_count = batch.targets.ne(kIgnoreIndex).sum().item<int64_t>();
  return batch;
}

}  // namespace gradscope::testing
