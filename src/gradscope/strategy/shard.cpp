// Data-parallel and ZeRO steps over a communicator (shard.h), on the flat parameter space
// and the gradient buckets of shard_parts.h; fsdp is in fsdp.cpp.
#include "gradscope/strategy/shard.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/strategy/shard_parts.h"

namespace gradscope {
namespace {

using shard_parts::BufferTally;
using shard_parts::bytes_of;
using shard_parts::clip_scale;
using shard_parts::FlatLayout;
using shard_parts::global_norm;
using shard_parts::GradientReducer;
using shard_parts::ZeroPart;

// ddp: the after-backward updater over gradients reduced in buckets.
class DdpUpdater : public Updater {
 public:
  DdpUpdater(const StepPlan& plan, const std::vector<torch::Tensor>& params,
             const OptimizerSpec& spec, const UpdaterOptions& options,
             std::shared_ptr<Communicator> comm, int64_t bucket_bytes)
      : comm_(std::move(comm)),
        layout_(params, comm_->rank(), comm_->world()),
        reducer_(params, layout_, *comm_, bucket_bytes, true, figures_, buffers_) {
    StepPlan after = plan;
    after.optimizer_step = OptimizerStep::kAfterBackward;
    inner_ = make_updater(after, params, spec, options);
    figures_.flat_elements = layout_.total();
    figures_.shard_elements = layout_.total();
  }

  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r = inner_->step(
        [&] {
          StepOutput out = gradients();
          observer.enter(Phase::kComm);
          reducer_.finish();
          return out;
        },
        observer);
    figures_.buffer_peak_bytes = buffers_.peak;
    return r;
  }
  void set_learning_rate(double lr) override { inner_->set_learning_rate(lr); }
  int64_t state_bytes() const override { return inner_->state_bytes(); }
  std::vector<torch::Tensor> state_tensors() const override { return inner_->state_tensors(); }
  std::optional<int64_t> grads_bytes() const override { return inner_->grads_bytes(); }
  MicroBatchListener* micro_batch_listener() override { return &reducer_; }
  void save(torch::serialize::OutputArchive& archive) const override { inner_->save(archive); }
  void load(torch::serialize::InputArchive& archive) override { inner_->load(archive); }
  const ShardFigures& figures() const { return figures_; }

 private:
  std::shared_ptr<Communicator> comm_;
  ShardFigures figures_;
  BufferTally buffers_;
  FlatLayout layout_;
  GradientReducer reducer_;
  std::unique_ptr<Updater> inner_;
};

class ZeroUpdater : public Updater {
 public:
  ZeroUpdater(Shard shard, const std::vector<torch::Tensor>& params, const OptimizerSpec& spec,
              const UpdaterOptions& options, std::shared_ptr<Communicator> comm,
              int64_t bucket_bytes)
      : options_(options),
        comm_(std::move(comm)),
        part_(shard == Shard::kZero1, params, spec.param_names, spec.param_head_sizes, spec,
              *comm_, bucket_bytes, figures_, buffers_) {
    figures_.flat_elements = part_.layout().total();
    figures_.shard_elements = part_.layout().shard();
  }

  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r;
    r.out = gradients();
    r.evaluations = 1;
    observer.enter(Phase::kComm);
    const double squares = part_.reduce();
    observer.enter(Phase::kOptimizer);
    if (options_.clip_grad_norm > 0 || options_.log_grad_norm) {
      // Every rank takes only its shard's squares, so the sum counts each entry once.
      r.grad_norm = global_norm(*comm_, squares);
      const double scale = clip_scale(options_, r.grad_norm);
      if (scale < 1) part_.scale_grads(scale);
    }
    part_.update();
    observer.enter(Phase::kComm);
    part_.gather_parameters();
    figures_.buffer_peak_bytes = buffers_.peak;
    return r;
  }

  void set_learning_rate(double lr) override {
    gradscope::set_learning_rate(part_.optimizer(), lr);
  }
  int64_t state_bytes() const override { return optimizer_state_bytes(part_.optimizer()); }
  std::vector<torch::Tensor> state_tensors() const override {
    return optimizer_state_tensors(part_.optimizer());
  }
  std::optional<int64_t> grads_bytes() const override { return part_.grads_bytes(); }
  MicroBatchListener* micro_batch_listener() override { return &part_.reducer(); }
  void save(torch::serialize::OutputArchive& archive) const override {
    part_.optimizer().save(archive);
  }
  void load(torch::serialize::InputArchive& archive) override { part_.optimizer().load(archive); }
  const ShardFigures& figures() const { return figures_; }

 private:
  UpdaterOptions options_;
  std::shared_ptr<Communicator> comm_;
  ShardFigures figures_;
  BufferTally buffers_;
  ZeroPart part_;
};

}  // namespace

const std::vector<std::string>& elementwise_optimizers() {
  static const std::vector<std::string> names =
      optimizers_where([](const OptimizerEntry& e) { return e.elementwise; });
  return names;
}

std::string shard_refusal(Shard shard, const std::string& optimizer) {
  if (shard == Shard::kNone || shard == Shard::kDdp) return "";
  const auto& registry = optimizer_registry();
  if (registry.contains(optimizer) && registry.get(optimizer).elementwise) return "";
  return fmt::format(
      "--shard {} gives each rank a slice of the flat parameters, and optimizer '{}' needs "
      "whole matrices, blocks or sums over every parameter, which no rank holds",
      shard_name(shard), optimizer);
}

void check_shard(const StepPlan& plan, Shard shard, const std::string& optimizer) {
  if (shard == Shard::kNone) return;
  check_usage(plan.optimizer_step == OptimizerStep::kAfterBackward,
              fmt::format("--shard {} reduces gradients across ranks before the optimizer steps; "
                          "the optimizer cannot step inside backward",
                          shard_name(shard)),
              "leave --optimizer-step in-backward (and --strategy fused) out with --shard");
  const std::string refusal = shard_refusal(shard, optimizer);
  std::string list;
  for (const auto& n : elementwise_optimizers()) list += (list.empty() ? "" : ", ") + n;
  check_usage(refusal.empty(), refusal,
              "use --shard ddp with " + optimizer + ", or one of " + list + " with --shard " +
                  shard_name(shard));
  check_usage(shard == Shard::kDdp || !optimizer_registry().get(optimizer).steps_with_closure,
              "optimizer '" + optimizer + "' runs a line search over every parameter",
              "use --shard ddp with it");
}

std::unique_ptr<Updater> make_sharded_updater(const StepPlan& plan, Shard shard,
                                              const std::vector<torch::Tensor>& params,
                                              const OptimizerSpec& optimizer,
                                              const UpdaterOptions& options,
                                              std::shared_ptr<Communicator> comm,
                                              int64_t bucket_bytes, Model* model,
                                              GradReduce grad_reduce) {
  check_shard(plan, shard, optimizer.name);
  check_usage(shard != Shard::kFsdp || model != nullptr,
              "--shard fsdp needs the model, whose blocks it gathers");
  check_usage(shard == Shard::kFsdp || grad_reduce == GradReduce::kAllReduce,
              "--grad-reduce reduce-scatter applies to --shard fsdp only");
  if (shard == Shard::kFsdp)
    return shard_parts::make_fsdp_updater(*model, params, optimizer, options, std::move(comm),
                                          bucket_bytes, grad_reduce);
  if (shard == Shard::kDdp)
    return std::make_unique<DdpUpdater>(plan, params, optimizer, options, std::move(comm),
                                        bucket_bytes);
  check_usage(shard == Shard::kZero1 || shard == Shard::kZero2,
              fmt::format("--shard {} is not an optimizer step", shard_name(shard)));
  return std::make_unique<ZeroUpdater>(shard, params, optimizer, options, std::move(comm),
                                       bucket_bytes);
}

const ShardFigures* shard_figures(const Updater& updater) {
  if (const auto* f = shard_parts::fsdp_figures(updater)) return f;
  if (const auto* d = dynamic_cast<const DdpUpdater*>(&updater)) return &d->figures();
  if (const auto* z = dynamic_cast<const ZeroUpdater*>(&updater)) return &z->figures();
  return nullptr;
}

}  // namespace gradscope