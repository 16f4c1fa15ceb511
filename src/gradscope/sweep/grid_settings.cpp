// The [sweep] table (how a sweep is run) and the [slurm] table (what a cluster job asks for)
// of a sweep file, and the forms Slurm takes for the latter's values.
#include "gradscope/sweep/grid_detail.h"

#include <fmt/format.h>

#include <cmath>
#include <regex>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"

namespace gradscope {

namespace grid_detail {

SweepSettings read_sweep_settings(const std::string& file, const toml::node& node) {
  SweepSettings s;
  const auto& table =
      expect_table(file, "[sweep]", node, "write [sweep] followed by jobs, run_timeout, ...");
  const std::string valid = "valid keys in [sweep]: jobs, run_timeout, memory_limit, db";
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string at = where(file, region_of(key, value));
    const std::string vat = where(file, value.source());
    if (name == "jobs") {
      check_usage(value.is_integer() && value.as_integer()->get() >= 1,
                  fmt::format("{}: 'jobs' in [sweep] must be an integer >= 1, not {}", vat,
                              describe(value)),
                  "write e.g. jobs = 2");
      s.jobs = value.as_integer()->get();
    } else if (name == "run_timeout") {
      const double seconds = value.value<double>().value_or(0);
      check_usage(
          value.is_number() && std::isfinite(seconds) && seconds > 0,
          fmt::format("{}: 'run_timeout' in [sweep] must be a number of seconds > 0, not {}", vat,
                      describe(value)),
          "write e.g. run_timeout = 600");
      s.run_timeout_s = seconds;
    } else if (name == "memory_limit") {
      const std::string hint = "write e.g. memory_limit = \"4GiB\" or memory_limit = 1000000";
      if (value.is_integer()) {
        check_usage(value.as_integer()->get() > 0,
                    fmt::format("{}: 'memory_limit' in [sweep] must be a positive byte count, "
                                "not {}",
                                vat, describe(value)),
                    hint);
        s.memory_limit_bytes = value.as_integer()->get();
      } else if (value.is_string()) {
        try {
          s.memory_limit_bytes = parse_bytes(std::string(value.as_string()->get()));
        } catch (const Error& e) {
          fail_usage(fmt::format("{}: 'memory_limit' in [sweep]: {}", vat, e.what()), e.hint());
        }
      } else {
        fail_usage(fmt::format("{}: 'memory_limit' in [sweep] must be a byte size, not {}", vat,
                               describe(value)),
                   hint);
      }
    } else if (name == "db") {
      check_usage(value.is_string() && !value.as_string()->get().empty(),
                  fmt::format("{}: 'db' in [sweep] must be a file path (text), not {}", vat,
                              describe(value)),
                  "write e.g. db = \"results/sweep.db\"");
      s.db = value.as_string()->get();
    } else {
      fail_usage(fmt::format("{}: unknown key '{}' in [sweep]", at, name),
                 is_run_key_or_table(name)
                     ? valid + "; run keys go under [fixed] or [axes]"
                     : valid);
    }
  }
  return s;
}

SlurmSettings read_slurm_settings(const std::string& file, const toml::node& node) {
  SlurmSettings s;
  const auto& table = expect_table(file, "[slurm]", node,
                                   "write [slurm] followed by partition, account, time, ...");
  const std::string valid =
      "valid keys in [slurm]: partition, account, time, mem, gpus_per_task, cpus_per_task";
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string vat = where(file, value.source());
    if (name == "cpus_per_task") {
      check_usage(value.is_integer() && value.as_integer()->get() >= 1,
                  fmt::format("{}: 'cpus_per_task' in [slurm] must be an integer >= 1, not {}", vat,
                              describe(value)),
                  "write e.g. cpus_per_task = 8");
      s.cpus_per_task = value.as_integer()->get();
      continue;
    }
    std::string* target = name == "partition"       ? &s.partition
                          : name == "account"       ? &s.account
                          : name == "time"          ? &s.time
                          : name == "mem"           ? &s.mem
                          : name == "gpus_per_task" ? &s.gpus_per_task
                                                    : nullptr;
    check_usage(
        target != nullptr,
        fmt::format("{}: unknown key '{}' in [slurm]", where(file, region_of(key, value)), name),
        valid);
    std::string text;
    if (value.is_string())
      text = value.as_string()->get();
    else if (value.is_integer() && (name == "time" || name == "gpus_per_task" || name == "mem"))
      text = std::to_string(value.as_integer()->get());
    else
      fail_usage(
          fmt::format("{}: '{}' in [slurm] must be text, not {}", vat, name, describe(value)),
          "write e.g. partition = \"gpu\", time = \"02:00:00\"");
    try {
      check_slurm_setting(name, text);
    } catch (const Error& e) {
      fail_usage(fmt::format("{}: {}", vat, e.what()), e.hint());
    }
    *target = text;
  }
  return s;
}

}  // namespace grid_detail

void check_slurm_setting(const std::string& key, const std::string& value) {
  // Each form is a whole-text match over letters, digits and . _ - : , alone: nothing in it
  // is a quote, a space, a '$', a '%' (an sbatch file pattern) or a line break.
  struct Form {
    const char* key;
    const char* pattern;
    const char* example;
  };
  static const Form forms[] = {
      {"partition", "[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*", "gpu, or gpu,cpu"},
      {"account", "[A-Za-z0-9_.-]+", "proj-123"},
      {"time", "[0-9]+(-[0-9]+)?(:[0-9]+){0,2}|UNLIMITED|unlimited",
       "90 (minutes), 02:00:00, 1-12:00:00"},
      {"mem", "[0-9]+[KMGT]?", "16G, 16000M"},
      {"gpus_per_task", "([A-Za-z0-9_.-]+:)?[0-9]+", "1, or a100:1"},
  };
  for (const Form& f : forms) {
    if (key != f.key) continue;
    const bool ok = value.size() <= 128 && std::regex_match(value, std::regex(f.pattern));
    check_usage(
        ok, fmt::format("slurm {} '{}' is not of the form Slurm takes", key, terminal_text(value)),
        fmt::format("write e.g. {}; letters, digits and . _ - : , alone", f.example));
    return;
  }
  fail_runtime("check_slurm_setting: no form for '" + key + "'");
}

}  // namespace gradscope
