#include "gradscope/core/json_input.h"

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {

int json_depth(std::string_view text, int max_depth) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character, a quote included
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return -1;
      if (depth > deepest) deepest = depth;
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to refuse
    }
  }
  return deepest;
}

std::optional<nlohmann::json> try_parse_json(std::string_view text, std::string* why,
                                             int max_depth) {
  if (json_depth(text, max_depth) < 0) {
    if (why) *why = fmt::format("it nests arrays and objects deeper than {} levels", max_depth);
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the token it stopped at, which can be as long as the input.
    std::string message = e.what();
    if (message.size() > 200) message = message.substr(0, 197) + "...";
    if (why) *why = fmt::format("it is not valid JSON: {}", message);
    return std::nullopt;
  }
}

nlohmann::json parse_json_input(std::string_view text, const std::string& what,
                                const std::string& hint, int max_depth) {
  std::string why;
  std::optional<nlohmann::json> value = try_parse_json(text, &why, max_depth);
  if (!value) fail_usage(fmt::format("{}: {}", what, why), hint);
  return std::move(*value);
}

std::string json_preview(const nlohmann::json& value) {
  if (value.is_array()) return fmt::format("an array of {}", value.size());
  if (value.is_object()) return fmt::format("an object of {} keys", value.size());
  std::string shown = value.dump();
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  return shown;
}

}  // namespace gradscope
