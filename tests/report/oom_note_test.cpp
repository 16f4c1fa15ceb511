// The report's configuration table says what would have fitted a run that ran out of memory,
// from its record's failure.memory.fit, escaped as every cell is.
#include <gtest/gtest.h>

#include "gradscope/report/analysis.h"
#include "gradscope/report/tables.h"
#include "test_util.h"

namespace gradscope {
namespace {

MemoryFit sample_fit() {
  MemoryFit fit;
  fit.cap_bytes = 4 << 20;
  fit.estimated_peak_bytes = 6 << 20;
  fit.max_batch = 3;
  MemoryMethodFit over{"recompute <mlp>", "recomputes", {"--recompute", "mlp"}, 5 << 20,
                       false, 1e6};
  MemoryMethodFit chunked{"chunked loss", "keeps the math and the compute",
                          {"--loss", "chunked"}, 3 << 20, true, std::nullopt};
  fit.tried = {chunked, over};
  fit.cheapest = chunked;
  return fit;
}

TEST(OomNote, TheFitIsOneShortLine) {
  MemoryFit fit = sample_fit();
  EXPECT_EQ(fit_hint_text(fit),
            "by the estimate, would have fitted: --batch 3, or --loss chunked (chunked loss)");
  fit.max_batch = 0;
  EXPECT_EQ(fit_hint_text(fit),
            "by the estimate, would have fitted: --loss chunked (chunked loss)");
  fit.cheapest.reset();
  EXPECT_EQ(fit_hint_text(fit),
            "nothing tried fits 4.00 MiB: not a micro-batch of 1, nor any of 2 methods");
  // The estimate put the run itself within the cap: it has no answer to give.
  fit.estimated_peak_bytes = fit.cap_bytes;
  EXPECT_EQ(fit_hint_text(fit),
            "the estimate put this run within the cap: no answer of what would have fitted");
}

TEST(OomNote, TheFailedRunsRowSaysWhatWouldHaveFitted) {
  RunRecord ok = testing::result_record("00000000000000aa");
  RunRecord oom = testing::result_record("00000000000000bb");
  oom.config.seed = 1;
  oom.status = RunStatus::kOom;
  oom.final_loss.reset();
  oom.failure = RunFailure{1, "forward", "out of memory"};
  FailureMemory memory;
  MemoryFit fit = sample_fit();
  fit.cheapest->method = "<script>";  // a record is outside input
  memory.fit = fit;
  oom.failure->memory = memory;
  const ReportData data = analyze_records({ok, oom}, {});
  const Table t = groups_table(data, "llama");
  ASSERT_EQ(t.rows.size(), 1u);
  const std::string& status = t.rows[0][3];
  EXPECT_TRUE(testing::contains(status, "oom")) << status;
  EXPECT_TRUE(testing::contains(
      status, "(oom: by the estimate, would have fitted: --batch 3, or --loss chunked (<script>))"))
      << status;
  const std::string html = html_table(t);
  EXPECT_FALSE(testing::contains(html, "<script>")) << html;
  EXPECT_TRUE(testing::contains(html, "&lt;script&gt;")) << html;
  // A run without the answer (the sweep's record of an oom) adds nothing.
  oom.failure->memory.reset();
  const Table plain = groups_table(analyze_records({ok, oom}, {}), "llama");
  EXPECT_FALSE(testing::contains(plain.rows[0][3], "would have fitted")) << plain.rows[0][3];
}

}  // namespace
}  // namespace gradscope
