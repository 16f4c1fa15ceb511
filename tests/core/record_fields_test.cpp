// The record's JSON against what describes it elsewhere: a record with every field set reads
// back as it was written (and as tests/fixtures/records/v2-full.json holds it, byte for byte),
// and every key of its JSON is listed in docs/record.md, which lists no key the JSON lacks.
#include "gradscope/core/record.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "record_keys.h"
#include "record_sample.h"
#include "test_util.h"

namespace gradscope {
namespace {

using nlohmann::json;

TEST(RecordFields, AFullRecordRoundTrips) {
  const json j = record_to_json(testing::full_record());
  const RunRecord back = record_from_json(j);
  EXPECT_EQ(record_to_json(back), j);
  // Every key of the JSON read back into the struct: none is lost on the way.
  EXPECT_EQ(testing::missing_keys(j, record_to_json(back)), std::vector<std::string>{});
}

// Records are compared byte for byte (a database's record_json, `collect`'s merges). The
// fixture is the sample as written before the mapping was described field by field; a key
// added on purpose (a new setting in "config", a new measured figure) is added to it too.
TEST(RecordFields, AFullRecordIsWrittenAsBefore) {
  const std::string expected = testing::slurp(testing::fixture("records/v2-full.json"));
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(record_to_json(testing::full_record()).dump(2) + "\n", expected);
}

// The sample sets every part: a part it left null or empty would escape the other tests.
TEST(RecordFields, TheSampleSetsEveryField) {
  std::vector<std::string> nulls;
  testing::key_paths(record_to_json(testing::full_record()), &nulls);
  for (const std::string& path : nulls)
    EXPECT_EQ(path.rfind("config.", 0), 0u) << path << " is null in the sample";
}

TEST(RecordFields, EveryKeyIsDocumented) {
  const std::set<std::string> documented = testing::documented_record_keys();
  ASSERT_GT(documented.size(), 100u);
  for (const std::string& path : testing::key_paths(record_to_json(testing::full_record())))
    EXPECT_TRUE(documented.count(testing::plain_path(path)))
        << path << " is not listed in docs/record.md";
}

TEST(RecordFields, EveryDocumentedKeyIsWritten) {
  const std::vector<std::string> paths =
      testing::key_paths(record_to_json(testing::full_record()));
  std::set<std::string> written;
  for (const std::string& path : paths) written.insert(testing::plain_path(path));
  for (const std::string& path : testing::documented_record_keys())
    EXPECT_TRUE(written.count(path)) << "docs/record.md lists " << path
                                     << ", which the record does not write";
}

// The checks above fail, naming the key, when a mapping forgets one.
TEST(RecordFields, AForgottenKeyIsNamed) {
  const json j = record_to_json(testing::full_record());
  json without = j;
  without["memory"]["breakdown"].erase("logits");
  without["steps"][1].erase("steal_s");
  EXPECT_EQ(testing::missing_keys(j, without),
            (std::vector<std::string>{"memory.breakdown.logits", "steps[].steal_s"}));
  const std::vector<std::string> paths = testing::key_paths(j);
  EXPECT_NE(std::find(paths.begin(), paths.end(), "distributed.ranks[].breakdown.params"),
            paths.end());
  EXPECT_EQ(std::find(paths.begin(), paths.end(), "data.dataset"), paths.end());  // opaque
}

}  // namespace
}  // namespace gradscope
