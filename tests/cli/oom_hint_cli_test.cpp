// A run that runs out of memory under --memory-cap says why and what would have fitted, and
// the method it names does fit: the same run with that method's flags trains under the same
// cap. Runs the real binary.
#include <gtest/gtest.h>

#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/cli/commands.h"
#include "gradscope/core/record.h"
#include "gradscope/train/estimate.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::slurp;

// The tiny Llama at a batch whose activations dominate its peak, not quiet: the hint is
// printed with the run's summary.
const std::string kOomRun = std::string("run --model llama --preset tiny --seq 64 --batch 16 ") +
                            "--steps 2 --warmup-steps 0 --eval-batches 1 --no-db --dataset " +
                            GRADSCOPE_FIXTURES + "/text/sotu-excerpt.txt";

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(OomHintCli, TheNamedMethodFitsUnderTheSameCap) {
  testing::TempDir tmp("gradscope-oomhint");
  // The cap: halfway between the run's estimated peak and that of recomputing every block,
  // from the estimate of this very configuration (its data set included).
  std::vector<std::string> args = words(kOomRun);
  args.erase(args.begin());  // "run"
  const RunConfig run = parse_run_arguments(args);
  const int64_t data = resident_data_bytes(run);
  RunConfig full = run;
  full.recompute = Recompute::kFull;
  const int64_t peak = estimate_run(run, data).peak_bytes;
  const int64_t lean = estimate_run(full, data).peak_bytes;
  ASSERT_LT(lean, peak);
  const int64_t cap = (peak + lean) / 2;

  const auto r = testing::run_gradscope(
      fmt::format("{} --memory-cap {} --json {}", kOomRun, cap, tmp.file("oom.json")));
  EXPECT_EQ(r.code, 1) << r.err;
  const RunRecord oom = record_from_json(nlohmann::json::parse(slurp(tmp.file("oom.json"))));
  ASSERT_EQ(oom.status, RunStatus::kOom) << (oom.failure ? oom.failure->message : "");
  ASSERT_TRUE(oom.failure && oom.failure->memory && oom.failure->memory->fit);
  const MemoryFit& fit = *oom.failure->memory->fit;
  ASSERT_TRUE(fit.cheapest.has_value()) << r.out;
  std::string flags;
  for (const std::string& f : fit.cheapest->flags) flags += (flags.empty() ? "" : " ") + f;
  // The hint: the request, the largest live labels, the batch and the method with its flags.
  EXPECT_TRUE(testing::contains(r.out, "out of memory: a request of ")) << r.out;
  EXPECT_TRUE(testing::contains(r.out, "largest live: ")) << r.out;
  EXPECT_TRUE(testing::contains(r.out, fmt::format("--batch {} would have fitted", fit.max_batch)))
      << r.out;
  EXPECT_TRUE(testing::contains(
      r.out, "cheapest method that fits: " + fit.cheapest->method + ": " + flags))
      << r.out;

  const auto ok = testing::run_gradscope(fmt::format("{} --memory-cap {} {} --json {}", kOomRun,
                                                     cap, flags, tmp.file("ok.json")));
  EXPECT_EQ(ok.code, 0) << ok.err;
  const auto record = nlohmann::json::parse(slurp(tmp.file("ok.json")));
  EXPECT_EQ(record["status"], "ok") << record["failure"].dump();
  EXPECT_LE(record["memory"]["peak_bytes"].get<int64_t>(), cap);
}

}  // namespace
}  // namespace gradscope
