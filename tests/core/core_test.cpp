#include <gtest/gtest.h>

#include "gradscope/core/config.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/registry.h"
#include "gradscope/core/rng.h"
#include "gradscope/core/settings.h"

namespace gradscope {
namespace {

TEST(Registry, UnknownNameListsValidOnes) {
  Registry<int> reg("widget");
  reg.add("alpha", "first", 1).add("beta", "second", 2);
  EXPECT_EQ(reg.get("beta"), 2);
  try {
    reg.get("gamma");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kErrorKindUsage);
    EXPECT_NE(std::string(e.what()).find("gamma"), std::string::npos);
    EXPECT_NE(e.hint().find("alpha, beta"), std::string::npos);
  }
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("1000000"), 1000000);
  EXPECT_EQ(parse_bytes("512MiB"), 512LL * 1024 * 1024);
  EXPECT_EQ(parse_bytes("8GiB"), 8LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("2GB"), 2000000000LL);
  EXPECT_THROW(parse_bytes("lots"), Error);
  EXPECT_THROW(parse_bytes("1e19"), Error);  // past int64: must not wrap to a negative count
  EXPECT_THROW(parse_bytes("10000000TB"), Error);
  EXPECT_EQ(parse_bytes("1e18"), 1000000000000000000LL);
  EXPECT_THROW(parse_bytes("5 parsecs"), Error);
  EXPECT_THROW(parse_bytes("-5"), Error);
}

TEST(RunId, IgnoresThreadsPathsAndDeviceIndex) {
  RunConfig a;
  RunConfig b = a;
  b.threads = 7;
  b.db_path = "elsewhere.db";
  b.json_path = "x.json";
  b.device = "cpu";
  EXPECT_EQ(run_id_of(canonical_config_json(a)), run_id_of(canonical_config_json(b)));
  b.seed = 1;
  EXPECT_NE(run_id_of(canonical_config_json(a)), run_id_of(canonical_config_json(b)));
  RunConfig c0, c1;
  c0.device = "cuda:0";
  c1.device = "cuda:1";
  EXPECT_EQ(run_id_of(canonical_config_json(c0)), run_id_of(canonical_config_json(c1)));
}

TEST(Rng, CounterBasedHashIsDeterministicAndSpread) {
  EXPECT_EQ(hash3(1, 2, 3), hash3(1, 2, 3));
  EXPECT_NE(hash3(1, 2, 3), hash3(1, 2, 4));
  double sum = 0;
  for (int i = 0; i < 10000; ++i) sum += unit_double(hash3(7, 0, i));
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace gradscope
