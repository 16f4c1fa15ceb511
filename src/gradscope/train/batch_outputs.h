// One forward and backward pass of a run's model on its first training micro-batch, kept as a
// peer implementation would produce it (Hugging Face transformers, a user's own code): the
// batch, the logits, the loss and every parameter's gradient under the published names, so
// that the two can be compared number for number (`gradscope outputs`, docs/weights.md).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "gradscope/train/session.h"

namespace gradscope {

struct BatchOutputs {
  // In the order written: "batch.*" (the inputs, as the model read them), "logits", "loss",
  // "grad.<published name>".
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  double loss = 0;        // mean over the batch's targets
  int64_t targets = 0;    // positions (or images) in the loss
  int64_t gradients = 0;  // published tensors with a gradient
};

// The first micro-batch of training step `step` (1-based; 1: samples [0, --batch) of the
// training stream; ModernBERT: with their seeded masks), as `gradscope run` trains on it, one
// forward in training mode (the session's dropout: 0 for a comparison) under the run's
// --dtype, the mean loss over the batch's targets, and its backward. The session's strategy
// and optimizer are not used. A usage error for a model with no published names (toy) or a
// chunked loss (which never holds the logits whole).
BatchOutputs batch_outputs(Session& session, int64_t step = 1);

}  // namespace gradscope
