#include "gradscope/train/batch_outputs.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/hf_weights.h"
#include "gradscope/train/autocast.h"

namespace gradscope {

BatchOutputs batch_outputs(Session& session, int64_t step) {
  const RunConfig& rc = session.config();
  check_usage(session.family().kind != ModelKind::kToy,
              "toy problem '" + rc.model + "' has no published layout to compare with",
              "use llama, modernbert, vit or nanovlm");
  check_usage(rc.loss != LossKind::kChunked,
              "--loss chunked never holds the logits whole, so there are none to write",
              "leave --loss out (the full loss)");
  Model& model = session.model();
  LossOptions options = model.loss_options();
  options.keep_logits = true;
  model.set_loss_options(options);
  model.train();
  model.zero_grad();
  seed_dropout(rc);

  check_usage(step >= 1, fmt::format("--step {} must be at least 1", step),
              "training steps count from 1");
  // Step k takes samples up to k x the samples of a step: those indices must be int64s.
  const int64_t per_step = rc.effective_batch() * session.world();
  check_usage(step <= std::numeric_limits<int64_t>::max() / per_step,
              fmt::format("--step {} is beyond any training run: its samples' indices "
                          "overflow",
                          step),
              "pass a step a run reaches");
  const Batch batch = session.step_batches(step - 1).fetch(0).to(session.device());
  LossOutput out;
  {
    AutocastScope autocast(session.device(), rc.dtype == Dtype::kBf16);
    out = model.loss(batch);
  }
  const int64_t count = std::max<int64_t>(out.target_count, 1);
  const torch::Tensor loss = out.loss_sum / static_cast<double>(count);  // ()
  loss.backward();

  BatchOutputs r;
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    if (t.defined()) r.tensors.emplace_back(name, t.detach().to(torch::kCPU));
  };
  add("batch.input_ids", batch.input_ids);
  add("batch.targets", batch.targets);
  add("batch.images", batch.images);
  add("batch.labels", batch.labels);
  if (batch.text_mask.defined()) add("batch.text_mask", batch.text_mask.to(torch::kInt64));
  add("logits", out.logits);
  add("loss", loss.to(torch::kFloat));
  for (const auto& [name, grad] : hf_gradients(rc.model, model)) {
    add("grad." + name, grad);
    ++r.gradients;
  }
  r.loss = loss.item<double>();
  r.targets = out.target_count;
  return r;
}

}  // namespace gradscope
