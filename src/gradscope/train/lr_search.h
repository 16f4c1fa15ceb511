// --lr auto: a short learning-rate search before the run, so that optimizers are compared at
// a learning rate each has been given a fair chance to find, not at one guess.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gradscope/core/config.h"
#include "gradscope/core/record.h"
#include "gradscope/train/data_source.h"

namespace gradscope {

struct LrSearchResult {
  double best_lr = 0;
  std::vector<LrTrial> trials;  // in order
};

// The learning rates tried: `trials` values log-spaced over [center / 10^span,
// center * 10^span] (center alone when trials = 1). Throws a usage error for bad settings.
std::vector<double> lr_search_grid(double center, int64_t trials, double span_decades);

// Refuses bad --lr-search-* settings (a usage error), before anything runs.
void check_lr_search(const RunConfig& config);

// The data every trial of the search trains and evaluates on: the configuration's data
// source made for the search split (DataSplit::kLrSearch, data_source.h), carved
// from the training side and disjoint from the validation samples the run reports; the trials
// never see those. Loaded once, shared by the trials.
std::shared_ptr<const DataSource> lr_search_data(const RunConfig& config);

// Trains the configuration once per learning rate of the grid around the optimizer's default
// for the model, for config.lr_search_steps steps (0: a tenth of config.steps, at least 10)
// with no warm-up, on lr_search_data(config), and picks the lowest final loss on the search
// split among the trials that ended ok (ties go to the smaller rate). A trial's `val_loss` is
// that search-split loss. Trials are not written anywhere; `on_trial` sees each one.
// A runtime error when every trial failed.
LrSearchResult search_learning_rate(const RunConfig& config,
                                    const std::function<void(const LrTrial& trial, int64_t index,
                                                             int64_t total)>& on_trial = nullptr);

}  // namespace gradscope
