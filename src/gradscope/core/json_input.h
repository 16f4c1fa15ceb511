// JSON that comes from outside (run records, tokenizer files, data manifests, stored rows).
// nlohmann's parser keeps its own stack, but dump(), comparison and a recursive reader walk
// a value by recursion, so a file of a million '[' would overflow the stack after it parsed.
// Text is therefore checked for depth before it is parsed, and every failure is a usage error
// (exit 2) that names where the text came from.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradscope {

// Deeper than any file gradscope reads or writes (a run record nests 5 levels, a Hugging
// Face tokenizer.json 6), far below what recursion over the value can survive.
inline constexpr int kMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in `text` (strings skipped), or -1 when it goes
// past max_depth: the scan stops there.
int json_depth(std::string_view text, int max_depth = kMaxJsonDepth);

// `text` parsed; nullopt with the reason in *why when it is not JSON or nests too deep.
std::optional<nlohmann::json> try_parse_json(std::string_view text, std::string* why,
                                             int max_depth = kMaxJsonDepth);

// `text` parsed; a usage error "WHAT is not ..." otherwise, with `hint`.
nlohmann::json parse_json_input(std::string_view text, const std::string& what,
                                const std::string& hint = "", int max_depth = kMaxJsonDepth);

// The keys that lead to the first key repeated within one object of `text` (already known to
// be JSON), outermost first and the repeated key last; empty when no key repeats. A parser
// keeps one of two equal keys silently, so a repeated key would hide a value.
std::vector<std::string> repeated_json_key(std::string_view text);

// "key 'K' appears twice" (" in 'A.B'" for a nested object) for the first key repeated within
// one object of `text`, keys cut at 100 characters; empty when no key repeats.
std::string repeated_key_problem(std::string_view text);

// parse_json_input, and a usage error "WHAT: key 'K' appears twice ..." as well when a key
// repeats within one object.
nlohmann::json parse_json_input_unique(std::string_view text, const std::string& what,
                                       const std::string& hint = "",
                                       int max_depth = kMaxJsonDepth);

// A short description of a value for a message: scalars as JSON text (at most 60
// characters), arrays and objects by their size, so a large value is never printed whole.
std::string json_preview(const nlohmann::json& value);

}  // namespace gradscope
