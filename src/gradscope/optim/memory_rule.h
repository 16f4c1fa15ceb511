// An optimizer's memory rule: the bytes of its state and of the temporaries of one update,
// from its update rule as gradscope and LibTorch implement it (`gradscope estimate`). Each
// optimizer's registry entry holds its rule (factory.h); the estimate describes the run's
// trainable parameters to it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/optim/opt_reader.h"

namespace gradscope {

// Bytes of one float32 element: the parameters' and the optimizer's dtype.
constexpr int64_t kOptimizerFloatBytes = 4;

// One trainable parameter (or, under sharding, one rank's piece of it) as the rule sees it.
struct ParamExtent {
  int64_t bytes = 0;
  int64_t rows = 1;  // the first dimension (1 for a piece of the flat parameters)
  int64_t cols = 0;  // the elements of a row (0 when unknown)
  // One of the blocks' weight matrices (attention and MLP projections): those that galore,
  // apollo and muon update their own way.
  bool block_matrix = false;
};

// Optimizer state, kept between steps, and the temporaries of one update.
struct OptimizerMemory {
  int64_t state = 0;
  int64_t scratch = 0;
  // With accumulation inside backward (micro_batch_fold.h), the temporaries of the update
  // after the folded micro-batches, where that update is not the optimizer's own step; unset:
  // `scratch`.
  std::optional<int64_t> fold_scratch;
};

// What a memory rule reads: the parameters, the run's --opt settings and its weight decay.
class MemoryRuleInput {
 public:
  MemoryRuleInput(std::vector<ParamExtent> params, const OptSettings& opt, double weight_decay);
  const std::vector<ParamExtent>& params() const { return params_; }
  int64_t total() const { return total_; }                    // every parameter's bytes
  int64_t largest() const { return largest_; }                // the largest parameter's
  int64_t largest_matrix() const { return largest_matrix_; }  // of the block matrices
  // Weight decay added to the gradient (grad.add(p, wd)) makes one parameter-sized copy: the
  // largest parameter's bytes when the run decays, else 0.
  int64_t decay() const { return weight_decay_ > 0 ? largest_ : 0; }
  // A setting as a number (true 1, false 0), or `fallback` when absent or unreadable: the run
  // itself refuses a bad value, the estimate models the default.
  double setting(const std::string& key, double fallback) const;

 private:
  std::vector<ParamExtent> params_;
  const OptSettings& opt_;
  double weight_decay_;
  int64_t total_ = 0, largest_ = 0, largest_matrix_ = 0;
};

using MemoryRule = OptimizerMemory (*)(const MemoryRuleInput& in);

// The rule galore and apollo share: Adam's moments in a rank-r space for the blocks' (m, n)
// matrices (r = `rank`, or max(1, min(m, n) / 4) when below 1), AdamW's for the rest; galore
// also keeps its projector (min(m, n) x r), apollo draws its projection again each step and
// keeps one float for its norm limiter.
OptimizerMemory projected_moments_memory(const MemoryRuleInput& in, double rank,
                                         bool keeps_projector);

}  // namespace gradscope
