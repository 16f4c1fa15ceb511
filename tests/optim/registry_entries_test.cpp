// The registries' entries declare what each optimizer and model supports, and no code outside
// the registries decides behaviour by an optimizer's or a model's name: an entry that forgets a
// capability fails here instead of producing a silent null, and a name comparison in the
// sources fails here naming its file and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/train/estimate.h"
#include "gradscope/train/session.h"
#include "test_util.h"

namespace gradscope {
namespace {

// ---------------------------------------------------------------------------------------
// Optimizer entries

TEST(OptimizerEntries, EveryOptimizerIsBuiltAndHasAMemoryRuleOrSaysWhyNot) {
  for (const auto& item : optimizer_registry().items()) {
    const OptimizerEntry& e = item.entry;
    EXPECT_NE(e.make, nullptr) << item.name;
    EXPECT_GT(e.default_lr, 0) << item.name;
    if (!e.memory && !e.no_memory_model)
      ADD_FAILURE() << "optimizer '" << item.name
                    << "' declares neither a memory rule (OptimizerEntry::memory) nor why it has "
                       "none (no_memory_model)";
    EXPECT_FALSE(e.memory && e.no_memory_model)
        << item.name << ": a memory rule and a reason for having none";
    EXPECT_FALSE(e.compared_in_estimate && !e.memory)
        << item.name << ": compared in the estimate without a memory rule";
  }
}

TEST(OptimizerEntries, CapabilitiesAgree) {
  std::set<std::string> models;
  for (const auto& name : model_registry().names()) models.insert(name);
  for (const auto& item : optimizer_registry().items()) {
    const OptimizerEntry& e = item.entry;
    EXPECT_TRUE(!e.same_bits_in_backward || e.steps_in_backward) << item.name;
    EXPECT_TRUE(!e.fold_hint || e.folds_micro_batches) << item.name;
    // A line search evaluates every parameter at once: neither per parameter nor per slice.
    EXPECT_FALSE(e.steps_with_closure && (e.steps_in_backward || e.elementwise)) << item.name;
    for (const auto& [model, lr] : e.lr_by_model) {
      EXPECT_TRUE(models.count(model)) << item.name << ": lr_by_model names '" << model << "'";
      EXPECT_GT(lr, 0) << item.name << " on " << model;
    }
  }
}

// The estimate of every registered optimizer: figures from its rule, or a usage error that
// gives its reason.
TEST(OptimizerEntries, EveryOptimizerHasAnEstimateOrItsReason) {
  for (const auto& item : optimizer_registry().items()) {
    RunConfig c;
    c.model = "llama";
    c.preset = "tiny";
    c.optimizer = item.name;
    c.weight_decay = 0.1;
    if (item.entry.memory) {
      try {
        const MemoryEstimate e = estimate_run(c, 0);
        EXPECT_GT(e.peak_bytes, 0) << item.name;
        EXPECT_GE(e.optimizer_state_bytes, 0) << item.name;
      } catch (const std::exception& e) {
        ADD_FAILURE() << item.name << ": " << e.what();
      }
    } else if (item.entry.no_memory_model) {
      const Error e = testing::expect_usage_error([&] { estimate_run(c, 0); });
      EXPECT_TRUE(testing::contains(e.what(), item.name)) << e.what();
      EXPECT_TRUE(testing::contains(e.what(), item.entry.no_memory_model)) << e.what();
    }
  }
}

TEST(OptimizerEntries, StatefulOptimizersKeepState) {
  // Every rule but plain SGD's (no momentum) keeps something for a real model.
  for (const auto& item : optimizer_registry().items()) {
    if (!item.entry.memory || item.name == "sgd") continue;
    RunConfig c;
    c.optimizer = item.name;
    EXPECT_GT(estimate_run(c, 0).optimizer_state_bytes, 0) << item.name;
  }
}

// ---------------------------------------------------------------------------------------
// Model entries

TEST(ModelEntries, EveryTransformerHasItsEstimateUnitsAndPublishedNames) {
  for (const auto& item : model_registry().items()) {
    const ModelFamily& f = item.entry;
    if (f.kind == ModelKind::kToy) {
      EXPECT_EQ(f.trace_step, nullptr) << item.name;
      EXPECT_EQ(f.block_flops, nullptr) << item.name;
      EXPECT_EQ(f.published, nullptr) << item.name;
      continue;
    }
    EXPECT_NE(f.trace_step, nullptr) << item.name;
    EXPECT_NE(f.published, nullptr) << item.name;
    ASSERT_NE(f.block_flops, nullptr) << item.name;
    RunConfig c;
    c.model = item.name;
    const nlohmann::json arch = resolve_arch(c);
    EXPECT_FALSE(f.block_flops(arch, arch.at("seq_len").get<int64_t>()).empty()) << item.name;
  }
}

// ---------------------------------------------------------------------------------------
// No dispatch on names

// The index of the first character at or after `i` that is not a blank (line.size() if none).
int next_nonblank(const std::string& line, int i) {
  while (i < static_cast<int>(line.size()) && (line[i] == ' ' || line[i] == '\t')) ++i;
  return i;
}

// The index of the last character before `i` that is not a blank (-1 if none).
int last_nonblank(const std::string& line, int i) {
  --i;
  while (i >= 0 && (line[i] == ' ' || line[i] == '\t')) --i;
  return i;
}

bool has_at(const std::string& line, int i, const std::string& text) {
  return i >= 0 && line.compare(static_cast<size_t>(i), text.size(), text) == 0;
}

bool ends_at(const std::string& line, int last, const std::string& text) {
  return has_at(line, last + 1 - static_cast<int>(text.size()), text);
}

bool quoted_name_at(const std::string& line, int i, const std::vector<std::string>& names) {
  for (const auto& name : names)
    if (has_at(line, i, "\"" + name + "\"")) return true;
  return false;
}

// Whether `line` decides something by one of `names`: a string literal of a name compared with
// == or != (either side, also as std::string("...")), passed to compare(), or opening a braced
// list of two or more names (a set to look a name up in).
bool compares_a_name(const std::string& line, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    const std::string quoted = "\"" + name + "\"";
    for (size_t found = line.find(quoted); found != std::string::npos;
         found = line.find(quoted, found + 1)) {
      const int at = static_cast<int>(found), end = at + static_cast<int>(quoted.size());
      int after = next_nonblank(line, end);
      if (has_at(line, after, ")")) after = next_nonblank(line, after + 1);
      if (has_at(line, after, "==") || has_at(line, after, "!=")) return true;
      int before = last_nonblank(line, at);
      if (has_at(line, before, "(")) {
        const int call = last_nonblank(line, before);
        if (ends_at(line, call, "compare")) return true;
        const std::string cast = "std::string";
        if (ends_at(line, call, cast))
          before = last_nonblank(line, call + 1 - static_cast<int>(cast.size()));
      }
      if (ends_at(line, before, "==") || ends_at(line, before, "!=")) return true;
      const int comma = next_nonblank(line, end);
      if (has_at(line, before, "{") && has_at(line, comma, ",") &&
          quoted_name_at(line, next_nonblank(line, comma + 1), names))
        return true;
    }
  }
  return false;
}

std::vector<std::string> registered_names() {
  std::vector<std::string> names = optimizer_registry().names();
  for (const auto& name : model_registry().names()) names.push_back(name);
  return names;
}

TEST(NameDispatch, TheScannerFindsComparisonsAndLists) {
  const std::vector<std::string> names = {"sgd", "adam", "llama", "apollo-mini"};
  for (const char* line : {
           R"(  if (o == "sgd") {)",
           R"(  if ("adam" != optimizer) return;)",
           R"(  const bool causal = model == "llama";)",
           R"(  if (name == std::string("apollo-mini")) x();)",
           R"(  if (std::string("sgd") == name) x();)",
           R"(  if (name.compare("adam") == 0) x();)",
           R"(  for (const char* m : {"sgd", "adam"}) check(m);)",
           R"(  static const std::set<std::string> s = { "llama" , "sgd" };)",
       })
    EXPECT_TRUE(compares_a_name(line, names)) << line;
  for (const char* line : {
           R"(  c.optimizer = "sgd";)",
           R"(  OptReader r("adam", opt, keys);)",
           R"(  return {{"quadratic", lr}, {"rosenbrock", lr}};)",
           R"(  if (o == "sgdx") {)",
           R"(  if (o == "apollo") {)",
           R"(  fail_usage("optimizer 'adam' == nothing");)",
           R"(  const std::vector<std::string> keys = {"betas", "eps"};)",
       })
    EXPECT_FALSE(compares_a_name(line, names)) << line;
}

// Where names are data, not dispatch: the registries themselves and the study's claims.
bool name_dispatch_allowed(const std::string& rel) {
  if (rel == "optim/factory.cpp" || rel == "models/registry.cpp") return true;
  return rel.rfind("report/claim", 0) == 0;
}

TEST(NameDispatch, NoCodeOutsideTheRegistriesComparesAnOptimizerOrModelName) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(GRADSCOPE_SOURCE_DIR) / "src" / "gradscope";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  const std::vector<std::string> names = registered_names();
  std::vector<std::string> found;
  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
    const std::string rel = entry.path().lexically_relative(root).generic_string();
    ++files;
    if (name_dispatch_allowed(rel)) continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (compares_a_name(line, names))
        found.push_back("src/gradscope/" + rel + ":" + std::to_string(number) + ": " + line);
    }
  }
  EXPECT_GT(files, 100u);
  std::string list;
  for (const auto& f : found) list += "\n  " + f;
  EXPECT_TRUE(found.empty())
      << "code outside the registries decides by an optimizer's or a model's name; declare "
         "the capability on its registry entry (optim/factory.h, models/registry.h) instead:"
      << list;
}

}  // namespace
}  // namespace gradscope
