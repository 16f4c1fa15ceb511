#include "gradscope/train/lr_search.h"

#include <cmath>
#include <limits>

#include "gradscope/core/error.h"
#include "gradscope/models/registry.h"
#include "gradscope/train/session.h"
#include "gradscope/train/trainer.h"

namespace gradscope {
namespace {

// The centre of the search: the optimizer's default rate for the model.
double default_lr_of(RunConfig config) {
  config.lr = 0;
  return learning_rate_of(config);
}

}  // namespace

std::shared_ptr<const DataSource> lr_search_data(const RunConfig& config) {
  const ResolvedRun resolved = resolve_run(config);
  return make_data_source(model_registry().get(resolved.config.model), resolved.arch,
                          resolved.config, nullptr, DataSplit::kLrSearch);
}

std::vector<double> lr_search_grid(double center, int64_t trials, double span_decades) {
  check_usage(trials >= 1, fmt::format("--lr-search-trials {} must be at least 1", trials),
              "pass e.g. --lr-search-trials 5");
  check_usage(std::isfinite(span_decades) && span_decades >= 0,
              fmt::format("--lr-search-span {} must be >= 0", span_decades),
              "pass the decades either side of the default, e.g. --lr-search-span 1");
  check_usage(std::isfinite(center) && center > 0,
              fmt::format("the search's centre learning rate {} must be > 0", center),
              "pass a positive learning rate");
  std::vector<double> grid;
  for (int64_t i = 0; i < trials; ++i) {
    const double position = trials == 1
                                ? 0.0
                                : -span_decades + 2.0 * span_decades * static_cast<double>(i) /
                                                      static_cast<double>(trials - 1);
    grid.push_back(center * std::pow(10.0, position));
  }
  return grid;
}

void check_lr_search(const RunConfig& config) {
  check_usage(config.lr_search_steps >= 0,
              fmt::format("--lr-search-steps {} must be >= 0", config.lr_search_steps),
              "pass 0 for a tenth of --steps");
  lr_search_grid(default_lr_of(config), config.lr_search_trials, config.lr_search_span);
}

LrSearchResult search_learning_rate(
    const RunConfig& config,
    const std::function<void(const LrTrial&, int64_t, int64_t)>& on_trial) {
  check_lr_search(config);
  const int64_t steps = config.lr_search_steps > 0 ? config.lr_search_steps
                                                   : std::max<int64_t>(10, config.steps / 10);
  const auto grid =
      lr_search_grid(default_lr_of(config), config.lr_search_trials, config.lr_search_span);
  // The trials evaluate on the search split, never on the validation samples the run reports.
  SessionOptions options;
  options.data = lr_search_data(config);
  LrSearchResult result;
  double best_val = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < grid.size(); ++i) {
    RunConfig trial = config;
    trial.lr_auto = false;
    const RunConfig defaults;  // a trial is a plain run: the search's own settings go
    trial.lr_search_trials = defaults.lr_search_trials;
    trial.lr_search_steps = defaults.lr_search_steps;
    trial.lr_search_span = defaults.lr_search_span;
    trial.lr = grid[i];
    trial.steps = steps;
    trial.warmup_steps = 0;
    trial.eval_every = 0;
    trial.json_path.clear();
    trial.save_weights.clear();  // a trial's weights are not the run's
    trial.save_adapters = false;
    trial.save_state.clear();  // the run's training state is the run's alone
    trial.state_every = 0;
    trial.resume.clear();
    trial.quiet = true;
    Trainer trainer(trial, options);
    const RunRecord record = trainer.run();
    const LrTrial entry{grid[i],
                        steps,
                        record.final_loss,
                        record.final_val_loss,
                        status_name(record.status),
                        record.time ? record.time->wall_s : std::nullopt};
    if (record.ok() && entry.val_loss && *entry.val_loss < best_val) {
      best_val = *entry.val_loss;
      result.best_lr = grid[i];
    }
    result.trials.push_back(entry);
    if (on_trial) on_trial(entry, static_cast<int64_t>(i) + 1, static_cast<int64_t>(grid.size()));
  }
  if (result.best_lr == 0)
    fail_runtime(fmt::format("no trial of the learning-rate search ended ok ({} tried from {:.3g} "
                             "to {:.3g})",
                             grid.size(), grid.front(), grid.back()),
                 "pass --lr explicitly, or widen the search with --lr-search-span");
  return result;
}

}  // namespace gradscope
