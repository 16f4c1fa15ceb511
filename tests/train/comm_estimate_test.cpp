// `gradscope estimate --link` against the closed forms of its ring model: bytes per rank, the
// link's time for them, what backward can hide, and the link and FLOP/s texts it reads.
#include <gtest/gtest.h>

#include "gradscope/core/error.h"
#include "gradscope/train/comm_estimate.h"
#include "gradscope/train/estimate.h"

namespace gradscope {
namespace {

RunConfig tiny_llama() {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.batch = 2;
  return c;
}

double trainable_bytes(const RunConfig& c) {
  double sum = 0;
  for (const ParamPlace& p : trainable_param_places(c)) sum += static_cast<double>(p.bytes);
  return sum;
}

const CommModePrediction& mode(const CommPrediction& p, const std::string& shard) {
  for (const auto& m : p.modes)
    if (m.shard == shard) return m;
  throw std::runtime_error("no mode " + shard);
}

TEST(CommEstimate, ReadsLinksAndFlops) {
  EXPECT_DOUBLE_EQ(parse_link("--link", "25gbit").bytes_per_s, 25e9 / 8);
  EXPECT_DOUBLE_EQ(parse_link("--link", "100Mbit/s").bytes_per_s, 100e6 / 8);
  EXPECT_DOUBLE_EQ(parse_link("--link", "50GB/s").bytes_per_s, 50e9);
  const Link l = parse_link("--link", "400gbit,2us");
  EXPECT_DOUBLE_EQ(l.bytes_per_s, 400e9 / 8);
  EXPECT_DOUBLE_EQ(l.latency_s, 2e-6);
  for (const char* bad : {"fast", "10", "10gbit,", "10gbit,5", "-1gbit", "0gbit", "1gbit,20s",
                          "nangbit", "1e400gbit"})
    EXPECT_THROW(parse_link("--link", bad), Error) << bad;
  EXPECT_DOUBLE_EQ(parse_flops("--device-flops", "400T"), 400e12);
  EXPECT_DOUBLE_EQ(parse_flops("--device-flops", "2.5e10"), 2.5e10);
  for (const char* bad : {"fast", "1x", "-3T", "0"})
    EXPECT_THROW(parse_flops("--device-flops", bad), Error) << bad;
}

// ddp on N ranks without latency: every gradient byte all-reduced once, 2(N-1)/N of them sent
// per rank, at the link's bandwidth; one bucket (25 MiB holds the tiny model) completes with
// the embedding, at backward's end, so nothing hides.
TEST(CommEstimate, DdpIsTheRingsVolumeOverTheBandwidth) {
  const RunConfig c = tiny_llama();
  const double g = trainable_bytes(c);
  const Link link{1e6, 0};
  for (int64_t nodes : {2, 4}) {
    const CommPrediction p = predict_comm(c, nodes, 1, link, link, 1e9);
    const double n = static_cast<double>(nodes);
    const CommModePrediction& ddp = mode(p, "ddp");
    EXPECT_NEAR(ddp.bytes_per_step, 2 * (n - 1) / n * g, 1e-6 * g);
    EXPECT_NEAR(ddp.comm_s, 2 * (n - 1) / n * g / link.bytes_per_s, 1e-9);
    EXPECT_EQ(ddp.collectives, 1);
    EXPECT_NEAR(ddp.exposed_s, ddp.comm_s, 1e-12);
    EXPECT_NEAR(ddp.step_s, p.forward_s + p.backward_s + ddp.exposed_s, 1e-12);
    // zero1 and zero2 add the updated shards' gather, (N-1) x G/N, and the norm's sum.
    const CommModePrediction& zero2 = mode(p, "zero2");
    EXPECT_NEAR(zero2.bytes_per_step, ddp.bytes_per_step + (n - 1) / n * g + 2 * (n - 1) / n * 8,
                1e-3 * g);
    EXPECT_GT(mode(p, "fsdp").bytes_per_step, zero2.bytes_per_step);
  }
}

// The slowest link of the ring counts: with several nodes the inter-node one, alone the
// intra-node one; latency adds 2(N-1) rounds to an all-reduce.
TEST(CommEstimate, TheRingRunsAtItsSlowestLinkAndPaysLatencyPerRound) {
  const RunConfig c = tiny_llama();
  const Link slow{1e6, 0}, fast{1e9, 0};
  const double across = mode(predict_comm(c, 2, 2, slow, fast, 1e9), "ddp").comm_s;
  const double within = mode(predict_comm(c, 1, 4, slow, fast, 1e9), "ddp").comm_s;
  EXPECT_NEAR(across / within, 1000, 1e-6);
  const Link late{1e6, 1e-3};
  const double with_latency = mode(predict_comm(c, 2, 1, late, late, 1e9), "ddp").comm_s;
  const double without = mode(predict_comm(c, 2, 1, slow, slow, 1e9), "ddp").comm_s;
  EXPECT_NEAR(with_latency - without, 2 * 1e-3, 1e-12);
}

// Small buckets launch while backward runs: on a slow device (a long backward) and a fast
// link a good part of ddp's communication hides (not the embedding's bucket, complete at
// backward's end), where one bucket of everything hides nothing; zero2, at most two buckets
// in flight, hides less or as much; fsdp's block collectives wait, so it hides less.
TEST(CommEstimate, BucketsHideBehindBackward) {
  RunConfig c = tiny_llama();
  c.bucket_bytes = 8 << 10;
  const Link link{1e8, 0};
  const CommPrediction p = predict_comm(c, 2, 1, link, link, 1e7);
  const CommModePrediction& ddp = mode(p, "ddp");
  EXPECT_GT(ddp.hidden_s, 0.25 * ddp.comm_s);
  EXPECT_EQ(mode(predict_comm(tiny_llama(), 2, 1, link, link, 1e7), "ddp").hidden_s, 0);
  EXPECT_NEAR(ddp.hidden_s + ddp.exposed_s, ddp.comm_s, 1e-12);
  EXPECT_LE(mode(p, "zero2").hidden_s / mode(p, "zero2").comm_s,
            ddp.hidden_s / ddp.comm_s + 1e-12);
  EXPECT_LT(mode(p, "fsdp").hidden_s / mode(p, "fsdp").comm_s, ddp.hidden_s / ddp.comm_s);
}

}  // namespace
}  // namespace gradscope
