// Text as each of the report's formats needs it written: HTML, Markdown table cells, CSV,
// gnuplot strings and data files, and base64 for inlined images.
#pragma once

#include <string>
#include <vector>

namespace gradscope {

// &, <, > and " as entities.
std::string html_escape(const std::string& s);
// '|' escaped, for a Markdown table cell.
std::string markdown_escape(const std::string& s);

// A CSV field, quoted when it holds a comma, a quote or a newline (RFC 4180).
std::string csv_quote(const std::string& s);
// The fields as one CSV line, newline included.
std::string csv_row(const std::vector<std::string>& cells);
// A number for a CSV file: shortest round-trip text, empty (not measured) for NaN.
std::string csv_number(double v);

// A gnuplot single-quoted string ('' is a quote inside one).
std::string gnuplot_string(const std::string& s);
// A number for a gnuplot data file: 6 significant digits, "NaN" (gnuplot's missing) for NaN.
std::string gnuplot_number(double v);

std::string base64(const std::string& bytes);

}  // namespace gradscope
