#include "gradscope/train/eval.h"

#include <algorithm>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/train/autocast.h"

namespace gradscope {

int64_t eval_micro_batches(int64_t eval_batches, int64_t accum_steps, int64_t batch,
                           int64_t held_out_samples) {
  return std::min<int64_t>(eval_batches * accum_steps,
                           std::max<int64_t>(1, held_out_samples / std::max<int64_t>(batch, 1)));
}

Evaluation evaluate_model(Model& model, const DataSource& data, const torch::Device& device,
                          const EvalPass& pass) {
  check_usage(pass.batch >= 1, fmt::format("evaluation batch {} must be at least 1", pass.batch));
  const int64_t held_out = data.val_samples();
  check_usage(!pass.whole || held_out >= 1, "the held-out split has no samples to evaluate",
              "use a longer data set or a shorter --seq");
  torch::NoGradGuard no_grad;
  AutocastScope autocast(device, pass.bf16);
  model.eval();
  torch::Tensor sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  Evaluation e;
  int64_t correct = 0;
  bool classifier = false;
  try {
    const int64_t n = pass.whole ? (held_out + pass.batch - 1) / pass.batch
                                 : std::max<int64_t>(1, pass.micro_batches);
    const bool shared = pass.comm && !pass.whole;
    const int64_t world = shared ? pass.comm->world() : 1;
    const int64_t rank = shared ? pass.comm->rank() : 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t first = i * pass.batch * world + rank * pass.batch;
      const int64_t count = pass.whole ? std::min(pass.batch, held_out - first) : pass.batch;
      Batch batch = data.val_batch(first, count).to(device);
      LossOutput out = model.loss(batch);
      sum += out.loss_sum.to(torch::kFloat64);
      e.targets += out.target_count;
      e.samples += count;
      if (out.correct >= 0) {
        classifier = true;
        correct += out.correct;
      }
    }
  } catch (...) {
    model.train();
    throw;
  }
  model.train();
  if (pass.comm && !pass.whole) {
    torch::Tensor sums =
        torch::stack({sum.cpu(), torch::tensor(static_cast<double>(e.targets), torch::kFloat64),
                      torch::tensor(static_cast<double>(e.samples), torch::kFloat64),
                      torch::tensor(static_cast<double>(correct), torch::kFloat64)});
    pass.comm->allreduce(sums);
    sum = sums[0];
    e.targets = static_cast<int64_t>(sums[1].item<double>());
    e.samples = static_cast<int64_t>(sums[2].item<double>());
    correct = static_cast<int64_t>(sums[3].item<double>());
  }
  const double denominator = static_cast<double>(std::max<int64_t>(e.targets, 1));
  e.val_loss = sum.item<double>() / denominator;
  if (classifier) e.accuracy = static_cast<double>(correct) / denominator;
  return e;
}

}  // namespace gradscope
