// The documentation keeps up with the binary: every model, optimizer, strategy and command
// that `gradscope list` and `gradscope --help` name appears, as a whole word, in README.md or
// a page of docs/, and every relative link of those pages leads to a file of the repository
// (and to a heading of it, when the link names one). A name added to a registry without a
// word of documentation fails here, naming it. Runs the real binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace gradscope::docs_coverage {
namespace {

namespace fs = std::filesystem;

const fs::path kRepo = fs::path(GRADSCOPE_SOURCE_DIR);

// README.md and every Markdown page of docs/, by path.
std::map<fs::path, std::string> documentation() {
  std::map<fs::path, std::string> pages;
  pages[kRepo / "README.md"] = testing::slurp((kRepo / "README.md").string());
  for (const auto& entry : fs::recursive_directory_iterator(kRepo / "docs")) {
    if (entry.is_regular_file() && entry.path().extension() == ".md") {
      pages[entry.path()] = testing::slurp(entry.path().string());
    }
  }
  return pages;
}

// Characters that continue a name: `adam` inside `adam-mini`, or `checkpoint` inside
// `checkpoint+accumulation`, is not the name `adam` or `checkpoint` itself.
bool continues_name(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '+';
}

bool mentions_whole_word(const std::string& text, const std::string& name) {
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const size_t end = at + name.size();
    const bool starts = at == 0 || !continues_name(text[at - 1]);
    const bool ends = end == text.size() || !continues_name(text[end]);
    if (starts && ends) return true;
  }
  return false;
}

// The subcommands `gradscope --help` lists: the lines of its "Subcommands:" section that
// start with two spaces and a name.
std::vector<std::string> help_commands(const std::string& help) {
  std::vector<std::string> commands;
  std::istringstream lines(help);
  bool in_section = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Subcommands:", 0) == 0) {
      in_section = true;
      continue;
    }
    if (!in_section || line.size() < 3 || line.compare(0, 2, "  ") != 0 ||
        !std::islower(static_cast<unsigned char>(line[2]))) {
      continue;
    }
    size_t end = 2;
    while (end < line.size() && continues_name(line[end])) ++end;
    commands.push_back(line.substr(2, end - 2));
  }
  return commands;
}

// What GitHub makes of a heading for its anchor: lower case, spaces to `-`, every character
// but letters, digits, `-` and `_` dropped.
std::string heading_anchor(const std::string& heading) {
  std::string anchor;
  for (const char c : heading) {
    if (c == ' ') {
      anchor += '-';
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
      anchor += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return anchor;
}

// The anchors of a page's headings, code blocks skipped.
std::set<std::string> anchors_of(const std::string& page) {
  std::set<std::string> anchors;
  std::istringstream lines(page);
  bool in_code = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    if (in_code || line.empty() || line[0] != '#') continue;
    const size_t text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    anchors.insert(heading_anchor(line.substr(text + 1)));
  }
  return anchors;
}

// Every `](target)` of a page outside code blocks.
std::vector<std::string> link_targets(const std::string& page) {
  std::vector<std::string> targets;
  std::istringstream lines(page);
  bool in_code = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    if (in_code) continue;
    for (size_t at = line.find("]("); at != std::string::npos; at = line.find("](", at + 2)) {
      const size_t close = line.find(')', at + 2);
      if (close != std::string::npos) targets.push_back(line.substr(at + 2, close - at - 2));
    }
  }
  return targets;
}

TEST(DocsCoverage, EveryListedNameAndCommandAppearsInTheDocs) {
  const testing::CommandResult list = testing::run_gradscope("list --json");
  ASSERT_EQ(list.code, 0) << list.err;
  const testing::CommandResult help = testing::run_gradscope("--help");
  ASSERT_EQ(help.code, 0) << help.err;
  const nlohmann::json listed = nlohmann::json::parse(list.out);

  std::vector<std::pair<std::string, std::string>> names;  // (kind, name)
  for (const auto& [name, _] : listed.at("models").items()) names.emplace_back("model", name);
  for (const auto& [name, _] : listed.at("optimizers").items()) {
    names.emplace_back("optimizer", name);
  }
  for (const auto& [name, _] : listed.at("strategies").items()) {
    names.emplace_back("strategy", name);
  }
  const std::vector<std::string> commands = help_commands(help.out);
  for (const std::string& command : commands) names.emplace_back("command", command);
  // A change of either output's shape must not leave nothing to check.
  ASSERT_GE(listed.at("models").size(), 4u);
  ASSERT_GE(listed.at("optimizers").size(), 5u);
  ASSERT_GE(listed.at("strategies").size(), 3u);
  ASSERT_NE(std::find(commands.begin(), commands.end(), "run"), commands.end()) << help.out;

  std::string all_docs;
  for (const auto& [path, text] : documentation()) all_docs += text + "\n";
  std::string missing;
  for (const auto& [kind, name] : names) {
    if (!mentions_whole_word(all_docs, name)) missing += "\n  " + kind + " " + name;
  }
  EXPECT_TRUE(missing.empty()) << "named by `gradscope list` or `gradscope --help` but in "
                               << "neither README.md nor docs/:" << missing;
}

TEST(DocsCoverage, EveryRelativeLinkLeadsIntoTheRepository) {
  const auto pages = documentation();
  const fs::path repo = fs::weakly_canonical(kRepo);
  std::string broken;
  for (const auto& [page, text] : pages) {
    for (const std::string& target : link_targets(text)) {
      if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
          target.rfind("mailto:", 0) == 0) {
        continue;
      }
      const size_t hash = target.find('#');
      const std::string file = target.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
      const fs::path resolved =
          file.empty() ? page : fs::weakly_canonical(page.parent_path() / file);
      const std::string where = fs::relative(page, kRepo).string() + ": " + target;
      const std::string inside = fs::relative(resolved, repo).string();
      if (inside.empty() || inside.rfind("..", 0) == 0) {
        broken += "\n  " + where + " (outside the repository)";
      } else if (!fs::exists(resolved)) {
        broken += "\n  " + where + " (no such file)";
      } else if (!anchor.empty() &&
                 !anchors_of(testing::slurp(resolved.string())).count(anchor)) {
        broken += "\n  " + where + " (no such heading)";
      }
    }
  }
  EXPECT_TRUE(broken.empty()) << "links that lead nowhere:" << broken;
}

}  // namespace
}  // namespace gradscope::docs_coverage
