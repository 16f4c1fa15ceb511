// The loss of a model on held-out samples: what training's evaluations report, and what
// `gradscope eval` prints for a model read from weights.
//
// Held-out samples are the data source's val_batch windows, in order. A pass over
// `micro_batches` micro-batches of `batch` samples reads samples [0, micro_batches * batch)
// (wrapping around as val_batch does); with `whole` the pass reads every held-out sample
// exactly once instead, the last micro-batch holding what is left. The loss is the sum of the
// per-target losses (in float64, one micro-batch at a time) over the count of targets: nats per
// predicted token for a language model, per image for a classifier.
#pragma once

#include <cstdint>
#include <optional>

#include <torch/torch.h>

#include "gradscope/comm/comm.h"
#include "gradscope/models/model.h"
#include "gradscope/train/data_source.h"

namespace gradscope {

struct Evaluation {
  double val_loss = 0;
  std::optional<double> accuracy;  // classifiers only
  int64_t samples = 0;             // held-out samples read
  int64_t targets = 0;             // targets the loss is averaged over
};

struct EvalPass {
  int64_t batch = 1;          // samples per micro-batch
  int64_t micro_batches = 1;  // ignored with `whole`
  bool whole = false;         // every held-out sample once
  bool bf16 = false;          // bf16 autocast, as training's forward
  // The ranks of a run with several (null: one process). Micro-batch i is then the global
  // batch of world x batch samples, each rank reading its share as in training, and the sums
  // are taken over the ranks: every rank gets the loss one process would.
  Communicator* comm = nullptr;
};

// Training's rule: --eval-batches effective batches, taken as micro-batches of --batch, at
// most as many as the held-out samples fill (at least one).
int64_t eval_micro_batches(int64_t eval_batches, int64_t accum_steps, int64_t batch,
                           int64_t held_out_samples);

// Evaluates without gradients, in eval mode (no dropout), and puts the model back in training
// mode. A usage error when the pass reads nothing.
Evaluation evaluate_model(Model& model, const DataSource& data, const torch::Device& device,
                          const EvalPass& pass);

}  // namespace gradscope
