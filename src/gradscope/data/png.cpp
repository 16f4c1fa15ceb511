// PNG decoding through libpng, from memory, with the image's size checked before its pixels
// are allocated (images.h).
#include "gradscope/data/images.h"

#include <png.h>

#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"

namespace gradscope {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// PNG

namespace {

// Larger sides mean a corrupt or hostile file (libpng's own default limit is 1,000,000).
constexpr png_uint_32 kPngMaxSide = 1 << 14;
// Nor does any image of a data set have more pixels (the decode holds 4 bytes a pixel, the
// result 3: 224 MiB at this bound).
constexpr uint64_t kPngMaxPixels = uint64_t{1} << 25;
constexpr int64_t kPngMaxFileBytes = int64_t{256} << 20;
// The memory one ancillary chunk (a colour profile, compressed text) may take.
constexpr png_alloc_size_t kPngMaxChunkBytes = png_alloc_size_t{8} << 20;

// Everything the libpng decode needs to survive a longjmp. It is plain data reached through a
// pointer, so no C++ destructor is skipped by the longjmp and no value lives in a register that
// setjmp could restore stale.
struct PngDecode {
  const unsigned char* data = nullptr;  // the file's bytes
  size_t size = 0;
  size_t pos = 0;  // next byte libpng reads
  png_structp png = nullptr;
  png_infop info = nullptr;
  unsigned char* rgba = nullptr;  // (H, W, 4) from malloc
  png_bytep* rows = nullptr;      // H pointers into rgba, from malloc
  png_uint_32 width = 0;
  png_uint_32 height = 0;
  char message[256] = {0};
};

void png_error_to_decode(png_structp png, png_const_charp message) {
  auto* decode = static_cast<PngDecode*>(png_get_error_ptr(png));
  std::snprintf(decode->message, sizeof(decode->message), "%s", message);
  png_longjmp(png, 1);
}

void png_warning_ignored(png_structp, png_const_charp) {}

void png_read_from_memory(png_structp png, png_bytep out, png_size_t count) {
  auto* decode = static_cast<PngDecode*>(png_get_io_ptr(png));
  if (count > decode->size - decode->pos) png_error(png, "unexpected end of file");
  std::memcpy(out, decode->data + decode->pos, count);
  decode->pos += count;
}

// Refuses, from the header alone, an image too large to decode or larger than the file can
// hold: its samples inflate from the file's IDAT data, at most kDeflateMaxRatio times their
// size, so pixels * bits per pixel / 8 (a lower bound on the inflated data, filter bytes and
// row padding left out) beyond that means a corrupt or hostile header.
void check_png_size(PngDecode* decode) {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  png_get_IHDR(decode->png, decode->info, &width, &height, &bit_depth, &color_type, nullptr,
               nullptr, nullptr);
  const uint64_t pixels = uint64_t{width} * height;
  char message[200];
  if (pixels > kPngMaxPixels) {
    std::snprintf(message, sizeof(message),
                  "the image has %ux%u pixels, more than the %llu a PNG "
                  "may have",
                  width, height, static_cast<unsigned long long>(kPngMaxPixels));
    png_error(decode->png, message);
  }
  const uint64_t bits = pixels * png_get_channels(decode->png, decode->info) * bit_depth;
  if (bits / 8 > kDeflateMaxRatio * decode->size) {
    std::snprintf(message, sizeof(message),
                  "the header claims %ux%u pixels, more than a file "
                  "of %zu bytes can hold",
                  width, height, decode->size);
    png_error(decode->png, message);
  }
}

// Decodes decode->data into 8-bit RGBA. Returns false with decode->message set on failure; the
// caller frees what decode holds either way. C-style on purpose: libpng reports errors by
// longjmp back into this frame.
bool decode_png_rgba(PngDecode* decode) {
  decode->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, decode, png_error_to_decode,
                                       png_warning_ignored);
  if (decode->png == nullptr) {
    std::snprintf(decode->message, sizeof(decode->message), "cannot create a libpng reader");
    return false;
  }
  decode->info = png_create_info_struct(decode->png);
  if (decode->info == nullptr) {
    std::snprintf(decode->message, sizeof(decode->message), "cannot create a libpng info");
    return false;
  }
  if (setjmp(png_jmpbuf(decode->png))) return false;

  png_set_read_fn(decode->png, decode, png_read_from_memory);
  png_set_user_limits(decode->png, kPngMaxSide, kPngMaxSide);
  png_set_chunk_malloc_max(decode->png, kPngMaxChunkBytes);
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  // A fuzzer cannot forge checksums: let it past them to the code behind.
  png_set_crc_action(decode->png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
#if defined(PNG_IGNORE_ADLER32) && defined(PNG_SET_OPTION_SUPPORTED)
  png_set_option(decode->png, PNG_IGNORE_ADLER32, PNG_OPTION_ON);
#endif
#endif
  png_read_info(decode->png, decode->info);
  check_png_size(decode);
  // Whatever the colour type and depth, ask for 8-bit RGBA: palette -> RGB, grey below 8 bits
  // -> 8 bits, tRNS -> alpha, 16 -> 8 bits (scaled with rounding, not truncated), grey -> RGB,
  // and an opaque alpha where there is none.
  png_set_expand(decode->png);
  png_set_scale_16(decode->png);
  png_set_gray_to_rgb(decode->png);
  png_set_add_alpha(decode->png, 0xFF, PNG_FILLER_AFTER);
  png_set_interlace_handling(decode->png);
  png_read_update_info(decode->png, decode->info);

  decode->width = png_get_image_width(decode->png, decode->info);
  decode->height = png_get_image_height(decode->png, decode->info);
  if (png_get_rowbytes(decode->png, decode->info) != 4 * static_cast<size_t>(decode->width))
    png_error(decode->png, "unexpected row size after the RGBA transforms");
  decode->rgba = static_cast<unsigned char*>(
      std::malloc(4 * static_cast<size_t>(decode->width) * decode->height));
  decode->rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * decode->height));
  if (decode->rgba == nullptr || decode->rows == nullptr) png_error(decode->png, "out of memory");
  for (png_uint_32 y = 0; y < decode->height; ++y)
    decode->rows[y] = decode->rgba + 4 * static_cast<size_t>(decode->width) * y;
  png_read_image(decode->png, decode->rows);
  png_read_end(decode->png, nullptr);
  return true;
}

}  // namespace

torch::Tensor read_png_rgb(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail_usage(fmt::format("PNG file {} does not exist", path));
  return decode_png_rgb(read_input_file(path, "PNG file", kPngMaxFileBytes), path);
}

torch::Tensor decode_png_rgb(std::string_view bytes, const std::string& source) {
  PngDecode decode;
  decode.data = reinterpret_cast<const unsigned char*>(bytes.data());
  decode.size = bytes.size();
  const bool ok = decode_png_rgba(&decode);
  png_destroy_read_struct(&decode.png, &decode.info, nullptr);
  std::unique_ptr<unsigned char, decltype(&std::free)> rgba(decode.rgba, &std::free);
  std::free(decode.rows);
  if (!ok) fail_usage(fmt::format("{}: cannot decode PNG: {}", source, decode.message));

  // (H, W, 4) RGBA -> (3, H, W) RGB over white: out = (a*c + (255 - a)*255) / 255, rounded.
  // The integer form rounds exactly: the numerator over 255 is never a half.
  const int64_t height = decode.height, width = decode.width, plane = height * width;
  torch::Tensor out = torch::empty({3, height, width}, torch::kUInt8);
  uint8_t* dst = out.data_ptr<uint8_t>();
  const unsigned char* src = rgba.get();
  for (int64_t i = 0; i < plane; ++i) {
    const unsigned alpha = src[4 * i + 3];
    for (int64_t c = 0; c < 3; ++c)
      dst[c * plane + i] =
          static_cast<uint8_t>((alpha * src[4 * i + c] + (255 - alpha) * 255 + 127) / 255);
  }
  return out;
}

}  // namespace gradscope
