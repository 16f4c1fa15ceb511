// Text as each of the report's formats needs it written: HTML, Markdown table cells, CSV,
// gnuplot strings and data files, and base64 for inlined images.
#pragma once

#include <string>
#include <vector>

namespace gradscope {

// &, <, >, " and ' as entities: safe in text and in quoted attribute values.
std::string html_escape(const std::string& s);
// Text for Markdown, in a table cell or a line: '|' and a '<' that would open raw HTML are
// backslash-escaped, and line breaks and other control characters become spaces.
std::string markdown_escape(const std::string& s);

// A name for a file or an HTML id made from text that may come from a record: lower-case
// letters, digits, '_' and '-' are kept (the first 64), anything else becomes '-'. When
// anything was changed (or the text is empty) '.' and a 64-bit hash of the whole text follow,
// so a kept name never equals a changed one. The study's model names are their own slugs.
std::string file_slug(const std::string& s);

// A CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180). Text that a
// spreadsheet would run as a formula (starting with = + - @, a tab or a carriage return, and
// not a number) gets a leading apostrophe.
std::string csv_quote(const std::string& s);
// The fields as one CSV line, newline included.
std::string csv_row(const std::vector<std::string>& cells);
// A number for a CSV file: shortest round-trip text, empty (not measured) for NaN.
std::string csv_number(double v);

// A gnuplot single-quoted string ('' is a quote inside one; gnuplot substitutes nothing in
// it). Control characters become spaces: a line break would end the command.
std::string gnuplot_string(const std::string& s);
// A text field of a gnuplot data file (tab-separated): tabs, line breaks and other control
// characters become spaces, '"' (which would open a quoted field) becomes '\'', and a '#'
// that would start the line (making it a comment) becomes '?'.
std::string gnuplot_datum(const std::string& s);
// A number for a gnuplot data file: 6 significant digits, "NaN" (gnuplot's missing) for NaN.
std::string gnuplot_number(double v);

std::string base64(const std::string& bytes);

}  // namespace gradscope
