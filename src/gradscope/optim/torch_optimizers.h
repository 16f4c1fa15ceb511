// PyTorch's own optimizers (torch::optim): SGD, Adam, AdamW and Adagrad, built from the run's
// settings under PyTorch's names, with what each supports (factory.h).
#pragma once

namespace gradscope {

struct OptimizerEntry;

OptimizerEntry sgd_entry();
OptimizerEntry adam_entry();
OptimizerEntry adamw_entry();
OptimizerEntry adagrad_entry();

}  // namespace gradscope
