#include "gradscope/core/json_input.h"

#include <set>

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// Finds the first key repeated within one object.
class RepeatedKeyFinder : public nlohmann::json_sax<nlohmann::json> {
 public:
  // The keys that lead to the repeated one, outermost first; the repeated key last.
  const std::vector<std::string>& repeated() const { return repeated_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    current_.emplace_back();
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    current_.pop_back();
    return true;
  }
  // An array's elements have no key: an object in it starts afresh.
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool key(string_t& key) override {
    current_.back() = key;
    if (keys_.back().insert(key).second) return true;
    repeated_ = current_;
    return false;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  std::vector<std::set<std::string>> keys_;  // the keys so far of each open object
  std::vector<std::string> current_;         // the current key of each open object
  std::vector<std::string> repeated_;
};

std::string cut(const std::string& key) {
  return key.size() > 100 ? key.substr(0, 97) + "..." : key;
}

}  // namespace

std::vector<std::string> repeated_json_key(std::string_view text) {
  RepeatedKeyFinder finder;
  nlohmann::json::sax_parse(text.begin(), text.end(), &finder);
  return finder.repeated();
}

std::string repeated_key_problem(std::string_view text) {
  const std::vector<std::string> keys = repeated_json_key(text);
  if (keys.empty()) return "";
  std::string where;
  for (size_t i = 0; i + 1 < keys.size(); ++i) where += (i ? "." : "") + cut(keys[i]);
  return fmt::format("key '{}' appears twice{}", cut(keys.back()),
                     where.empty() ? "" : " in '" + where + "'");
}

nlohmann::json parse_json_input_unique(std::string_view text, const std::string& what,
                                       const std::string& hint, int max_depth) {
  nlohmann::json value = parse_json_input(text, what, hint, max_depth);
  const std::string repeated = repeated_key_problem(text);
  if (!repeated.empty())
    fail_usage(fmt::format("{}: {}", what, repeated),
               "a JSON object names each key once (a reader would keep one of the two values): "
               "remove the one that is wrong");
  return value;
}

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
