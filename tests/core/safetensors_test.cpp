// Safetensors files: what is written reads back bitwise, the header is the reference's format,
// sharded sets are named and indexed as Hugging Face's, and every kind of bad file is a usage
// error naming the file and the tensor before anything is allocated.
#include "gradscope/core/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "test_util.h"

namespace gradscope {
namespace safetensors_test {
namespace {

namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// True when `a` and `b` have the same dtype, shape and bytes (NaN payloads and -0.0 included).
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const torch::Tensor ca = a.contiguous(), cb = b.contiguous();
  const size_t bytes = static_cast<size_t>(ca.numel()) * ca.element_size();
  return bytes == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), bytes) == 0;
}

void expect_read_back(const Named& written, const std::map<std::string, torch::Tensor>& read) {
  ASSERT_EQ(read.size(), written.size());
  for (const auto& [name, t] : written) {
    ASSERT_EQ(read.count(name), 1u) << name;
    const torch::Tensor& got = read.at(name);
    EXPECT_TRUE(same_bits(got, t.cpu())) << name;
    EXPECT_TRUE(got.device().is_cpu()) << name;
    EXPECT_TRUE(got.is_contiguous()) << name;
  }
}

// Tensors of every dtype, with a scalar, empty shapes, a view and values whose bits matter.
Named mixed_tensors() {
  torch::manual_seed(7);
  const torch::Tensor specials = torch::tensor({0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                                                std::numeric_limits<float>::quiet_NaN(),
                                                std::numeric_limits<float>::denorm_min(), 1e-30f});
  return {
      {"model.embed.weight", torch::randn({3, 4})},
      {"layers.0.norm", torch::randn({5}).to(torch::kBFloat16)},
      {"layers.0.mlp", torch::randn({2, 3, 2}).to(torch::kFloat16)},
      {"scale", torch::tensor(3.5f)},                          // 0-d
      {"empty", torch::empty({0, 3})},                         // no elements
      {"empty.bf16", torch::empty({4, 0}, torch::kBFloat16)},  // no elements, nothing after it
      {"transposed", torch::randn({3, 2}).t()},                // not contiguous
      {"specials", specials},
      {"specials.f16", specials.to(torch::kFloat16)},
      {"\xc3\xa9t\xc3\xa9", torch::ones({2}, torch::kBFloat16)},  // UTF-8 name
  };
}

// The first 8 bytes (the header's length), the header and the data buffer of a file.
struct RawFile {
  uint64_t length = 0;
  std::string header;
  std::string data;
};

RawFile split_file(const std::string& path) {
  const std::string bytes = testing::slurp(path);
  RawFile raw;
  EXPECT_GE(bytes.size(), 8u);
  for (int i = 7; i >= 0; --i) raw.length = (raw.length << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_LE(raw.length, bytes.size() - 8);
  raw.header = bytes.substr(8, raw.length);
  raw.data = bytes.substr(8 + raw.length);
  return raw;
}

// A file of an 8-byte length, `header` and `data_bytes` zero bytes; the length written is the
// header's unless `length` is given.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  bytes += header;
  bytes += std::string(data_bytes, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
}

// Expects both readers to refuse `path` with a usage error that holds `file` and every one of
// `needles`, and returns the message.
std::string expect_refused(const std::string& path, const std::string& file,
                           const std::vector<std::string>& needles) {
  const Error header = testing::expect_usage_error([&] { read_safetensors_header(path); });
  const Error tensors = testing::expect_usage_error([&] { read_safetensors(path); });
  EXPECT_EQ(std::string(header.what()), std::string(tensors.what()));
  const std::string what = header.what();
  EXPECT_TRUE(testing::contains(what, file)) << what;
  for (const std::string& needle : needles) EXPECT_TRUE(testing::contains(what, needle)) << what;
  return what;
}

TEST(SafetensorsRoundTrip, EveryDtypeScalarsAndEmptyShapesReadBackBitwise) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("weights.safetensors");
  const Named tensors = mixed_tensors();
  write_safetensors(file, tensors, {{"step", "12"}});
  expect_read_back(tensors, read_safetensors(file));

  const std::vector<SafetensorsEntry> entries = read_safetensors_header(file);
  ASSERT_EQ(entries.size(), tensors.size());
  for (size_t i = 0; i + 1 < entries.size(); ++i) EXPECT_LT(entries[i].name, entries[i + 1].name);
  for (const SafetensorsEntry& e : entries) {
    EXPECT_EQ(e.file, file);
    if (e.name == "layers.0.norm") {
      EXPECT_EQ(e.dtype, "BF16");
      EXPECT_EQ(e.shape, std::vector<int64_t>{5});
      EXPECT_EQ(e.end - e.begin, 10);
    }
    if (e.name == "scale") {
      EXPECT_EQ(e.dtype, "F32");
      EXPECT_TRUE(e.shape.empty());
    }
  }
}

TEST(SafetensorsRoundTrip, CudaTensorsAreWrittenFromTheCpu_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir("gradscope-safetensors");
  const Named tensors = {{"w", torch::randn({64, 3}, torch::kCUDA).to(torch::kBFloat16)},
                         {"b", torch::randn({3}, torch::kCUDA)}};
  write_safetensors(dir.file("cuda.safetensors"), tensors);
  expect_read_back(tensors, read_safetensors(dir.file("cuda.safetensors")));
}

TEST(SafetensorsFormat, HeaderIsPaddedJsonWithContiguousOffsetsInTheOrderGiven) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("w.safetensors");
  const Named tensors = mixed_tensors();
  write_safetensors(file, tensors, {{"step", "12"}});
  const RawFile raw = split_file(file);
  EXPECT_EQ(raw.length % 8, 0u);
  // The padding is spaces after the JSON text, nothing else.
  const size_t last = raw.header.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(raw.header[last], '}');
  EXPECT_LT(raw.header.size() - last - 1, 8u);

  const nlohmann::ordered_json header = nlohmann::ordered_json::parse(raw.header);
  ASSERT_TRUE(header.is_object());
  EXPECT_EQ(header["__metadata__"], nlohmann::ordered_json({{"format", "pt"}, {"step", "12"}}));
  int64_t offset = 0;
  size_t i = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    ASSERT_LT(i, tensors.size());
    const torch::Tensor& t = tensors[i++].second;
    EXPECT_EQ(name, tensors[i - 1].first);
    const std::string dtype = t.scalar_type() == torch::kFloat32    ? "F32"
                              : t.scalar_type() == torch::kBFloat16 ? "BF16"
                                                                    : "F16";
    EXPECT_EQ(entry["dtype"], dtype) << name;
    EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), t.sizes().vec()) << name;
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    EXPECT_EQ(entry["data_offsets"], nlohmann::ordered_json({offset, offset + bytes})) << name;
    // Little-endian, C order: the buffer's bytes are the contiguous tensor's.
    EXPECT_EQ(
        raw.data.compare(offset, bytes, static_cast<const char*>(t.contiguous().data_ptr()), bytes),
        0)
        << name;
    offset += bytes;
  }
  EXPECT_EQ(i, tensors.size());
  EXPECT_EQ(offset, static_cast<int64_t>(raw.data.size()));
}

TEST(SafetensorsSet, ShardsAreNamedAndIndexedAsHuggingFaceDoesAndReadBack) {
  testing::TempDir dir("gradscope-safetensors");
  const Named tensors = {
      {"a", torch::randn({10})},                        // 40 bytes
      {"b", torch::randn({5}).to(torch::kBFloat16)},    // 10: fits beside a
      {"c", torch::randn({40})},                        // 160: past the limit, a shard alone
      {"d", torch::randn({2, 3}).to(torch::kFloat16)},  // 12
      {"e", torch::tensor(1.0f)},                       // 4
      {"f", torch::empty({0})},                         // 0
  };
  const std::vector<std::string> files = write_safetensors_set(dir.path(), tensors, 64);
  const std::vector<std::string> expected = {
      dir.file("model-00001-of-00003.safetensors"), dir.file("model-00002-of-00003.safetensors"),
      dir.file("model-00003-of-00003.safetensors"), dir.file("model.safetensors.index.json")};
  EXPECT_EQ(files, expected);

  const nlohmann::json index =
      nlohmann::json::parse(testing::slurp(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"], 40 + 10 + 160 + 12 + 4);
  EXPECT_EQ(index["weight_map"], nlohmann::json({{"a", "model-00001-of-00003.safetensors"},
                                                 {"b", "model-00001-of-00003.safetensors"},
                                                 {"c", "model-00002-of-00003.safetensors"},
                                                 {"d", "model-00003-of-00003.safetensors"},
                                                 {"e", "model-00003-of-00003.safetensors"},
                                                 {"f", "model-00003-of-00003.safetensors"}}));
  expect_read_back(tensors, read_safetensors(dir.path()));
  for (const SafetensorsEntry& e : read_safetensors_header(dir.path()))
    EXPECT_EQ(e.file, dir.file(index["weight_map"][e.name].get<std::string>()));

  // Written again as one file: the shards and the index of the earlier set go.
  const std::vector<std::string> single = write_safetensors_set(dir.path(), tensors);
  EXPECT_EQ(single, std::vector<std::string>{dir.file("model.safetensors")});
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(dir.file("model-00001-of-00003.safetensors")));
  expect_read_back(tensors, read_safetensors(dir.path()));
  // And sharded again: model.safetensors would shadow the index, so it goes.
  write_safetensors_set(dir.path(), tensors, 100);
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
  expect_read_back(tensors, read_safetensors(dir.path()));
}

TEST(SafetensorsWrite, OtherDtypesRepeatedNamesAndReservedNamesAreUsageErrors) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("w.safetensors");
  std::string what = testing::expect_usage_error([&] {
                       write_safetensors(file, {{"ok", torch::ones({2})},
                                                {"ids", torch::ones({2}, torch::kInt32)}});
                     }).what();
  EXPECT_TRUE(testing::contains(what, "'ids'") && testing::contains(what, file)) << what;
  what = testing::expect_usage_error([&] {
           write_safetensors(file, {{"x", torch::ones({2})}, {"x", torch::ones({2})}});
         }).what();
  EXPECT_TRUE(testing::contains(what, "'x' is given twice")) << what;
  testing::expect_usage_error([&] { write_safetensors(file, {{"__metadata__", torch::ones(1)}}); });
  testing::expect_usage_error([&] { write_safetensors(file, {{"", torch::ones(1)}}); });
  testing::expect_usage_error([&] { write_safetensors(file, {{"\xff", torch::ones(1)}}); });
  EXPECT_FALSE(fs::exists(file));  // nothing written
}

// The bad files below are made by hand; each names the file and, where there is one, the
// tensor.

TEST(SafetensorsBadFile, AHeaderLongerThanTheFileIsRefusedBeforeItIsRead) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("long.safetensors");
  write_raw(file, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 1000);
  expect_refused(file, file, {"header's length is 1000 bytes, longer than the"});
  // A length past the cap is refused whatever the file's size.
  write_raw(file, "{}", 0, uint64_t{1} << 40);
  expect_refused(file, file, {"more than the 100000000"});
  write_raw(file, "", 0, std::numeric_limits<uint64_t>::max());
  expect_refused(file, file, {"more than the 100000000"});
  std::ofstream(file, std::ios::binary) << "abc";
  expect_refused(file, file, {"too few"});
}

TEST(SafetensorsBadFile, OffsetsPastTheDataBuffer) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("past.safetensors");
  write_raw(file,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            16);
  expect_refused(file, file, {"tensor 'b'", "byte 24, past the end of the data buffer (16 bytes)"});
}

TEST(SafetensorsBadFile, OverlappingTensorsAndGapsAndSurplusBytes) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("overlap.safetensors");
  write_raw(file,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12);
  expect_refused(file, file, {"tensor 'b' (bytes 4 to 12) overlaps tensor 'a'"});
  write_raw(file,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
            20);
  expect_refused(file, file, {"bytes 8 to 12", "before tensor 'b'", "belong to no tensor"});
  write_raw(file, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 10);
  expect_refused(file, file, {"10 bytes but its tensors end at byte 8 (tensor 'a')"});
}

TEST(SafetensorsBadFile, ANameThatIsNotUtf8) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("utf8.safetensors");
  write_raw(file, "{\"w\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  expect_refused(file, file, {"byte 3 of the header is not UTF-8", "'w\\xff'"});
  // An overlong encoding of '/' and a UTF-16 surrogate are not UTF-8 either.
  write_raw(file, "{\"\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  expect_refused(file, file, {"not UTF-8", "'\\xc0\\xaf'"});
  write_raw(file, "{\"\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  expect_refused(file, file, {"not UTF-8"});
}

TEST(SafetensorsBadFile, AnUnsupportedDtypeIsNamed) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("ints.safetensors");
  write_raw(file,
            R"({"x":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
            R"("y":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})",
            20);
  expect_refused(file, file, {"dtype I64 of tensor 'x' is not supported"});
}

TEST(SafetensorsBadFile, AShapeThatDoesNotMatchTheByteCount) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("shape.safetensors");
  write_raw(file, R"({"x":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8);
  expect_refused(file, file,
                 {"tensor 'x'", "[0, 8] hold 8 bytes, but shape [2, 3] of BF16 needs 12"});
  write_raw(file, R"({"x":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", 8);
  expect_refused(file, file, {"tensor 'x'", "shape entry -1 is not a non-negative integer"});
  write_raw(file, R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8);
  expect_refused(file, file, {"tensor 'x'", "shape entry 2.0"});
  // A product past 2^63 is refused, not wrapped around to a small size.
  write_raw(file, R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})",
            0);
  expect_refused(file, file, {"tensor 'x'", "more elements than a tensor can"});
  write_raw(file, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4);
  expect_refused(file, file, {"tensor 'x'", "end before they begin"});
}

// nlohmann's parser, like most, keeps only the last of two equal keys: read as parsed, the
// first tensor would vanish (and its bytes be unclaimed). The header is scanned for repeated
// keys, and a repeated name is refused by name.
TEST(SafetensorsBadFile, ANameRepeatedInTheJson) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("twice.safetensors");
  write_raw(file,
            R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8);
  expect_refused(file, file, {"tensor 'x' appears twice in the header"});
  write_raw(file, R"({"x":{"dtype":"F32","dtype":"I64","shape":[1],"data_offsets":[0,4]}})", 4);
  expect_refused(file, file, {"tensor 'x': key 'dtype' appears twice"});
}

TEST(SafetensorsBadFile, NotJsonOrNotAnObjectOrBadMetadata) {
  testing::TempDir dir("gradscope-safetensors");
  const std::string file = dir.file("json.safetensors");
  write_raw(file, R"({"x":)", 0);
  expect_refused(file, file, {"not valid JSON"});
  write_raw(file, "[1]", 0);
  expect_refused(file, file, {"not an object"});
  write_raw(file, std::string(100, '[') + std::string(100, ']'), 0);
  expect_refused(file, file, {"deeper than 64"});
  write_raw(file, R"({"__metadata__":{"k":1}})", 0);
  expect_refused(file, file, {"__metadata__ 'k' is 1, not a string"});
  write_raw(file, R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  expect_refused(file, file, {"name is empty"});
  // Valid: metadata of strings and no tensors at all.
  write_raw(file, R"({"__metadata__":{"format":"pt"}})", 0);
  EXPECT_TRUE(read_safetensors(file).empty());
}

TEST(SafetensorsBadFile, ATruncatedShard) {
  testing::TempDir dir("gradscope-safetensors");
  const Named tensors = {{"a", torch::randn({10})}, {"b", torch::randn({10})}};
  write_safetensors_set(dir.path(), tensors, 40);
  const std::string shard = dir.file("model-00002-of-00002.safetensors");
  ASSERT_EQ(::truncate(shard.c_str(), static_cast<off_t>(fs::file_size(shard) - 1)), 0);
  expect_refused(dir.path(), shard, {"tensor 'b'", "past the end of the data buffer"});
}

TEST(SafetensorsBadFile, AnIndexNamingAMissingShard) {
  testing::TempDir dir("gradscope-safetensors");
  write_safetensors_set(dir.path(), {{"a", torch::randn({10})}, {"b", torch::randn({10})}}, 40);
  const std::string shard = dir.file("model-00001-of-00002.safetensors");
  fs::remove(shard);
  expect_refused(dir.path(), shard, {"tensor 'a'", "which is missing"});
}

TEST(SafetensorsBadFile, AnIndexNamingAFileOutsideItsFolder) {
  testing::TempDir dir("gradscope-safetensors");
  fs::create_directory(dir.file("set"));
  write_safetensors(dir.file("x"), {{"a", torch::ones({1})}});
  write_safetensors(dir.file("set/x"), {{"a", torch::ones({1})}});
  const std::string index = dir.file("set/model.safetensors.index.json");
  for (const char* name : {"../x", "/etc/passwd", "sub/x", "..", ""}) {
    std::ofstream(index) << nlohmann::json({{"weight_map", {{"a", name}}}}).dump();
    expect_refused(dir.file("set"), index,
                   {"tensor 'a' maps to", "which is not a file of the index's folder"});
  }
}

TEST(SafetensorsBadFile, AnIndexAndShardsThatDisagree) {
  testing::TempDir dir("gradscope-safetensors");
  write_safetensors(dir.file("one.safetensors"), {{"a", torch::ones({1})}, {"b", torch::ones(1)}});
  write_safetensors(dir.file("two.safetensors"), {{"c", torch::ones({1})}});
  const std::string index = dir.file("model.safetensors.index.json");
  // b is in one.safetensors, but the index lists it nowhere.
  std::ofstream(index) << R"({"weight_map":{"a":"one.safetensors","c":"two.safetensors"}})";
  expect_refused(dir.path(), index, {"holds tensor 'b', which the index does not list"});
  // The index puts b in two.safetensors, which does not hold it.
  std::ofstream(index) << R"({"weight_map":{"a":"one.safetensors","b":"two.safetensors",)"
                          R"("c":"two.safetensors"}})";
  expect_refused(dir.path(), index,
                 {"holds tensor 'b', which the index puts in 'two.safetensors'"});
  // d is in no shard.
  std::ofstream(index) << R"({"weight_map":{"a":"one.safetensors","b":"one.safetensors",)"
                          R"("c":"two.safetensors","d":"two.safetensors"}})";
  expect_refused(dir.path(), index, {"tensor 'd'", "does not hold it"});
  std::ofstream(index) << R"({"weight_map":{"a":"one.safetensors","a":"two.safetensors"}})";
  expect_refused(dir.path(), index, {"key 'a' appears twice in 'weight_map'"});
  // Agreeing, the set reads.
  std::ofstream(index) << R"({"metadata":{"total_size":12},"weight_map":{"a":"one.safetensors",)"
                          R"("b":"one.safetensors","c":"two.safetensors"}})";
  EXPECT_EQ(read_safetensors(dir.path()).size(), 3u);
  fs::remove(index);
  expect_refused(dir.path(), dir.path(), {"holds neither"});
}

}  // namespace
}  // namespace safetensors_test
}  // namespace gradscope
