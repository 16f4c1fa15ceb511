#include "gradscope/core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <regex>
#include <set>
#include <string_view>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"

// Tensor bytes go between the file and the tensors' storage as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data are little-endian: a big-endian host would need byte swaps");

namespace gradscope {
namespace safetensors_io {
namespace {

namespace fs = std::filesystem;

// The reference implementation's cap on a header: larger ones are refused before reading.
constexpr int64_t kMaxHeaderBytes = 100'000'000;
constexpr int64_t kMaxIndexBytes = 100'000'000;
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kMetadataKey[] = "__metadata__";
constexpr char kBadFileHint[] = "check that it is a whole .safetensors file";
constexpr char kDtypeHint[] =
    "gradscope reads F32, BF16 and F16 tensors, and writes those and I64";

// Length of the UTF-8 sequence that starts at text[i], or 0 where none does (overlong forms,
// surrogates and code points past U+10FFFF are not UTF-8).
size_t utf8_sequence(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

// Offset of the first byte of `text` that is not UTF-8, or npos.
size_t invalid_utf8_at(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_sequence(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

// Text from a file for a message: cut after about 100 bytes, with control characters and
// bytes that are not UTF-8 written \xNN.
std::string printable(std::string_view name) {
  std::string out;
  size_t i = 0;
  while (i < name.size() && out.size() < 100) {
    const auto c = static_cast<unsigned char>(name[i]);
    const size_t n = utf8_sequence(name, i);
    if (n == 0 || c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else {
      out.append(name.substr(i, n));
      i += n;
    }
  }
  if (i < name.size()) out += "...";
  return out;
}

// A name for a message: printable() in quotes.
std::string shown(std::string_view name) { return "'" + printable(name) + "'"; }

// The JSON string of `text` that holds byte `at` (without its quotes), or "" when `at` is
// outside every string.
std::string_view string_around(std::string_view text, size_t at) {
  size_t start = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!in_string) {
      if (i >= at) return {};
      if (c == '"') {
        in_string = true;
        start = i + 1;
      }
    } else if (c == '\\') {
      ++i;
    } else if (c == '"') {
      if (at < i) return text.substr(start, i - start);
      in_string = false;
    }
  }
  return in_string ? text.substr(start) : std::string_view{};
}

// A JSON integer in [0, 2^63), or nullopt.
std::optional<int64_t> non_negative(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return static_cast<int64_t>(v);
  } else if (value.is_number_integer()) {
    const auto v = value.get<int64_t>();
    if (v >= 0) return v;
  }
  return std::nullopt;
}

torch::ScalarType scalar_type_of(const std::string& dtype) {
  if (dtype == "F32") return torch::kFloat32;
  if (dtype == "BF16") return torch::kBFloat16;
  return torch::kFloat16;  // "F16": entries hold no other dtype
}

int64_t element_bytes(const std::string& dtype) { return dtype == "F32" ? 4 : 2; }

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// An open file from outside, closed when it goes.
class InputFile {
 public:
  explicit InputFile(std::string path) : path_(std::move(path)) {
    // Non-blocking, so that a FIFO is refused below instead of waiting for a writer.
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      const int error = errno;
      fail_usage(fmt::format("cannot read safetensors file {}: {}", path_, std::strerror(error)),
                 error == ENOENT ? "check the path" : "check the file's permissions");
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail_usage(fmt::format("safetensors file {} is not a regular file", path_),
                 "pass a .safetensors file or a folder of them");
    }
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    size_ = st.st_size;
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  int64_t size() const { return size_; }

  // Reads `n` bytes at `offset` into `out`; false when the file ends first.
  bool read_at(int64_t offset, void* out, int64_t n) const {
    char* to = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, to, static_cast<size_t>(std::min<int64_t>(n, 1 << 30)),
                                  static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        fail_usage(
            fmt::format("safetensors file {} cannot be read: {}", path_, std::strerror(errno)));
      if (got == 0) return false;
      to += got;
      offset += got;
      n -= got;
    }
    return true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// One file's header, checked.
struct HeaderOfFile {
  std::string path;
  int64_t size = 0;                       // bytes of the whole file
  int64_t data_start = 0;                 // where the data buffer starts: 8 + the header's length
  std::vector<SafetensorsEntry> entries;  // by begin
};

SafetensorsEntry parse_entry(const std::string& path, const std::string& name,
                             const nlohmann::json& value, int64_t data_bytes) {
  const auto fail = [&](const std::string& what, const std::string& hint = kBadFileHint) {
    fail_usage(fmt::format("safetensors file {}: tensor {}: {}", path, shown(name), what), hint);
  };
  if (name.empty()) fail("a tensor's name is empty");
  if (!value.is_object()) fail(fmt::format("its entry is {}, not an object", json_preview(value)));
  SafetensorsEntry e;
  e.name = name;
  e.file = path;

  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) fail("its entry has no \"dtype\" string");
  e.dtype = dtype->get<std::string>();
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16")
    fail_usage(fmt::format("safetensors file {}: dtype {} of tensor {} is not supported", path,
                           printable(e.dtype), shown(name)),
               kDtypeHint);

  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) fail("its entry has no \"shape\" array");
  // Multiplied in order with overflow checked at each step, as LibTorch does when it sizes a
  // tensor's storage, so a shape that passes here never fails there.
  int64_t numel = 1;
  bool overflow = false;
  for (const nlohmann::json& dim : *shape) {
    const std::optional<int64_t> size = non_negative(dim);
    if (!size) fail(fmt::format("shape entry {} is not a non-negative integer", json_preview(dim)));
    e.shape.push_back(*size);
    overflow |= __builtin_mul_overflow(numel, *size, &numel);
  }
  int64_t bytes = 0;
  overflow |= __builtin_mul_overflow(numel, element_bytes(e.dtype), &bytes);
  if (overflow)
    fail(fmt::format("shape {} has more elements than a tensor can", shape_text(e.shape)));

  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2)
    fail("its entry has no \"data_offsets\" pair");
  const std::optional<int64_t> begin = non_negative((*offsets)[0]);
  const std::optional<int64_t> end = non_negative((*offsets)[1]);
  if (!begin || !end) fail("data_offsets are not non-negative integers");
  e.begin = *begin;
  e.end = *end;
  if (e.begin > e.end)
    fail(fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
  if (e.end > data_bytes)
    fail(fmt::format("its data end at byte {}, past the end of the data buffer ({} bytes)", e.end,
                     data_bytes),
         "the file is truncated: fetch it again");
  if (e.end - e.begin != bytes)
    fail(fmt::format("data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}", e.begin,
                     e.end, e.end - e.begin, shape_text(e.shape), e.dtype, bytes));
  return e;
}

HeaderOfFile parse_file(const std::string& path) {
  const InputFile in(path);
  HeaderOfFile h;
  h.path = path;
  h.size = in.size();
  const auto fail = [&](const std::string& what, const std::string& hint = kBadFileHint) {
    fail_usage(fmt::format("safetensors file {}: {}", path, what), hint);
  };
  unsigned char length[8] = {};
  if (h.size < 8 || !in.read_at(0, length, 8))
    fail(fmt::format("has {} bytes, too few for the header's length", h.size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > static_cast<uint64_t>(kMaxHeaderBytes))
    fail(fmt::format("the header's length is {} bytes, more than the {} a header may have", n,
                     kMaxHeaderBytes));
  if (n > static_cast<uint64_t>(h.size - 8))
    fail(fmt::format(
        "the header's length is {} bytes, longer than the {} bytes of the file after it", n,
        h.size - 8));
  std::string header(n, '\0');
  if (!in.read_at(8, header.data(), static_cast<int64_t>(n)))
    fail("the file ended while its header was read");
  h.data_start = 8 + static_cast<int64_t>(n);
  const int64_t data_bytes = h.size - h.data_start;

  // Checked here, not left to the JSON parser, to say which string it is.
  const size_t bad = invalid_utf8_at(header);
  if (bad != std::string_view::npos) {
    const std::string_view in_string = string_around(header, bad);
    fail(fmt::format("byte {} of the header is not UTF-8{}", bad,
                     in_string.empty() ? "" : ", in the string " + shown(in_string)));
  }
  const nlohmann::json json = parse_json_input(
      header, fmt::format("the header of safetensors file {}", path), kBadFileHint);
  if (!json.is_object()) fail(fmt::format("the header is {}, not an object", json_preview(json)));
  const std::vector<std::string> repeated = repeated_json_key(header);
  // nlohmann's parser keeps the last of two equal keys and would hide the first tensor (whose
  // bytes the coverage check would then find unclaimed): a repeated name is refused by name.
  if (repeated.size() == 1)
    fail(repeated[0] == kMetadataKey
             ? "__metadata__ appears twice in the header"
             : fmt::format("tensor {} appears twice in the header", shown(repeated[0])));
  if (!repeated.empty())
    fail(fmt::format("tensor {}: key {} appears twice in its entry", shown(repeated[0]),
                     shown(repeated.back())));

  for (const auto& [name, value] : json.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) fail("__metadata__ is not an object");
      for (const auto& [key, text] : value.items())
        if (!text.is_string())
          fail(fmt::format("__metadata__ {} is {}, not a string", shown(key), json_preview(text)));
      continue;
    }
    h.entries.push_back(parse_entry(path, name, value, data_bytes));
  }

  // The tensors must cover the data buffer exactly, as the reference requires: sorted by
  // where they begin, each begins where the one before ends, and the last ends at its end.
  std::sort(h.entries.begin(), h.entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  int64_t covered = 0;
  const SafetensorsEntry* before = nullptr;
  for (const SafetensorsEntry& e : h.entries) {
    if (e.begin < covered)
      fail(fmt::format("tensor {} (bytes {} to {}) overlaps tensor {} (bytes {} to {})",
                       shown(e.name), e.begin, e.end, shown(before->name), before->begin,
                       before->end));
    if (e.begin > covered)
      fail(fmt::format("bytes {} to {} of the data buffer, before tensor {}, belong to no tensor",
                       covered, e.begin, shown(e.name)));
    covered = e.end;
    before = &e;
  }
  if (covered != data_bytes)
    fail(fmt::format("the data buffer has {} bytes but its tensors end at byte {}{}", data_bytes,
                     covered, before ? " (tensor " + shown(before->name) + ")" : ""));
  return h;
}

// A shard's name as an index gives it must be a file of the index's own folder.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos &&
         name.find("..") == std::string::npos && name != ".";
}

std::vector<HeaderOfFile> parse_index(const std::string& dir, const std::string& index_path) {
  const std::string text = read_input_file(index_path, "safetensors index", kMaxIndexBytes);
  const auto fail = [&](const std::string& what, const std::string& hint = "") {
    fail_usage(fmt::format("safetensors index {}: {}", index_path, what), hint);
  };
  const nlohmann::json index =
      parse_json_input(text, fmt::format("safetensors index {}", index_path));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail("it has no \"weight_map\" object");
  const std::vector<std::string> repeated = repeated_json_key(text);
  if (!repeated.empty())
    fail(fmt::format("key {} appears twice{}", shown(repeated.back()),
                     repeated.size() > 1 ? " in " + shown(repeated[repeated.size() - 2]) : ""));

  std::map<std::string, std::string> shard_of;                 // tensor -> shard
  std::map<std::string, std::vector<std::string>> tensors_of;  // shard -> tensors
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      fail(fmt::format("tensor {} maps to {}, not a file name", shown(name), json_preview(shard)));
    const std::string file = shard.get<std::string>();
    if (!plain_file_name(file))
      fail(fmt::format("tensor {} maps to {}, which is not a file of the index's folder",
                       shown(name), shown(file)),
           "an index names its shards by file name alone");
    shard_of[name] = file;
    tensors_of[file].push_back(name);
  }

  std::vector<HeaderOfFile> shards;
  for (const auto& [file, names] : tensors_of) {
    const std::string path = (fs::path(dir) / file).string();
    std::error_code ec;
    if (!fs::exists(path, ec))
      fail(fmt::format("tensor {} is in shard {}, which is missing", shown(names.front()), path),
           "the set is incomplete: fetch every shard the index names");
    HeaderOfFile h = parse_file(path);
    std::set<std::string> held;
    for (const SafetensorsEntry& e : h.entries) {
      const auto it = shard_of.find(e.name);
      if (it == shard_of.end())
        fail(fmt::format("shard {} holds tensor {}, which the index does not list", path,
                         shown(e.name)),
             "the index and its shards are from different sets");
      if (it->second != file)
        fail(fmt::format("shard {} holds tensor {}, which the index puts in {}", path,
                         shown(e.name), shown(it->second)),
             "the index and its shards are from different sets");
      held.insert(e.name);
    }
    for (const std::string& name : names)
      if (held.count(name) == 0)
        fail(
            fmt::format("tensor {} is in shard {}, says the index, but that shard does not hold it",
                        shown(name), path),
            "the index and its shards are from different sets");
    shards.push_back(std::move(h));
  }
  return shards;
}

// The checked headers of a file, or of a folder's weights.
std::vector<HeaderOfFile> parse_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {parse_file(path)};
  const std::string single = (fs::path(path) / kSingleFile).string();
  if (fs::exists(single, ec)) return {parse_file(single)};
  const std::string index = (fs::path(path) / kIndexFile).string();
  if (!fs::exists(index, ec))
    fail_usage(fmt::format("folder {} holds neither {} nor {}", path, kSingleFile, kIndexFile),
               "pass a folder of safetensors weights or a .safetensors file");
  return parse_index(path, index);
}

// The dtype's name in a file, or a usage error naming the tensor.
std::string dtype_name(const std::string& file, const std::string& name, const torch::Tensor& t) {
  if (!t.defined())
    fail_usage(fmt::format("cannot write {}: tensor {} is undefined", file, shown(name)));
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return "F32";
    case torch::kBFloat16:
      return "BF16";
    case torch::kFloat16:
      return "F16";
    case torch::kInt64:  // written only: token ids and labels beside outputs
      return "I64";
    default:
      fail_usage(fmt::format("cannot write {}: tensor {} has dtype {}", file, shown(name),
                             c10::toString(t.scalar_type())),
                 kDtypeHint);
  }
}

void check_text(const std::string& file, const std::string& what, const std::string& text) {
  if (invalid_utf8_at(text) != std::string_view::npos)
    fail_usage(fmt::format("cannot write {}: {} {} is not UTF-8", file, what, shown(text)));
}

// Checks every name and dtype of `tensors` before anything is written.
void check_tensors(const std::string& file,
                   const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) fail_usage(fmt::format("cannot write {}: a tensor's name is empty", file));
    if (name == kMetadataKey)
      fail_usage(fmt::format("cannot write {}: {} is not a tensor's name", file, kMetadataKey));
    check_text(file, "tensor name", name);
    if (!names.insert(name).second)
      fail_usage(fmt::format("cannot write {}: tensor {} is given twice", file, shown(name)));
    dtype_name(file, name, t);
  }
}

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// Removes the files of an earlier set in `dir` that `kept` does not name. Any left would make
// the folder read as the old set (model.safetensors comes before an index) or hold data no
// index names.
void remove_stale_files(const std::string& dir, const std::set<std::string>& kept) {
  static const std::regex shard_name(R"(model-[0-9]{5,}-of-[0-9]{5,}\.safetensors)");
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (kept.count(name) != 0) continue;
    if (name == kSingleFile || name == kIndexFile || std::regex_match(name, shard_name))
      stale.push_back(entry.path());
  }
  if (ec)
    fail_runtime(fmt::format("cannot list {}: {}", dir, ec.message()),
                 "check that the folder is readable");
  for (const fs::path& path : stale)
    if (!fs::remove(path, ec) && ec)
      fail_runtime(fmt::format("cannot remove {}, left from an earlier set: {}", path.string(),
                               ec.message()),
                   "remove it by hand: the folder would otherwise read as the old weights");
}

}  // namespace
}  // namespace safetensors_io

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path) {
  std::vector<SafetensorsEntry> entries;
  for (safetensors_io::HeaderOfFile& h : safetensors_io::parse_path(path))
    for (SafetensorsEntry& e : h.entries) entries.push_back(std::move(e));
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return entries;
}

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  // Every header is checked before the first tensor is allocated.
  const std::vector<safetensors_io::HeaderOfFile> files = safetensors_io::parse_path(path);
  std::map<std::string, torch::Tensor> tensors;
  for (const safetensors_io::HeaderOfFile& h : files) {
    const safetensors_io::InputFile in(h.path);
    if (in.size() != h.size)
      fail_usage(fmt::format("safetensors file {} changed while it was read ({} bytes, then {})",
                             h.path, h.size, in.size()),
                 "read it again when nothing writes it");
    for (const SafetensorsEntry& e : h.entries) {
      torch::Tensor t = torch::empty(
          e.shape, torch::TensorOptions().dtype(safetensors_io::scalar_type_of(e.dtype)));
      if (!in.read_at(h.data_start + e.begin, t.data_ptr(), e.end - e.begin))
        fail_usage(fmt::format("safetensors file {}: tensor {}: the file ended before its data",
                               h.path, safetensors_io::shown(e.name)),
                   safetensors_io::kBadFileHint);
      tensors.emplace(e.name, std::move(t));
    }
  }
  return tensors;
}

void write_safetensors(const std::string& file,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  safetensors_io::check_tensors(file, tensors);
  nlohmann::ordered_json meta = {{"format", "pt"}};
  for (const auto& [key, value] : metadata) {
    safetensors_io::check_text(file, "metadata key", key);
    safetensors_io::check_text(file, "metadata value", value);
    meta[key] = value;
  }
  nlohmann::ordered_json header = {{safetensors_io::kMetadataKey, meta}};
  std::vector<torch::Tensor> data;  // contiguous CPU tensors, alive until written
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    data.push_back(t.detach().to(torch::kCPU).contiguous());
    const int64_t bytes = safetensors_io::tensor_bytes(data.back());
    header[name] = {{"dtype", safetensors_io::dtype_name(file, name, t)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the data buffer starts 8-byte aligned
  if (static_cast<int64_t>(text.size()) > safetensors_io::kMaxHeaderBytes)
    fail_usage(fmt::format("cannot write {}: its header would have {} bytes, more than the {} a "
                           "reader accepts",
                           file, text.size(), safetensors_io::kMaxHeaderBytes),
               "write fewer tensors per file (shards)");
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);

  std::vector<std::string_view> pieces{length, text};
  for (const torch::Tensor& t : data)
    pieces.emplace_back(static_cast<const char*>(t.data_ptr()),
                        static_cast<size_t>(safetensors_io::tensor_bytes(t)));
  write_file_atomically(file, pieces);
}

std::vector<std::string> write_safetensors_set(
    const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
    int64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  check_usage(max_shard_bytes > 0,
              fmt::format("cannot write {}: the largest shard must be positive, not {} bytes", dir,
                          max_shard_bytes));
  safetensors_io::check_tensors(dir, tensors);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    fail_runtime(fmt::format("cannot make folder {}: {}", dir, ec.message()),
                 "check that its parent is writable");

  // Shards filled in order, as Hugging Face's split does: a tensor that would take a shard
  // past the limit starts the next one.
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> shards(1);
  int64_t total = 0, in_shard = 0;
  for (const auto& named : tensors) {
    const int64_t bytes = safetensors_io::tensor_bytes(named.second);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(named);
    in_shard += bytes;
    total += bytes;
  }

  if (shards.size() == 1) {
    const std::string path = (fs::path(dir) / safetensors_io::kSingleFile).string();
    write_safetensors(path, tensors);
    safetensors_io::remove_stale_files(dir, {safetensors_io::kSingleFile});
    return {path};
  }
  std::vector<std::string> written;
  std::set<std::string> names;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    written.push_back((fs::path(dir) / name).string());
    names.insert(name);
    write_safetensors(written.back(), shards[i]);
    for (const auto& named : shards[i]) weight_map[named.first] = name;
  }
  // A model.safetensors of an earlier set would be read instead of the index: it goes first.
  names.insert(safetensors_io::kIndexFile);
  safetensors_io::remove_stale_files(dir, names);
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  written.push_back((fs::path(dir) / safetensors_io::kIndexFile).string());
  write_file_atomically(written.back(), index.dump(2) + "\n");
  return written;
}

}  // namespace gradscope
