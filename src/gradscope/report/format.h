// How the report writes its figures as text, the same in findings, tables and captions.
#pragma once

#include <string>

#include "gradscope/core/statistics.h"

namespace gradscope {

// "1.23x", "12.3x", "123x"; "n/a" when not finite.
std::string format_ratio(double r);
// "0.1234 ± 0.0100" (the half-width only with an interval); "n/a" for no value.
std::string format_interval(const Interval& i, const char* spec = "{:.4f}");
// "12.3 J", "4.56 kJ", "1.23 kWh"; "n/a" when not finite.
std::string format_joules(double joules);
// A sample or step count: "336".
std::string format_count(double x);

}  // namespace gradscope
