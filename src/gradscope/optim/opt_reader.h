// Reading an optimizer's --opt settings: typed values under PyTorch's names, unknown names and
// bad values refused as usage errors naming them, and the checks every optimizer's builder
// shares. Each optimizer's builder (factory.cpp and the optimizers' own files) uses these.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "gradscope/core/error.h"

namespace gradscope {

using OptSettings = std::map<std::string, std::string>;

// Reads typed values out of --opt settings, refusing unknown names and bad values.
class OptReader {
 public:
  OptReader(const std::string& optimizer, const OptSettings& opt,
            const std::vector<std::string>& keys)
      : optimizer_(optimizer), opt_(opt) {
    std::set<std::string> valid(keys.begin(), keys.end());
    for (const auto& [name, value] : opt_) {
      if (!valid.count(name)) {
        std::string list;
        for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
        fail_usage("optimizer '" + optimizer_ + "' has no setting '" + name + "'",
                   "settings of " + optimizer_ + ": " + (list.empty() ? "none" : list));
      }
    }
  }

  double number(const std::string& name, double fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    return parse(name, it->second);
  }

  bool flag(const std::string& name, bool fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    const std::string& v = it->second;
    if (v == "true" || v == "1" || v == "yes") return true;
    if (v == "false" || v == "0" || v == "no") return false;
    fail_usage(optimizer_ + " setting " + name + "=" + v + " is not a boolean",
               "write " + name + "=true or " + name + "=false");
  }

  // A number, or nullopt when the setting is absent (an optional hyperparameter).
  std::optional<double> maybe_number(const std::string& name) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return std::nullopt;
    return parse(name, it->second);
  }

  // A whole number (written without a fraction).
  int64_t integer(const std::string& name, int64_t fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    const double v = parse(name, it->second);
    if (v != std::floor(v) || std::abs(v) > 9.0e15)
      fail_usage(optimizer_ + " setting " + name + "=" + it->second + " is not a whole number",
                 "write a whole number, e.g. " + name + "=10");
    return static_cast<int64_t>(v);
  }

  // One of `valid`.
  std::string choice(const std::string& name, const std::string& fallback,
                     const std::vector<std::string>& valid) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    std::string list;
    for (const auto& v : valid) {
      if (v == it->second) return v;
      list += (list.empty() ? "" : ", ") + v;
    }
    fail_usage("unknown " + optimizer_ + " " + name + " '" + it->second + "'",
               "valid values of " + name + ": " + list);
  }

  // Comma-separated names, each of letters, digits and '_' (module names).
  std::vector<std::string> names(const std::string& name,
                                 const std::vector<std::string>& fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    std::vector<std::string> out;
    const std::string& text = it->second;
    for (size_t start = 0;;) {
      const size_t comma = text.find(',', start);
      const std::string item = text.substr(start, comma - start);
      const bool plain = !item.empty() && std::all_of(item.begin(), item.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      });
      if (!plain)
        fail_usage(optimizer_ + " setting " + name + "=" + text + " is not a list of names",
                   "write names of letters, digits and '_' separated by commas, e.g. " + name +
                       "=q_proj,v_proj");
      out.push_back(item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }

  std::pair<double, double> pair(const std::string& name,
                                 std::pair<double, double> fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    auto comma = it->second.find(',');
    if (comma == std::string::npos)
      fail_usage(optimizer_ + " setting " + name + "=" + it->second + " needs two values",
                 "write " + name + "=0.9,0.999");
    return {parse(name, it->second.substr(0, comma)), parse(name, it->second.substr(comma + 1))};
  }

 private:
  double parse(const std::string& name, const std::string& text) const {
    size_t pos = 0;
    double v = 0;
    try {
      v = std::stod(text, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != text.size() || !std::isfinite(v))
      fail_usage(optimizer_ + " setting " + name + "=" + text + " is not a number",
                 "write a number, e.g. " + name + "=0.9");
    return v;
  }

  std::string optimizer_;
  const OptSettings& opt_;
};

inline void check_range(bool ok, const std::string& what) {
  check_usage(ok, "invalid optimizer setting: " + what,
              "see `gradscope list` for each optimizer's settings");
}

// Builds an optimizer whose constructor checks its hyperparameters with TORCH_CHECK: a value
// the factory let through but the constructor refuses is still the user's to fix (exit 2).
template <typename Optimizer, typename Options, typename Params>
std::unique_ptr<torch::optim::Optimizer> construct_optimizer(const std::string& name, Params params,
                                                             const Options& options) {
  try {
    return std::make_unique<Optimizer>(std::move(params), options);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    what = what.substr(0, what.find('\n'));
    fail_usage("invalid optimizer setting: " + name + ": " + what,
               "see `gradscope list` for each optimizer's settings");
  }
}

inline void check_betas(const std::string& optimizer, std::pair<double, double> betas) {
  check_range(
      betas.first >= 0 && betas.first < 1 && betas.second >= 0 && betas.second < 1,
      fmt::format("{} betas={},{} must lie in [0, 1)", optimizer, betas.first, betas.second));
}

}  // namespace gradscope
