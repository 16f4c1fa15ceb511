#include "gradscope/report/format.h"

#include <cmath>

#include <fmt/format.h>

namespace gradscope {

std::string format_ratio(double r) {
  if (!std::isfinite(r)) return "n/a";
  return r >= 100  ? fmt::format("{:.0f}x", r)
         : r >= 10 ? fmt::format("{:.1f}x", r)
                   : fmt::format("{:.2f}x", r);
}

std::string format_interval(const Interval& i, const char* spec) {
  if (i.n == 0 || !std::isfinite(i.mean)) return "n/a";
  std::string text = fmt::format(fmt::runtime(spec), i.mean);
  if (i.has_interval()) text += " ± " + fmt::format(fmt::runtime(spec), i.half_width);
  return text;
}

std::string format_joules(double joules) {
  if (!std::isfinite(joules)) return "n/a";
  return joules >= 3.6e6 ? fmt::format("{:.2f} kWh", joules / 3.6e6)
         : joules >= 1e3 ? fmt::format("{:.2f} kJ", joules / 1e3)
                         : fmt::format("{:.3g} J", joules);
}

std::string format_count(double x) { return fmt::format("{:.0f}", x); }

}  // namespace gradscope
