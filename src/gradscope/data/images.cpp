#include "gradscope/data/images.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"

namespace gradscope {
namespace fs = std::filesystem;

namespace {

std::string images_fetch_hint() {
  return "run scripts/fetch-data.sh images (or make data) to fetch MNIST and Fashion-MNIST into "
         "$GRADSCOPE_DATA (default ~/.cache/gradscope)";
}

constexpr char kIdxCutHint[] =
    "the download was cut short: fetch a whole copy (scripts/fetch-data.sh images)";
constexpr char kIdxDamagedHint[] =
    "the file is damaged: fetch a whole copy (scripts/fetch-data.sh images)";

// ---------------------------------------------------------------------------------------------
// IDX

// More data than this in one IDX file means a corrupt header, not a data set (MNIST's training
// images are 47 MB, EMNIST's largest set 550 MB).
constexpr uint64_t kIdxMaxBytes = uint64_t{1} << 30;
constexpr int kIdxMaxRank = 8;
// The largest IDX file read: the data and the longest header.
constexpr int64_t kIdxMaxFileBytes = static_cast<int64_t>(kIdxMaxBytes) + 4 + 4 * kIdxMaxRank;
// A gzip stream's data arrive into a buffer that starts this big and doubles as they come, so
// what is allocated stays within twice what the stream really holds.
constexpr size_t kInflateFirstBytes = size_t{1} << 20;
// Trailing data are counted up to this much; a message says "more than" past it.
constexpr uint64_t kTrailingCountLimit = uint64_t{1} << 20;

const char* idx_type_name(int type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return nullptr;
  }
}

bool gzip_magic(std::string_view bytes, size_t at = 0) {
  return bytes.size() >= at + 2 && static_cast<unsigned char>(bytes[at]) == 0x1f &&
         static_cast<unsigned char>(bytes[at + 1]) == 0x8b;
}

// The bytes of an IDX file, read in order: a plain file as it is, a gzip file (found by its
// magic bytes, not its name) inflated as it is read, member after member as gzip(1) does;
// bytes after the last member that start no other member are ignored, as zlib's gzread does.
// Every stream error is a usage error naming the file.
class IdxStream {
 public:
  IdxStream(std::string_view bytes, const std::string& source)
      : bytes_(bytes), source_(source), gzip_(gzip_magic(bytes)) {
    if (!gzip_) return;
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) fail_runtime("cannot start zlib's inflate");
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes_.data()));
    z_.avail_in = 0;
    started_ = true;
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;
  ~IdxStream() {
    if (started_) inflateEnd(&z_);
  }

  bool gzip() const { return gzip_; }
  // A plain file's offset of the next byte.
  size_t position() const { return pos_; }

  // Reads up to n bytes into dst; fewer only at the end of the data.
  size_t read(void* dst, size_t n) {
    if (!gzip_) {
      const size_t got = std::min(n, bytes_.size() - pos_);
      std::memcpy(dst, bytes_.data() + pos_, got);
      pos_ += got;
      return got;
    }
    size_t done = 0;
    while (done < n && !finished_) {
      // zlib counts in unsigned int: feed and drain it in pieces below 4 GiB.
      constexpr size_t kPiece = size_t{1} << 30;
      if (z_.avail_in == 0 && pos_ < bytes_.size()) {
        const size_t feed = std::min(bytes_.size() - pos_, kPiece);
        z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes_.data() + pos_));
        z_.avail_in = static_cast<uInt>(feed);
        pos_ += feed;
      }
      const size_t want = std::min(n - done, kPiece);
      z_.next_out = static_cast<Bytef*>(dst) + done;
      z_.avail_out = static_cast<uInt>(want);
      const int code = inflate(&z_, Z_NO_FLUSH);
      done += want - z_.avail_out;
      if (code == Z_STREAM_END) {
        next_member();
      } else if (code == Z_BUF_ERROR ||
                 (code == Z_OK && z_.avail_in == 0 && pos_ == bytes_.size() && z_.avail_out > 0)) {
        // No progress is possible: the input ran out in the middle of a member.
        if (z_.avail_in == 0 && pos_ == bytes_.size())
          fail_usage(fmt::format("{}: truncated gzip stream (unexpected end of file)", source_),
                     kIdxCutHint);
      } else if (code != Z_OK) {
        fail_usage(fmt::format("{}: corrupt gzip stream ({})", source_,
                               z_.msg ? z_.msg : "inflate failed"),
                   kIdxDamagedHint);
      }
    }
    return done;
  }

  // How many bytes are left (reads them), counted up to `limit`; more than `limit` gives
  // limit + 1.
  uint64_t skip(uint64_t limit) {
    if (!gzip_) return std::min<uint64_t>(bytes_.size() - pos_, limit + 1);
    char buffer[1 << 14];
    uint64_t total = 0;
    for (size_t got; total <= limit && (got = read(buffer, sizeof(buffer))) > 0;) total += got;
    return std::min(total, limit + 1);
  }

 private:
  // After a member's end: another member starts where its magic bytes stand; anything else
  // ends the stream.
  void next_member() {
    const size_t at = pos_ - z_.avail_in;
    if (!gzip_magic(bytes_, at)) {
      finished_ = true;
      return;
    }
    if (inflateReset(&z_) != Z_OK) fail_runtime("cannot restart zlib's inflate");
  }

  std::string_view bytes_;
  std::string source_;
  bool gzip_ = false;
  bool started_ = false;
  bool finished_ = false;
  size_t pos_ = 0;  // next byte of bytes_ not yet read (plain) or not yet fed to zlib (gzip)
  z_stream z_{};
};

uint32_t big_endian_u32(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out;
  for (int64_t d : dims) out += (out.empty() ? "" : "x") + std::to_string(d);
  return out;
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail_usage(fmt::format("IDX file {} does not exist", path), images_fetch_hint());
  if (!fs::is_regular_file(path, ec)) fail_usage(fmt::format("{} is not a file", path));
  return decode_idx(read_input_file(path, "IDX file", kIdxMaxFileBytes), path);
}

torch::Tensor decode_idx(std::string contents, const std::string& source) {
  const std::string& path = source;
  // Held by the tensor of a plain file, whose data are used where they lie.
  auto owned = std::make_shared<std::string>(std::move(contents));
  IdxStream reader(*owned, path);

  // Header: 00 00 TYPE RANK, then RANK big-endian uint32 dimensions.
  unsigned char magic[4];
  const size_t got_magic = reader.read(magic, 4);
  if (got_magic < 4)
    fail_usage(fmt::format("{}: truncated IDX header ({} bytes, a header has at least 4)", path,
                           got_magic));
  if (magic[0] != 0 || magic[1] != 0)
    fail_usage(fmt::format("{}: bad IDX magic {:02x} {:02x} {:02x} {:02x} (an IDX file starts "
                           "with 00 00, a type byte and the rank)",
                           path, magic[0], magic[1], magic[2], magic[3]),
               "is it an IDX file (MNIST's *-ubyte format)?");
  const int type = magic[2];
  if (type != 0x08) {
    const char* name = idx_type_name(type);
    fail_usage(name ? fmt::format("{}: unsupported IDX type 0x{:02X} ({}); only unsigned bytes "
                                  "(0x08) are supported",
                                  path, type, name)
                    : fmt::format("{}: bad IDX magic: unknown type byte 0x{:02X}", path, type));
  }
  const int rank = magic[3];
  if (rank < 1 || rank > kIdxMaxRank)
    fail_usage(fmt::format("{}: IDX rank {} is outside 1..{}", path, rank, kIdxMaxRank));
  unsigned char dim_bytes[4 * kIdxMaxRank];
  const size_t got_dims = reader.read(dim_bytes, 4 * rank);
  if (got_dims < static_cast<size_t>(4 * rank))
    fail_usage(
        fmt::format("{}: truncated IDX header: rank {} needs {} bytes of dimensions, found {}",
                    path, rank, 4 * rank, got_dims));
  std::vector<int64_t> dims(rank);
  for (int i = 0; i < rank; ++i) dims[i] = big_endian_u32(dim_bytes + 4 * i);
  for (int i = 0; i < rank; ++i)
    if (dims[i] == 0)
      fail_usage(fmt::format("{}: IDX dimension {} is zero ({})", path, i, dims_text(dims)));
  uint64_t bytes = 1;
  for (int i = 0; i < rank; ++i) {
    // At most 2^30 * (2^32 - 1) < 2^64: the product is checked before it can overflow.
    bytes *= static_cast<uint64_t>(dims[i]);
    if (bytes > kIdxMaxBytes)
      fail_usage(fmt::format("{}: absurd IDX dimensions {} (more than {} bytes of data)", path,
                             dims_text(dims), kIdxMaxBytes));
  }

  if (!reader.gzip()) {
    // A plain file's data are checked against its size and used where they lie, uncopied.
    const uint64_t found = owned->size() - reader.position();
    if (found < bytes)
      fail_usage(fmt::format("{}: truncated IDX file: expected {} bytes of data ({}), found {}",
                             path, bytes, dims_text(dims), found),
                 kIdxCutHint);
    if (found > bytes)
      fail_usage(fmt::format("{}: {} trailing bytes after the {} bytes of {} IDX data", path,
                             found - bytes, bytes, dims_text(dims)),
                 "is it an IDX file (MNIST's *-ubyte format)?");
    auto* holder = new std::shared_ptr<std::string>(owned);
    return torch::from_blob(
        owned->data() + reader.position(), dims, [holder](void*) { delete holder; }, torch::kUInt8);
  }

  // A gzip stream cannot hold more than kDeflateMaxRatio times its size; a header claiming
  // more is corrupt, and is refused before anything that size is allocated.
  if (bytes > kDeflateMaxRatio * owned->size())
    fail_usage(fmt::format("{}: the IDX header claims {} bytes of data ({}), more than a gzip "
                           "file of {} bytes can hold",
                           path, bytes, dims_text(dims), owned->size()),
               kIdxDamagedHint);
  // Its length is known only at its end, so the buffer grows as data arrive: a header that
  // overstates the data costs at most twice what the stream holds.
  auto buffer = std::make_unique<std::vector<uint8_t>>();
  size_t have = 0;
  while (have < bytes) {
    const size_t size = std::min<uint64_t>(bytes, std::max(kInflateFirstBytes, 2 * have));
    buffer->resize(size);
    const size_t got = reader.read(buffer->data() + have, size - have);
    have += got;
    if (have < size) break;
  }
  if (have < bytes)
    fail_usage(fmt::format("{}: truncated IDX file: expected {} bytes of data ({}), found {}", path,
                           bytes, dims_text(dims), have),
               kIdxCutHint);
  const uint64_t trailing = reader.skip(kTrailingCountLimit);
  if (trailing > 0)
    fail_usage(fmt::format("{}: {}{} trailing bytes after the {} bytes of {} IDX data", path,
                           trailing > kTrailingCountLimit ? "more than " : "",
                           std::min(trailing, kTrailingCountLimit), bytes, dims_text(dims)),
               "is it an IDX file (MNIST's *-ubyte format)?");
  std::vector<uint8_t>* data = buffer.release();
  return torch::from_blob(
      data->data(), dims, [data](void*) { delete data; }, torch::kUInt8);
}

namespace {

// folder/base, or folder/base.gz when only that exists.
std::string find_idx_file(const std::string& folder, const std::string& base) {
  const fs::path plain = fs::path(folder) / base;
  std::error_code ec;
  if (fs::exists(plain, ec)) return plain.string();
  const fs::path gz = fs::path(folder) / (base + ".gz");
  if (fs::exists(gz, ec)) return gz.string();
  fail_usage(fmt::format("IDX file {} (or {}.gz) does not exist", plain.string(), base),
             images_fetch_hint());
}

}  // namespace

ImageSet load_idx_split(const std::string& folder, const std::string& split,
                        std::vector<std::string> class_names) {
  if (split != "train" && split != "test")
    fail_usage(fmt::format("unknown split '{}' of the IDX image set in {}", split, folder),
               "use train or test");
  const std::string prefix = split == "train" ? "train" : "t10k";
  const std::string images_path = find_idx_file(folder, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(folder, prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx(images_path);  // (N, H, W) uint8
  torch::Tensor labels = read_idx(labels_path);  // (N) uint8
  if (images.dim() != 3)
    fail_usage(fmt::format("{}: images must be 3-D (N, H, W), the file holds {}-D {}", images_path,
                           images.dim(), dims_text(images.sizes().vec())));
  if (labels.dim() != 1)
    fail_usage(fmt::format("{}: labels must be 1-D (N), the file holds {}-D {}", labels_path,
                           labels.dim(), dims_text(labels.sizes().vec())));
  if (images.size(0) != labels.size(0))
    fail_usage(fmt::format("{} holds {} images but {} holds {} labels", images_path, images.size(0),
                           labels_path, labels.size(0)),
               "the two files must come from the same split of the same data set");

  const int64_t max_label = labels.max().item<int64_t>();
  if (class_names.empty()) {
    for (int64_t c = 0; c <= max_label; ++c) class_names.push_back(std::to_string(c));
  } else if (max_label >= static_cast<int64_t>(class_names.size())) {
    const int64_t index = labels.argmax().item<int64_t>();
    fail_usage(fmt::format("{}: label {} of image {} is outside the {} classes 0..{}", labels_path,
                           max_label, index, class_names.size(), class_names.size() - 1),
               "is this the data set you meant?");
  }

  ImageSet set;
  set.pixels = images.unsqueeze(1);  // (N, 1, H, W)
  set.labels = labels.to(torch::kInt64);
  set.class_names = std::move(class_names);
  return set;
}

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names{"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                              "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                              "Bag",         "Ankle boot"};
  return names;
}

const std::vector<std::string>& mnist_classes() {
  static const std::vector<std::string> names{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  return names;
}

std::string lower_utf8(const std::string& text) {
  std::string out = text;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (c < 0x80) {
      out[i] = static_cast<char>(std::tolower(c));
    } else if (c == 0xC3 && i + 1 < out.size()) {
      const auto next = static_cast<unsigned char>(out[i + 1]);
      if (next >= 0x80 && next <= 0x9E && next != 0x97) out[i + 1] = static_cast<char>(next + 0x20);
      ++i;
    }
  }
  return out;
}


std::string templated_caption(const std::string& class_name, bool digits) {
  if (digits) return "a photo of the digit " + class_name;
  const std::string name = lower_utf8(class_name);
  const bool vowel = !name.empty() && std::strchr("aeiou", name[0]) != nullptr;
  return std::string("a photo of ") + (vowel ? "an " : "a ") + name;
}

// ---------------------------------------------------------------------------------------------
// Data set names, statistics, preprocessing

const Registry<std::string>& image_dataset_registry() {
  static const Registry<std::string> registry = [] {
    Registry<std::string> r("image data set");
    r.add("fashion-mnist", "Fashion-MNIST, 70,000 28x28 grey images of clothes in 10 classes",
          "images/fashion-mnist");
    r.add("mnist", "MNIST, 70,000 28x28 grey handwritten digits", "images/mnist");
    r.add("emoji", "3,786 64x64 Google emoji with their names as captions", "emoji");
    return r;
  }();
  return registry;
}

std::string image_dataset_folder(const std::string& name, const std::string& data_dir) {
  const auto& registry = image_dataset_registry();
  std::error_code ec;
  if (registry.contains(name)) {
    const fs::path folder = fs::path(data_dir) / registry.get(name);
    if (name == "fashion-mnist" && !fs::is_directory(folder, ec) &&
        fs::is_directory(kDebianFashionMnistDir, ec))
      return kDebianFashionMnistDir;
    return folder.string();
  }
  if (fs::is_directory(name, ec)) return name;
  fail_usage("unknown image data set '" + name + "'",
             "valid image data sets: " + registry.names_joined() +
                 ", or a path to a folder of IDX files or an emoji folder");
}

std::pair<std::vector<double>, std::vector<double>> channel_stats(const torch::Tensor& pixels) {
  check_usage(pixels.dim() == 4 && pixels.scalar_type() == torch::kUInt8,
              fmt::format("channel_stats wants (N, C, H, W) uint8 pixels, got {}-D {}",
                          pixels.dim(), std::string(c10::toString(pixels.scalar_type()))));
  const torch::Tensor x = pixels.cpu().contiguous();
  const int64_t n = x.size(0), channels = x.size(1), plane = x.size(2) * x.size(3);
  check_usage(n * plane > 0, "channel_stats of an empty image set");
  // One 256-bin histogram per channel: exact integer sums, and no float copy of the set.
  std::vector<std::array<uint64_t, 256>> histograms(channels);
  for (auto& h : histograms) h.fill(0);
  const uint8_t* p = x.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < channels; ++c) {
      uint64_t* h = histograms[c].data();
      const uint8_t* src = p + (i * channels + c) * plane;
      for (int64_t j = 0; j < plane; ++j) ++h[src[j]];
    }
  std::vector<double> mean(channels), std(channels);
  for (int64_t c = 0; c < channels; ++c) {
    // With s1 = sum v and s2 = sum v^2 over m values, var = (m s2 - s1^2) / m^2, computed in
    // 128-bit integers so it does not cancel.
    unsigned __int128 m = 0, s1 = 0, s2 = 0;
    for (unsigned v = 0; v < 256; ++v) {
      const uint64_t k = histograms[c][v];
      m += k;
      s1 += static_cast<unsigned __int128>(k) * v;
      s2 += static_cast<unsigned __int128>(k) * v * v;
    }
    const double md = static_cast<double>(m);
    mean[c] = static_cast<double>(s1) / md / 255.0;
    std[c] = std::sqrt(static_cast<double>(m * s2 - s1 * s1)) / md / 255.0;
  }
  return {mean, std};
}

torch::Tensor preprocess_images(const torch::Tensor& pixels, int64_t size,
                                const std::vector<double>& mean, const std::vector<double>& std) {
  check_usage(pixels.dim() == 4 && pixels.scalar_type() == torch::kUInt8,
              fmt::format("preprocess_images wants (B, C, H, W) uint8 pixels, got {}-D {}",
                          pixels.dim(), std::string(c10::toString(pixels.scalar_type()))));
  const int64_t batch = pixels.size(0), channels = pixels.size(1);
  check_usage(channels == 1 || channels == 3,
              fmt::format("images have {} channels; 1 (grey) or 3 (RGB) are supported", channels));
  check_usage(size >= 1, fmt::format("image size {} must be positive", size));
  check_usage(
      static_cast<int64_t>(mean.size()) == channels && static_cast<int64_t>(std.size()) == channels,
      fmt::format("normalization has {} means and {} standard deviations for {} channels",
                  mean.size(), std.size(), channels));
  for (double s : std)
    check_usage(s > 0, fmt::format("normalization standard deviation {} must be positive", s));

  torch::Tensor x = pixels.to(torch::kFloat32).div_(255.0);  // (B, C, H, W)
  if (x.size(2) != size || x.size(3) != size) {
    namespace F = torch::nn::functional;
    x = F::interpolate(x, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{size, size})
                              .mode(torch::kBilinear)
                              .align_corners(false));  // (B, C, size, size)
  }
  const auto options = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor m = torch::tensor(mean, options).to(x.options()).view({1, channels, 1, 1});
  const torch::Tensor s = torch::tensor(std, options).to(x.options()).view({1, channels, 1, 1});
  x = (x - m) / s;
  // Resizing and normalizing act on each channel alone, so a grey batch is replicated last,
  // after the work is done once instead of three times.
  if (channels == 1) x = x.expand({batch, 3, size, size}).contiguous();
  return x;  // (B, 3, size, size)
}

}  // namespace gradscope
