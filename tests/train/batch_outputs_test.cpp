// batch_outputs (`gradscope outputs`): the batch of the step asked for is the one training
// takes at that step, accumulation included, and the loss written is its mean.
#include <gtest/gtest.h>

#include <string>

#include "gradscope/core/error.h"
#include "gradscope/train/batch_outputs.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::expect_usage_error;

RunConfig modernbert_config(int64_t accum_steps) {
  RunConfig c;
  c.model = "modernbert";
  c.preset = "tiny";
  c.dataset = testing::fixture("text/sotu-excerpt.txt");
  c.seq_len = 32;
  c.batch = 2;
  c.accum_steps = accum_steps;
  c.dropout = 0.0;
  c.quiet = true;
  return c;
}

torch::Tensor written(const BatchOutputs& r, const std::string& name) {
  for (const auto& [n, t] : r.tensors)
    if (n == name) return t;
  ADD_FAILURE() << name << " not written";
  return {};
}

TEST(BatchOutputs, TheStepsBatchIsTheOneTrainingTakesThere) {
  for (int64_t accum : {1, 3}) {
    SessionOptions options;
    options.updater = false;
    Session session(modernbert_config(accum), options);
    // Step k (from 1) starts at sample (k - 1) x batch x accumulation steps.
    const Batch third = session.data().train_batch(2 * 2 * accum, 2);
    const BatchOutputs r = batch_outputs(session, 3);
    EXPECT_TRUE(torch::equal(written(r, "batch.input_ids"), third.input_ids)) << accum;
    EXPECT_TRUE(torch::equal(written(r, "batch.targets"), third.targets)) << accum;
    EXPECT_EQ(r.targets, third.targets.ne(-100).sum().item<int64_t>());
    EXPECT_FALSE(torch::equal(third.input_ids, session.data().train_batch(0, 2).input_ids));
  }
}

TEST(BatchOutputs, StepsCountFromOne) {
  SessionOptions options;
  options.updater = false;
  Session session(modernbert_config(1), options);
  const Error e = expect_usage_error([&] { batch_outputs(session, 0); });
  EXPECT_NE(std::string(e.what()).find("--step 0 must be at least 1"), std::string::npos);
  // (k - 1) x 2 samples overflows int64 here, and would wrap to step 1's batch.
  const Error huge = expect_usage_error([&] { batch_outputs(session, (int64_t{1} << 62) + 1); });
  EXPECT_NE(std::string(huge.what()).find("overflow"), std::string::npos);
}

}  // namespace
}  // namespace gradscope
