// Image data: IDX reading (plain and gzip, every kind of damage), IDX splits, class captions,
// PNG decoding of every colour type with alpha over white, the emoji set, data set folders,
// channel statistics and preprocessing.
// Fixtures: tests/fixtures/images, written by make_fixtures.py there; the pixel formulas below
// are the script's. Real data (skipped when absent): Debian's Fashion-MNIST, and MNIST and the
// emoji set fetched by scripts/fetch-data.sh; reference numbers from numpy over the same files.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <zlib.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/data/images.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

using testing::contains;
using testing::expect_usage_error;
using testing::TempDir;

std::string images_fixture(const std::string& name) { return testing::fixture("images/" + name); }

// make_fixtures.py: train images (5, 3, 4), test images (3, 3, 4).
int train_pixel(int n, int y, int x) { return (37 * n + 11 * y + 5 * x + 3) % 256; }
int test_pixel(int n, int y, int x) { return (200 + 7 * n + 13 * y + 2 * x) % 256; }

torch::Tensor expected_images(int count, int (*pixel)(int, int, int)) {
  torch::Tensor t = torch::empty({count, 3, 4}, torch::kUInt8);
  for (int n = 0; n < count; ++n)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x) t[n][y][x] = pixel(n, y, x);
  return t;
}

torch::Tensor u8(std::vector<int64_t> values, std::vector<int64_t> shape) {
  return torch::tensor(values, torch::kInt64).to(torch::kUInt8).view(shape);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// read_idx

TEST(ReadIdx, PlainFileDecodesExactly) {
  const torch::Tensor images = read_idx(images_fixture("idx/train-images-idx3-ubyte"));
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{5, 3, 4}));
  EXPECT_EQ(images.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(images, expected_images(5, train_pixel)));
  const torch::Tensor labels = read_idx(images_fixture("idx/train-labels-idx1-ubyte"));
  EXPECT_TRUE(torch::equal(labels, u8({3, 0, 9, 1, 7}, {5})));
}

TEST(ReadIdx, GzipFileDecodesExactly) {
  const torch::Tensor images = read_idx(images_fixture("idx/t10k-images-idx3-ubyte.gz"));
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{3, 3, 4}));
  EXPECT_TRUE(torch::equal(images, expected_images(3, test_pixel)));
  EXPECT_EQ(images[2][2][3].item<int>(), (200 + 14 + 26 + 6) % 256);  // wrapped past 255
  const torch::Tensor labels = read_idx(images_fixture("idx/t10k-labels-idx1-ubyte.gz"));
  EXPECT_TRUE(torch::equal(labels, u8({2, 8, 5}, {3})));
}

TEST(ReadIdx, GzipIsFoundByMagicNotByName) {
  const torch::Tensor images = read_idx(images_fixture("idx-bad/gzip-without-suffix.idx"));
  EXPECT_TRUE(torch::equal(images, expected_images(5, train_pixel)));
}

TEST(ReadIdx, EveryProblemNamesTheFile) {
  struct Case {
    std::string file;
    std::string expected;  // in the message, besides the file's path
  };
  const std::vector<Case> cases{
      {"idx/no-such-file", "does not exist"},
      {"idx-bad/truncated.idx", "expected 60 bytes of data (5x3x4), found 20"},
      {"idx-bad/truncated-header.idx", "truncated IDX header: rank 3 needs 12 bytes"},
      {"idx-bad/bad-magic.idx", "bad IDX magic 12 34 08 03"},
      {"idx-bad/int32.idx", "unsupported IDX type 0x0C (int32)"},
      {"idx-bad/zero-dim.idx", "IDX dimension 0 is zero"},
      {"idx-bad/absurd-dims.idx", "absurd IDX dimensions 4294967295x65535"},
      {"idx-bad/trailing.idx", "3 trailing bytes"},
      {"idx-bad/truncated.gz", "truncated gzip stream"},
      {"idx-bad/corrupt.gz", "corrupt gzip stream"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string path = images_fixture(c.file);
    const Error e = expect_usage_error([&] { read_idx(path); });
    EXPECT_TRUE(contains(e.what(), path)) << e.what();
    EXPECT_TRUE(contains(e.what(), c.expected)) << e.what();
  }
  const Error missing = expect_usage_error([] { read_idx(images_fixture("idx/nope")); });
  EXPECT_TRUE(contains(missing.hint(), "scripts/fetch-data.sh images")) << missing.hint();
}

// An IDX header: unsigned bytes, these dims.
std::string idx_header(const std::vector<uint32_t>& dims) {
  std::string out{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((d >> shift) & 0xff);
  return out;
}

std::string gzip_bytes(const std::string& bytes) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, bytes.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST(ReadIdxLimits, DecodesFromBytesAsFromTheFile) {
  const std::string path = images_fixture("idx/t10k-images-idx3-ubyte.gz");
  EXPECT_TRUE(torch::equal(decode_idx(testing::slurp(path), path), read_idx(path)));
  const std::string plain = images_fixture("idx/train-images-idx3-ubyte");
  EXPECT_TRUE(torch::equal(decode_idx(testing::slurp(plain), plain), read_idx(plain)));
  // Two gzip members read as one stream, as gzip(1) does.
  const std::string data = idx_header({2, 3}) + "abcdef";
  EXPECT_TRUE(
      torch::equal(decode_idx(gzip_bytes(data.substr(0, 7)) + gzip_bytes(data.substr(7)), "two"),
                   decode_idx(data, "one")));
}

TEST(ReadIdxLimits, DimsBeyondAGibibyteOrOverflowingAreRefused) {
  // 2 GiB claimed by a 16-byte file: once "truncated", now refused by the header alone.
  Error e = expect_usage_error([] { decode_idx(idx_header({2048, 1024, 1024}), "big.idx"); });
  EXPECT_TRUE(contains(e.what(), "big.idx: absurd IDX dimensions 2048x1024x1024")) << e.what();
  // A product that would overflow 64 bits stops at the first factor past the bound.
  e = expect_usage_error([] {
    decode_idx(idx_header({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}), "wrap.idx");
  });
  EXPECT_TRUE(contains(e.what(),
                       "absurd IDX dimensions 4294967295x4294967295x4294967295x"
                       "4294967295 (more than 1073741824 bytes"))
      << e.what();
}

TEST(ReadIdxLimits, AGzipHeaderClaimingMoreThanItsSizeCanHoldAllocatesNothing) {
  // 512 MiB claimed by a gzip file of a few dozen bytes: deflate cannot expand that much, so
  // the header is refused before a buffer is sized by it (it once allocated 256 MiB first).
  const std::string small = gzip_bytes(idx_header({512, 1024, 1024}) + "abc");
  const Error e = expect_usage_error([&] { decode_idx(small, "claims.gz"); });
  EXPECT_TRUE(contains(e.what(),
                       "claims.gz: the IDX header claims 536870912 bytes of data "
                       "(512x1024x1024), more than a gzip file of"))
      << e.what();
  // A header claiming less than the file could hold but more than it does hold is truncated;
  // the buffer grew with the data, not to the claim.
  std::string noise(1 << 16, '\0');
  uint32_t state = 12345;
  for (char& c : noise) c = static_cast<char>((state = state * 1103515245u + 12345u) >> 24);
  const std::string some = gzip_bytes(idx_header({16, 1024, 1024}) + noise);
  const Error t = expect_usage_error([&] { decode_idx(some, "short.gz"); });
  EXPECT_TRUE(contains(t.what(),
                       "short.gz: truncated IDX file: expected 16777216 bytes of data "
                       "(16x1024x1024), found 65536"))
      << t.what();
  // A gzip stream with more data than its header says.
  const std::string extra = gzip_bytes(idx_header({2, 2}) + "abcdefg");
  EXPECT_TRUE(contains(expect_usage_error([&] { decode_idx(extra, "x.gz"); }).what(),
                       "3 trailing bytes after the 4 bytes of 2x2 IDX data"));
}

// ---------------------------------------------------------------------------------------------
// load_idx_split

TEST(LoadIdxSplit, TrainIsPlainAndTestIsGzip) {
  const ImageSet train = load_idx_split(images_fixture("idx"), "train", fashion_mnist_classes());
  EXPECT_EQ(train.size(), 5);
  EXPECT_EQ(train.pixels.sizes(), (std::vector<int64_t>{5, 1, 3, 4}));
  EXPECT_EQ(train.pixels.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(train.pixels.squeeze(1), expected_images(5, train_pixel)));
  EXPECT_EQ(train.labels.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(train.labels, torch::tensor({3, 0, 9, 1, 7}, torch::kInt64)));
  EXPECT_EQ(train.class_names, fashion_mnist_classes());
  EXPECT_TRUE(train.captions.empty());

  const ImageSet test = load_idx_split(images_fixture("idx"), "test", mnist_classes());
  EXPECT_EQ(test.pixels.sizes(), (std::vector<int64_t>{3, 1, 3, 4}));
  EXPECT_TRUE(torch::equal(test.pixels.squeeze(1), expected_images(3, test_pixel)));
  EXPECT_TRUE(torch::equal(test.labels, torch::tensor({2, 8, 5}, torch::kInt64)));
}

TEST(LoadIdxSplit, NoClassNamesNumbersTheLabelsSeen) {
  const ImageSet train = load_idx_split(images_fixture("idx"), "train", {});
  EXPECT_EQ(train.class_names, mnist_classes());  // labels up to 9
  const ImageSet test = load_idx_split(images_fixture("idx"), "test", {});
  EXPECT_EQ(test.class_names.size(), 9u);  // labels up to 8
}

TEST(LoadIdxSplit, CountMismatchNamesBothFiles) {
  const std::string folder = images_fixture("idx-mismatch");
  const Error e = expect_usage_error([&] { load_idx_split(folder, "train", mnist_classes()); });
  EXPECT_TRUE(contains(e.what(), folder + "/train-images-idx3-ubyte holds 5 images")) << e.what();
  EXPECT_TRUE(contains(e.what(), folder + "/train-labels-idx1-ubyte holds 4 labels")) << e.what();
}

TEST(LoadIdxSplit, LabelOutsideTheClasses) {
  const std::string folder = images_fixture("idx-mismatch");
  const Error e = expect_usage_error([&] { load_idx_split(folder, "test", mnist_classes()); });
  EXPECT_TRUE(contains(e.what(), folder + "/t10k-labels-idx1-ubyte: label 10 of image 1"))
      << e.what();
  EXPECT_TRUE(contains(e.what(), "10 classes 0..9")) << e.what();
}

TEST(LoadIdxSplit, MissingFilesBadSplitAndWrongRank) {
  TempDir dir("gradscope-images");
  const Error missing = expect_usage_error([&] { load_idx_split(dir.path(), "train", {}); });
  EXPECT_TRUE(contains(missing.what(), dir.path() + "/train-images-idx3-ubyte")) << missing.what();
  EXPECT_TRUE(contains(missing.hint(), "scripts/fetch-data.sh images")) << missing.hint();

  const Error split = expect_usage_error([] { load_idx_split(images_fixture("idx"), "val", {}); });
  EXPECT_TRUE(contains(split.what(), "'val'")) << split.what();

  // A labels file where the images should be.
  fs::copy_file(images_fixture("idx/train-labels-idx1-ubyte"),
                dir.fs_path() / "train-images-idx3-ubyte");
  fs::copy_file(images_fixture("idx/train-labels-idx1-ubyte"),
                dir.fs_path() / "train-labels-idx1-ubyte");
  const Error rank = expect_usage_error([&] { load_idx_split(dir.path(), "train", {}); });
  EXPECT_TRUE(contains(rank.what(), "train-images-idx3-ubyte: images must be 3-D")) << rank.what();
}

// ---------------------------------------------------------------------------------------------
// class names and captions

TEST(ImageCaptions, FashionMnistAndMnist) {
  const std::vector<std::string> expected{"a photo of a t-shirt/top", "a photo of a trouser",
                                          "a photo of a pullover",    "a photo of a dress",
                                          "a photo of a coat",        "a photo of a sandal",
                                          "a photo of a shirt",       "a photo of a sneaker",
                                          "a photo of a bag",         "a photo of an ankle boot"};
  ASSERT_EQ(fashion_mnist_classes().size(), 10u);
  for (size_t c = 0; c < 10; ++c)
    EXPECT_EQ(templated_caption(fashion_mnist_classes()[c]), expected[c]);
  ASSERT_EQ(mnist_classes().size(), 10u);
  EXPECT_EQ(mnist_classes().front(), "0");
  EXPECT_EQ(mnist_classes().back(), "9");
  EXPECT_EQ(templated_caption("7", true), "a photo of the digit 7");
  EXPECT_EQ(templated_caption("Umbrella"), "a photo of an umbrella");
  EXPECT_EQ(templated_caption("Égg"), "a photo of a égg");  // articles look at ASCII vowels
}

// ---------------------------------------------------------------------------------------------
// read_png_rgb: (3, H, W), alpha over white

TEST(ReadPng, Rgb8) {
  const torch::Tensor rgb = read_png_rgb(images_fixture("png/rgb8.png"));
  EXPECT_EQ(rgb.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(rgb, u8({255, 0, 0, 10, 0, 255,  //
                                    0, 255, 0, 20, 0, 255,  //
                                    0, 0, 255, 30, 0, 255},
                                   {3, 2, 3})))
      << rgb;
}

TEST(ReadPng, Rgba8CompositesOverWhite) {
  // (200,100,50) opaque; the same fully transparent -> white; black at alpha 128 ->
  // 127*255/255 = 127; (10,20,30) at alpha 100 -> (100c + 155*255)/255 = 158.92, 162.84, 166.76,
  // rounded (not truncated) to 159, 163, 167.
  const torch::Tensor rgb = read_png_rgb(images_fixture("png/rgba8.png"));
  EXPECT_TRUE(torch::equal(rgb, u8({200, 255, 127, 159,  //
                                    100, 255, 127, 163,  //
                                    50, 255, 127, 167},
                                   {3, 1, 4})))
      << rgb;
}

TEST(ReadPng, PaletteWithTransparency) {
  // Indices [[red, green], [blue, transparent]].
  const torch::Tensor rgb = read_png_rgb(images_fixture("png/palette2.png"));
  EXPECT_TRUE(torch::equal(rgb, u8({255, 0, 0, 255,  //
                                    0, 255, 0, 255,  //
                                    0, 0, 255, 255},
                                   {3, 2, 2})))
      << rgb;
}

TEST(ReadPng, GreyDepthsAndGreyAlpha) {
  // 16 bit 0x0000, 0xFFFF, 0x00FF: scaled with rounding, so 0x00FF is 1, not 0.
  EXPECT_TRUE(torch::equal(read_png_rgb(images_fixture("png/grey16.png")),
                           u8({0, 255, 1}, {1, 1, 3}).expand({3, 1, 3})));
  // 1 bit 10110010.
  EXPECT_TRUE(torch::equal(read_png_rgb(images_fixture("png/grey1.png")),
                           u8({255, 0, 255, 255, 0, 0, 255, 0}, {1, 1, 8}).expand({3, 1, 8})));
  // Grey 100 opaque; grey 0 at alpha 51 -> 204*255/255 = 204.
  EXPECT_TRUE(torch::equal(read_png_rgb(images_fixture("png/grey-alpha8.png")),
                           u8({100, 204}, {1, 1, 2}).expand({3, 1, 2})));
}

TEST(ReadPng, BadFilesNameTheFileAndLibpngsMessage) {
  const std::string corrupt = images_fixture("png/corrupt.png");
  Error e = expect_usage_error([&] { read_png_rgb(corrupt); });
  EXPECT_TRUE(contains(e.what(), corrupt + ": cannot decode PNG")) << e.what();
  EXPECT_TRUE(contains(e.what(), "IDAT: invalid code lengths set")) << e.what();  // libpng's
  const std::string not_png = images_fixture("png/not-a-png.png");
  e = expect_usage_error([&] { read_png_rgb(not_png); });
  EXPECT_TRUE(contains(e.what(), not_png + ": cannot decode PNG: Not a PNG file")) << e.what();
  e = expect_usage_error([] { read_png_rgb(images_fixture("png/none.png")); });
  EXPECT_TRUE(contains(e.what(), "png/none.png does not exist")) << e.what();
  // Decoding goes on fine after a longjmp out of libpng.
  EXPECT_EQ(read_png_rgb(images_fixture("png/rgb8.png")).sizes(), (std::vector<int64_t>{3, 2, 3}));
}

// A PNG whose header claims width x height pixels (8-bit RGBA, or `colour`) and whose image
// data are one deflated zero byte: signature, IHDR, IDAT, IEND.
std::string png_claiming(uint32_t width, uint32_t height, int colour = 6) {
  auto be32 = [](uint32_t v) {
    std::string out;
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xff);
    return out;
  };
  auto chunk = [&](const std::string& type, const std::string& data) {
    const std::string body = type + data;
    const auto crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
    return be32(static_cast<uint32_t>(data.size())) + body + be32(crc);
  };
  const std::string ihdr =
      be32(width) + be32(height) + std::string{'\x08', static_cast<char>(colour), 0, 0, 0};
  const std::string one_zero_byte("\x78\x9c\x63\x00\x00\x00\x01\x00\x01", 9);
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", one_zero_byte) +
         chunk("IEND", "");
}

TEST(ReadPngLimits, DecodesFromBytesAsFromTheFile) {
  const std::string path = images_fixture("png/palette2.png");
  EXPECT_TRUE(torch::equal(decode_png_rgb(testing::slurp(path), path), read_png_rgb(path)));
  const Error e = expect_usage_error([] { decode_png_rgb("\x89PNG", "short.png"); });
  EXPECT_TRUE(contains(e.what(), "short.png: cannot decode PNG")) << e.what();
}

TEST(ReadPngLimits, HugeHeadersAreRefusedBeforeDecoding) {
  // 16000 x 16000 is within libpng's side limit, but more pixels than any data set's image:
  // refused from the header (it once allocated 1 GB and then failed).
  Error e = expect_usage_error([] { decode_png_rgb(png_claiming(16000, 16000), "a.png"); });
  EXPECT_TRUE(contains(e.what(),
                       "a.png: cannot decode PNG: the image has 16000x16000 pixels, "
                       "more than the 33554432"))
      << e.what();
  // 4096 x 4096 RGBA is 64 MiB of samples, which a file of a few dozen bytes cannot inflate to.
  const std::string claims = png_claiming(4096, 4096);
  e = expect_usage_error([&] { decode_png_rgb(claims, "b.png"); });
  EXPECT_TRUE(contains(e.what(),
                       "b.png: cannot decode PNG: the header claims 4096x4096 pixels, "
                       "more than a file of " +
                           std::to_string(claims.size()) + " bytes can hold"))
      << e.what();
  // A side past the limit is libpng's to refuse.
  e = expect_usage_error([] { decode_png_rgb(png_claiming(100000, 1), "c.png"); });
  EXPECT_TRUE(contains(e.what(), "c.png: cannot decode PNG")) << e.what();
  // A small image with too little data is only truncated.
  e = expect_usage_error([] { decode_png_rgb(png_claiming(4, 4), "d.png"); });
  EXPECT_TRUE(contains(e.what(), "d.png: cannot decode PNG")) << e.what();
}

// ---------------------------------------------------------------------------------------------
// load_emoji

const std::vector<std::string> kEmojiCaptions{
    "åland islands flag",                                       // 1f1e6-1f1fd.png
    "thumbs up sign, light skin tone, medium-light skin tone",  // 1f44d-1f3fb-1f3fc.png
    "thumbs up sign, light skin tone",                          // 1f44d-1f3fb.png
    "thumbs up sign, dark skin tone",                           // 1f44d-1f3ff-1f3ff.png
    "thumbs up sign",                                           // 1f44d.png
    "grinning face",                                            // 1f600.png (from short_name)
};

// A copy of the fixture set that a test may damage.
class EmojiCopy : public ::testing::Test {
 protected:
  void SetUp() override { fs::copy(images_fixture("emoji"), folder_, fs::copy_options::recursive); }
  void replace_image(const std::string& image, const std::string& png_fixture) {
    fs::copy_file(images_fixture(png_fixture), fs::path(folder_) / "img" / image,
                  fs::copy_options::overwrite_existing);
  }
  TempDir dir_{"gradscope-emoji"};
  std::string folder_ = dir_.file("emoji");
};

TEST(LoadEmoji, FixtureSetInFileNameOrder) {
  const ImageSet set = load_emoji(images_fixture("emoji"), 4);
  ASSERT_EQ(set.size(), 6);
  EXPECT_EQ(set.captions, kEmojiCaptions);
  EXPECT_EQ(set.pixels.sizes(), (std::vector<int64_t>{6, 3, 4, 4}));
  EXPECT_EQ(set.pixels.scalar_type(), torch::kUInt8);
  EXPECT_FALSE(set.labels.defined());
  EXPECT_TRUE(set.class_names.empty());
  auto solid = [](int r, int g, int b) { return u8({r, g, b}, {3, 1, 1}).expand({3, 4, 4}); };
  EXPECT_TRUE(torch::equal(set.pixels[0], solid(0, 0, 255)));
  EXPECT_TRUE(torch::equal(set.pixels[1], solid(255, 255, 255)));  // transparent -> white
  EXPECT_TRUE(torch::equal(set.pixels[3], solid(90, 60, 30)));
  // 1f600: pixel (y, x) = (60 x, 60 y, 7).
  const torch::Tensor ramp = torch::arange(4, torch::kInt64).mul(60).to(torch::kUInt8);
  EXPECT_TRUE(torch::equal(set.pixels[5][0], ramp.view({1, 4}).expand({4, 4})));
  EXPECT_TRUE(torch::equal(set.pixels[5][1], ramp.view({4, 1}).expand({4, 4})));
  EXPECT_TRUE(torch::equal(set.pixels[5][2], torch::full({4, 4}, 7, torch::kUInt8)));
}

TEST(LoadEmoji, MaxImagesTakesTheFirstInOrder) {
  const ImageSet all = load_emoji(images_fixture("emoji"), 4);
  const ImageSet two = load_emoji(images_fixture("emoji"), 4, 2);
  ASSERT_EQ(two.size(), 2);
  EXPECT_EQ(two.captions,
            std::vector<std::string>(kEmojiCaptions.begin(), kEmojiCaptions.begin() + 2));
  EXPECT_TRUE(torch::equal(two.pixels, all.pixels.slice(0, 0, 2)));
  EXPECT_EQ(load_emoji(images_fixture("emoji"), 4, 100).size(), 6);
}

// Every mechanism by which the emoji set makes a variant of an emoji leads back to one base.
TEST(EmojiBase, TakesOutTonesSelectorsGenderAndDirection) {
  EXPECT_EQ(emoji_base("1F44D"), "1F44D");
  EXPECT_EQ(emoji_base("1f44d-1f3fb"), "1F44D");
  EXPECT_EQ(emoji_base("1F44D-1F3FF-1F3FF"), "1F44D");
  EXPECT_EQ(emoji_base("2764-FE0F"), "2764");
  EXPECT_EQ(emoji_base("2764-FE0E"), "2764");
  EXPECT_EQ(emoji_base("0023-FE0F-20E3"), "23-20E3");
  EXPECT_EQ(emoji_base("1F3C3-1F3FB-200D-2640-FE0F"), "1F3C3");
  EXPECT_EQ(emoji_base("1F3C3-200D-2642-FE0F-200D-27A1-FE0F"), "1F3C3");
  EXPECT_EQ(emoji_base("1F468-200D-1F4BB"), "1F9D1-200D-1F4BB");
  EXPECT_EQ(emoji_base("1F469-1F3FD-200D-1F4BB"), "1F9D1-200D-1F4BB");
  EXPECT_EQ(emoji_base("1F468-200D-1F469-200D-1F467"), "1F9D1-200D-1F9D1-200D-1F9D2");
  EXPECT_EQ(emoji_base("1F475"), "1F9D3");
  // A joiner before anything else stays: "heart on fire" is not "heart".
  EXPECT_EQ(emoji_base("2764-FE0F-200D-1F525"), "2764-200D-1F525");
  EXPECT_EQ(emoji_base("1F1E6-1F1FD"), "1F1E6-1F1FD");
}

TEST(LoadEmoji, VariantsShareTheirBaseEmojiGroup) {
  const ImageSet set = load_emoji(images_fixture("emoji-variants"), 64);
  ASSERT_EQ(set.size(), 27);
  ASSERT_EQ(set.groups.size(), 27u);
  std::map<std::string, std::set<std::string>> groups_of;  // entry name -> its images' groups
  std::set<std::string> all;
  for (int64_t i = 0; i < set.size(); ++i) {
    const std::string& caption = set.captions[i];
    groups_of[caption.substr(0, caption.find(','))].insert(set.groups[i]);
    all.insert(set.groups[i]);
  }
  // 10 single emoji, thumbs up (6 tones), running (runner, man, woman, facing right and 2
  // tones), technologist (man, woman, person), family (old and new code).
  EXPECT_EQ(all.size(), 14u);
  const auto same = [&](const std::vector<std::string>& names) {
    std::set<std::string> groups;
    for (const auto& name : names) {
      EXPECT_EQ(groups_of.count(name), 1u) << name;
      groups.insert(groups_of[name].begin(), groups_of[name].end());
    }
    EXPECT_EQ(groups.size(), 1u) << names.front();
  };
  same({"thumbs up sign"});
  same({"runner", "man running", "woman running", "person running facing right"});
  same({"man technologist", "woman technologist", "technologist"});
  same({"family", "family: man"});
  // Group names do not depend on the list's order: the smallest base of the group.
  EXPECT_EQ(*groups_of["man running"].begin(), "1F3C3");
  EXPECT_EQ(*groups_of["family"].begin(), "1F46A");
}

TEST(HeldOutByGroup, KeepsGroupsWholeAndHoldsOutAboutOneInTen) {
  // 100 items in 33 interleaved groups: g0 of 4 items, g1..g32 of 3.
  std::vector<std::string> groups;
  for (int64_t i = 0; i < 100; ++i) groups.push_back("g" + std::to_string(i % 33));
  const auto held = held_out_by_group(groups, 100, 10);
  ASSERT_EQ(held.size(), 100u);
  std::map<std::string, std::set<bool>> sides;
  for (size_t i = 0; i < held.size(); ++i) sides[groups[i]].insert(held[i]);
  int64_t held_groups = 0;
  for (const auto& [group, side] : sides) {
    EXPECT_EQ(side.size(), 1u) << group;
    held_groups += *side.begin();
  }
  // Ordered by size, then first item: g1..g32, g0; the 1st, 11th, 21st and 31st are held out.
  EXPECT_EQ(held_groups, 4);
  EXPECT_EQ(std::count(held.begin(), held.end(), true), 12);
  EXPECT_TRUE(held[1] && held[11] && held[21] && held[31]);
  // Deterministic, and one item per group without names: every tenth item from the first.
  EXPECT_EQ(held_out_by_group(groups, 100, 10), held);
  const auto single = held_out_by_group({}, 25, 10);
  for (size_t i = 0; i < single.size(); ++i) EXPECT_EQ(single[i], i % 10 == 0) << i;
  expect_usage_error([] { held_out_by_group({"a"}, 2, 10); });
  expect_usage_error([] { held_out_by_group({}, 2, 0); });
}

TEST(LoadEmoji, WrongSizeNamesTheFileAndItsSize) {
  const std::string folder = images_fixture("emoji");
  const Error e = expect_usage_error([&] { load_emoji(folder, 64); });
  EXPECT_TRUE(contains(e.what(), folder + "/img/1f1e6-1f1fd.png is 4x4 pixels")) << e.what();
  EXPECT_TRUE(contains(e.what(), "64x64")) << e.what();
}

TEST_F(EmojiCopy, WrongSizeImage) {
  replace_image("1f44d.png", "png/wrong-size-5x4.png");
  const Error e = expect_usage_error([&] { load_emoji(folder_, 4); });
  EXPECT_TRUE(contains(e.what(), folder_ + "/img/1f44d.png is 5x4 pixels")) << e.what();
  EXPECT_EQ(load_emoji(folder_, 4, 4).size(), 4);  // the images before it are fine
}

TEST_F(EmojiCopy, CorruptImage) {
  replace_image("1f600.png", "png/corrupt.png");
  const Error e = expect_usage_error([&] { load_emoji(folder_, 4); });
  EXPECT_TRUE(contains(e.what(), folder_ + "/img/1f600.png: cannot decode PNG")) << e.what();
}

TEST_F(EmojiCopy, MissingImageWithAGoogleImageIsAnError) {
  fs::remove(fs::path(folder_) / "img" / "1f44d-1f3fb.png");
  // Even when max_images would not reach it.
  const Error e = expect_usage_error([&] { load_emoji(folder_, 4, 1); });
  EXPECT_TRUE(contains(e.what(), folder_ + "/img/1f44d-1f3fb.png is missing")) << e.what();
}

TEST_F(EmojiCopy, MissingAndMalformedJson) {
  const std::string json = folder_ + "/emoji.json";
  {
    std::ofstream out(json, std::ios::trunc);
    out << "[{\"name\": \"GRINNING FACE\", ";
  }
  Error e = expect_usage_error([&] { load_emoji(folder_, 4); });
  EXPECT_TRUE(contains(e.what(), json + ": it is not valid JSON")) << e.what();
  {
    std::ofstream out(json, std::ios::trunc);
    out << std::string(1000, '[') << std::string(1000, ']');
  }
  e = expect_usage_error([&] { load_emoji(folder_, 4); });
  EXPECT_TRUE(contains(e.what(), json + ": it nests arrays and objects deeper than")) << e.what();
  fs::remove(json);
  e = expect_usage_error([&] { load_emoji(folder_, 4); });
  EXPECT_TRUE(contains(e.what(), json + " does not exist")) << e.what();
  EXPECT_TRUE(contains(e.hint(), "scripts/fetch-data.sh emoji")) << e.hint();
}

TEST_F(EmojiCopy, ImageNamesThatLeaveImgAreRefused) {
  const std::string json = folder_ + "/emoji.json";
  for (const std::string image : {"../emoji.json", "/etc/passwd", "..", "sub/1f600.png"}) {
    SCOPED_TRACE(image);
    nlohmann::json entry;
    entry["name"] = "X";
    entry["image"] = image;
    entry["has_img_google"] = true;
    { std::ofstream(json, std::ios::trunc) << nlohmann::json::array({entry}).dump(); }
    const Error e = expect_usage_error([&] { load_emoji(folder_, 4); });
    EXPECT_TRUE(contains(e.what(), json + ": entry 0 ('x') names the image '" + image +
                                       "', which is not a file name in img/"))
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// image_dataset_folder

TEST(ImageDatasetFolder, NamesPathsAndTheDebianFallback) {
  TempDir data("gradscope-images");
  EXPECT_EQ(image_dataset_folder("mnist", data.path()), data.path() + "/images/mnist");
  EXPECT_EQ(image_dataset_folder("emoji", data.path()), data.path() + "/emoji");
  const std::string own = data.path() + "/images/fashion-mnist";
  EXPECT_EQ(image_dataset_folder("fashion-mnist", data.path()),
            fs::is_directory(kDebianFashionMnistDir) ? std::string(kDebianFashionMnistDir) : own);
  fs::create_directories(own);
  EXPECT_EQ(image_dataset_folder("fashion-mnist", data.path()), own);
  EXPECT_EQ(image_dataset_folder(images_fixture("idx"), data.path()), images_fixture("idx"));
  EXPECT_EQ(image_dataset_registry().names(),
            (std::vector<std::string>{"fashion-mnist", "mnist", "emoji"}));

  const Error e = expect_usage_error([&] { image_dataset_folder("cifar10", data.path()); });
  EXPECT_TRUE(contains(e.what(), "'cifar10'")) << e.what();
  EXPECT_TRUE(contains(e.hint(), "fashion-mnist, mnist, emoji")) << e.hint();
  expect_usage_error([&] { image_dataset_folder(data.path() + "/nowhere", data.path()); });
}

// ---------------------------------------------------------------------------------------------
// channel_stats and preprocess_images

TEST(ImageStats, ClosedFormAndFloat64Reference) {
  // Channel 0: 0, 255, 0, 255 -> mean 0.5, std 0.5; channel 1: all 51 -> mean 0.2, std 0.
  const torch::Tensor x = u8({0, 255, 51, 51, 0, 255, 51, 51}, {2, 2, 1, 2});
  auto [mean, std] = channel_stats(x);
  ASSERT_EQ(mean.size(), 2u);
  EXPECT_DOUBLE_EQ(mean[0], 0.5);
  EXPECT_DOUBLE_EQ(std[0], 0.5);
  EXPECT_NEAR(mean[1], 0.2, 1e-15);
  EXPECT_EQ(std[1], 0.0);

  torch::manual_seed(3);
  const torch::Tensor r = torch::randint(0, 256, {7, 3, 5, 6}, torch::kInt64).to(torch::kUInt8);
  const torch::Tensor f = r.to(torch::kFloat64).div(255).transpose(0, 1).reshape({3, -1});
  std::tie(mean, std) = channel_stats(r.transpose(2, 3));  // not contiguous: same statistics
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(mean[c], f[c].mean().item<double>(), 1e-14);
    EXPECT_NEAR(std[c], f[c].std(/*unbiased=*/false).item<double>(), 1e-14);
  }
  expect_usage_error([] { channel_stats(torch::zeros({2, 1, 3, 3})); });  // float
  expect_usage_error([] { channel_stats(torch::zeros({0, 1, 3, 3}, torch::kUInt8)); });
}

TEST(PreprocessImages, SameSizeOnlyScalesAndNormalizes) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randint(0, 256, {2, 3, 4, 4}, torch::kInt64).to(torch::kUInt8);
  const std::vector<double> mean{0.1, 0.5, 0.9}, std{0.2, 0.3, 0.4};
  const torch::Tensor y = preprocess_images(x, 4, mean, std);
  EXPECT_EQ(y.scalar_type(), torch::kFloat32);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 4, 4}));
  for (int c = 0; c < 3; ++c) {
    const torch::Tensor expected = (x.select(1, c).to(torch::kFloat64) / 255 - mean[c]) / std[c];
    EXPECT_TRUE(torch::allclose(y.select(1, c).to(torch::kFloat64), expected, 1e-6, 1e-6));
  }
}

TEST(PreprocessImages, GreyUpsampledBilinearAndReplicated) {
  // align_corners = false, 2 -> 4: output i samples source (i + 0.5) / 2 - 0.5 = -0.25 (clamped
  // to 0), 0.25, 0.75, 1.25 (clamped to 1), so along each axis the weights of the two source
  // pixels are (1, 0), (3/4, 1/4), (1/4, 3/4), (0, 1).
  const torch::Tensor x = u8({0, 100, 200, 255}, {1, 1, 2, 2});
  const double v[2][2] = {{0, 100}, {200, 255}};
  const double w[4][2] = {{1, 0}, {0.75, 0.25}, {0.25, 0.75}, {0, 1}};
  const double mean = 0.25, std = 0.5;
  const torch::Tensor y = preprocess_images(x, 4, {mean}, {std});
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 3, 4, 4}));
  EXPECT_TRUE(y.is_contiguous());
  double worst = 0;
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        double value = 0;
        for (int k = 0; k < 2; ++k)
          for (int l = 0; l < 2; ++l) value += w[i][k] * w[j][l] * v[k][l];
        const double expected = (value / 255 - mean) / std;
        worst = std::max(worst, std::abs(y[0][c][i][j].item<double>() - expected));
      }
  EXPECT_LT(worst, 1e-6);
}

TEST(PreprocessImages, DownsampleByTwoAveragesBlocks) {
  // 4 -> 2 samples source (i + 0.5) * 2 - 0.5 = 0.5, 2.5: the mean of each 2x2 block.
  torch::manual_seed(9);
  const torch::Tensor x = torch::randint(0, 256, {2, 3, 4, 4}, torch::kInt64).to(torch::kUInt8);
  const torch::Tensor y = preprocess_images(x, 2, {0, 0, 0}, {1, 1, 1});
  const torch::Tensor blocks =
      x.to(torch::kFloat64).div(255).view({2, 3, 2, 2, 2, 2}).mean({3, 5});  // (B, C, 2, 2)
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat64), blocks, 1e-6, 1e-6));
}

TEST(PreprocessImages, BadInputs) {
  const torch::Tensor grey = torch::zeros({1, 1, 2, 2}, torch::kUInt8);
  expect_usage_error([&] { preprocess_images(grey, 2, {0, 0, 0}, {1, 1, 1}); });  // C = 1
  expect_usage_error([&] { preprocess_images(grey, 2, {0}, {0}); });              // std 0
  expect_usage_error([&] { preprocess_images(grey, 0, {0}, {1}); });
  expect_usage_error([] { preprocess_images(torch::zeros({1, 1, 2, 2}), 2, {0}, {1}); });
  expect_usage_error([] {
    preprocess_images(torch::zeros({1, 2, 2, 2}, torch::kUInt8), 2, {0, 0}, {1, 1});
  });
}

// ---------------------------------------------------------------------------------------------
// Real data. Reference numbers: numpy (float64) over the same files.

TEST(RealImageData, FashionMnistFromDebian) {
  if (!fs::is_directory(kDebianFashionMnistDir))
    GTEST_SKIP() << kDebianFashionMnistDir << " missing (scripts/install-deps.sh installs it)";
  const auto start = std::chrono::steady_clock::now();
  const ImageSet train = load_idx_split(kDebianFashionMnistDir, "train", fashion_mnist_classes());
  const ImageSet test = load_idx_split(kDebianFashionMnistDir, "test", fashion_mnist_classes());
  const double load_s = seconds_since(start);
  EXPECT_EQ(train.pixels.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(test.pixels.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(train.labels.bincount(), torch::full({10}, 6000, torch::kInt64)));
  EXPECT_TRUE(torch::equal(test.labels.bincount(), torch::full({10}, 1000, torch::kInt64)));
  EXPECT_TRUE(torch::equal(train.labels.slice(0, 0, 10),
                           torch::tensor({9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, torch::kInt64)));
  EXPECT_EQ(train.class_names[train.labels[0].item<int64_t>()], "Ankle boot");
  EXPECT_EQ(train.pixels[0].sum().item<int64_t>(), 76247);
  EXPECT_EQ(test.pixels[0].sum().item<int64_t>(), 33456);

  const auto stats_start = std::chrono::steady_clock::now();
  const auto [mean, std] = channel_stats(train.pixels);
  const double stats_s = seconds_since(stats_start);
  EXPECT_NEAR(mean[0], 0.2860405969887955, 1e-12);
  EXPECT_NEAR(std[0], 0.35302424451492237, 1e-12);
  std::printf(
      "[          ] Fashion-MNIST (Debian, gzip): train+test loaded in %.2f s; "
      "train mean %.6f std %.6f in %.3f s\n",
      load_s, mean[0], std[0], stats_s);
}

TEST(RealImageData, MnistFetched) {
  const std::string folder = image_dataset_folder("mnist", data_dir());
  if (!fs::exists(folder + "/train-images-idx3-ubyte"))
    GTEST_SKIP() << "MNIST not fetched into " << data_dir()
                 << " (run scripts/fetch-data.sh images)";
  const auto start = std::chrono::steady_clock::now();
  const ImageSet train = load_idx_split(folder, "train", mnist_classes());
  const double load_s = seconds_since(start);
  EXPECT_EQ(train.pixels.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(
      train.labels.bincount(),
      torch::tensor({5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949}, torch::kInt64)));
  EXPECT_EQ(templated_caption(train.class_names[train.labels[0].item<int64_t>()], true),
            "a photo of the digit 5");
  const auto [mean, std] = channel_stats(train.pixels);
  EXPECT_NEAR(mean[0], 0.1306604762738429, 1e-12);
  EXPECT_NEAR(std[0], 0.3081078038564622, 1e-12);
  std::printf("[          ] MNIST (plain): train loaded in %.2f s\n", load_s);
}

TEST(RealImageData, EmojiFetched) {
  const std::string folder = image_dataset_folder("emoji", data_dir());
  if (!fs::exists(folder + "/emoji.json"))
    GTEST_SKIP() << "emoji not fetched into " << data_dir() << " (run scripts/fetch-data.sh emoji)";
  const auto start = std::chrono::steady_clock::now();
  const ImageSet set = load_emoji(folder);
  const double load_s = seconds_since(start);
  EXPECT_EQ(set.pixels.sizes(), (std::vector<int64_t>{3786, 3, 64, 64}));
  ASSERT_EQ(set.captions.size(), 3786u);
  EXPECT_EQ(set.captions.front(), "hash key");  // 0023-fe0f-20e3.png
  for (const char* caption :
       {"grinning face", "father christmas, dark skin tone", "åland islands flag"})
    EXPECT_NE(std::find(set.captions.begin(), set.captions.end(), caption), set.captions.end())
        << caption;
  const auto [mean, std] = channel_stats(set.pixels);
  std::printf("[          ] emoji: %lld images in %.2f s; RGB mean %.3f %.3f %.3f\n",
              static_cast<long long>(set.size()), load_s, mean[0], mean[1], mean[2]);
}

}  // namespace
}  // namespace gradscope
