// The optimizer registry. Each entry builds a torch::optim::Optimizer from the parameters
// (with their names in the model, where known), the learning rate, weight decay and
// `--opt NAME=VALUE` settings under PyTorch's names.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/registry.h"
#include "gradscope/optim/memory_rule.h"
#include "gradscope/optim/opt_reader.h"

namespace gradscope {

// What an optimizer may know of its parameters besides the tensors, for those that treat
// parameters by their role (galore and muon pick the blocks' matrices by name; adam-mini
// partitions attention projections by head). Each vector is empty when unknown, or holds one
// entry per parameter.
struct ParamInfo {
  // names[i]: the name of params[i] in the model, as torch::nn::Module::named_parameters()
  // gives it (e.g. "layers.0.self_attn.q_proj.weight").
  std::vector<std::string> names;
  // head_sizes[i]: for the weight or bias of an attention's query, key or value projection,
  // the rows per head (HS), so that its rows split into heads of HS rows each; 0 for others.
  std::vector<int64_t> head_sizes;
};

// An optimizer's registry entry: how to build it and what it supports. Each optimizer's own
// file provides its entry (e.g. lion_entry() in lion.cpp; PyTorch's own in torch_optimizers.cpp)
// and optimizer_registry() adds it in one line. Code outside optim/ asks the entry, never the
// optimizer's name, what the optimizer can do.
struct OptimizerEntry {
  // Builds the optimizer; throws a usage error naming a bad or unknown setting.
  std::unique_ptr<torch::optim::Optimizer> (*make)(std::vector<torch::Tensor> params,
                                                   const ParamInfo& info, double lr,
                                                   double weight_decay,
                                                   const OptSettings& opt) = nullptr;
  double default_lr = 0;          // used when --lr is not given and lr_by_model has no entry
  std::vector<std::string> keys;  // the --opt names it accepts
  // Default learning rates of model families (registry names) where default_lr is not right.
  std::map<std::string, double> lr_by_model;

  // ---- how the training step may drive it ----
  // Whether step() evaluates the loss itself through a closure (a line search): the training
  // loop then hands it a closure that computes the step's gradients instead of computing them
  // first (as LBFGS is driven in PyTorch).
  bool steps_with_closure = false;
  // Whether it may step inside backward, one parameter at a time as each gradient completes
  // (--optimizer-step in-backward, the fused strategy): its update of a parameter reads that
  // parameter's gradient and state alone.
  bool steps_in_backward = false;
  // Whether that step inside backward gives the same bits as its step after backward (on the
  // CPU): the same arithmetic in the same order, so `gradscope verify` compares them bitwise.
  bool same_bits_in_backward = false;
  // Whether its state can take each micro-batch's gradient as it completes, so that
  // accumulation needs no gradient buffer (accumulation+fused; micro_batch_fold.h says how).
  bool folds_micro_batches = false;
  // When only some settings fold (fold_refusal says which, from the built optimizer): what to
  // pass so that it does, for the refusal's hint; null when every setting folds or none does.
  const char* fold_hint = nullptr;
  // Whether its update is elementwise over the parameters' elements, so that a rank can update
  // any slice of the flat parameters alone (--shard zero1, zero2, fsdp). Those that need whole
  // matrices, blocks or sums over every parameter are refused there.
  bool elementwise = false;
  // Whether it picks the blocks' weight matrices by name for its own update and gives every
  // other parameter AdamW (galore, apollo, muon): with LoRA no such matrix trains, so it would
  // be AdamW alone and the run is refused.
  bool updates_block_matrices = false;

  // ---- `gradscope estimate` ----
  // Its memory rule (memory_rule.h); null only with a reason in no_memory_model.
  MemoryRule memory = nullptr;
  // Why it has no memory rule (the estimate's error says it); null when it has one.
  const char* no_memory_model = nullptr;
  // Whether `gradscope estimate` lists it among the alternatives it compares: optimizers
  // whose memory follows from the parameters' sizes at default settings.
  bool compared_in_estimate = false;
  // The optimizer that keeps this one's update rule with its state in 8 bits (adam: adam8bit,
  // whose weight decay is Adam's L2), offered when a run runs out of memory (train/fit_hint.h);
  // null when there is none.
  const char* eight_bit_state = nullptr;
};

// The default learning rates of the toy problems (start about 1 from their minimum, curvature
// up to 1e3), which want other rates than the transformers: chosen from 500-step runs of each
// optimizer at 1e-4 .. 1 on both toys and both presets (docs/optimizers.md), stable on all four.
std::map<std::string, double> toy_learning_rates(double lr);

const Registry<OptimizerEntry>& optimizer_registry();

// The names of the registered optimizers whose entry has `capability`, in registry order.
std::vector<std::string> optimizers_where(bool (*capability)(const OptimizerEntry&));

// The learning rate `optimizer` uses on `model` when --lr is not given.
double default_lr(const std::string& optimizer, const std::string& model);

// An optimizer over parameters without names. galore, which picks the matrices it projects
// by name, refuses them (a runtime error): use the overload below.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt);

// An optimizer over named parameters: names[i] is the name of params[i] in the model, as
// torch::nn::Module::named_parameters() gives it (e.g. "layers.0.self_attn.q_proj.weight"),
// or `names` is empty when they are unknown. Optimizers that treat parameters by their role
// read them: galore projects the blocks' attention and MLP matrices only (galore.h).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        const std::vector<std::string>& names,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt);

// An optimizer over parameters with their names and attention head sizes (ParamInfo).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        const ParamInfo& info, double lr,
                                                        double weight_decay,
                                                        const OptSettings& opt);

// The learning rate of every parameter group (for schedules).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Parses "NAME=VALUE" into settings; a usage error when it is malformed.
void parse_opt_setting(const std::string& text, OptSettings& into);

}  // namespace gradscope
