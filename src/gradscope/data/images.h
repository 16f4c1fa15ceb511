// Image data: IDX image sets (MNIST, Fashion-MNIST), PNG decoding, the emoji image-caption set,
// and the preprocessing that turns uint8 pixels into model input.
//
// Legend: N images in a set, B images in a batch, C channels (1 grey, 3 RGB), H x W pixels.
// Sets are held as uint8 (60000x28x28 is 47 MB; as float32 it would be 188 MB); batches are
// converted to float32 only when they are fed to a model (preprocess_images).
//
// Every problem with an input file is a usage error whose message names the file; a missing
// data set gives the scripts/fetch-data.sh command that fetches it as the hint.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include "gradscope/core/registry.h"

namespace gradscope {

// A decoded image set held in memory as uint8.
struct ImageSet {
  torch::Tensor pixels;                  // (N, C, H, W) uint8; C = 1 (grey) or 3 (RGB)
  torch::Tensor labels;                  // (N) int64 class index; undefined when the set has none
  std::vector<std::string> captions;     // one per image (emoji); empty otherwise
  std::vector<std::string> class_names;  // classification sets: name of each label
  // Emoji: the base emoji each image is a variant of (see load_emoji), one per image; images
  // of one base are near-copies and must stay on one side of a split. Empty otherwise.
  std::vector<std::string> groups;
  int64_t size() const { return pixels.defined() ? pixels.size(0) : 0; }
};

// Reads one IDX file (LeCun's format: bytes 00 00 TYPE RANK, RANK big-endian uint32 dims, then
// the data in row-major order), plain or gzip-compressed. Compression is detected from the gzip
// magic bytes (1f 8b), not from the file name. Only the unsigned-byte type 0x08 is accepted.
// Returns a uint8 tensor with the file's dimensions, e.g. (60000, 28, 28).
// Every problem is a usage error naming the file: missing, bad magic, unsupported type, zero or
// absurd dims (more than 2^30 bytes of data), truncated data, trailing bytes, corrupt gzip.
// Sizes are checked before anything is sized by them: a plain file's data against the file's
// size (and used where they lie, uncopied); a gzip file's against what its size can inflate
// to (deflate's limit, 1032 times), and its buffer grows as data arrive, so a corrupt header
// costs at most twice what the stream really holds.
torch::Tensor read_idx(const std::string& path);
// The same from the file's bytes; `source` names it in messages.
torch::Tensor decode_idx(std::string bytes, const std::string& source);

// Loads split "train" or "test" of an IDX image set from `folder`: the files
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each plain or with a .gz suffix (whichever
// exists; plain first). Images must be (N, H, W) and labels (N); every label must be below
// class_names.size(). An empty class_names names the classes "0".."max label".
// pixels come out (N, 1, H, W) uint8, labels (N) int64.
ImageSet load_idx_split(const std::string& folder, const std::string& split,
                        std::vector<std::string> class_names);

// Fashion-MNIST's ten classes, in label order ("T-shirt/top", ..., "Ankle boot").
const std::vector<std::string>& fashion_mnist_classes();
// MNIST's ten classes: "0".."9".
const std::vector<std::string>& mnist_classes();

// Deflate turns at most 2 bits into 258 bytes, so no gzip (or PNG) stream inflates to more than
// 1032 times its size: a header that claims more data than that is refused up front.
inline constexpr uint64_t kDeflateMaxRatio = 1032;

// Lower-cases ASCII and the Latin-1 capitals U+00C0..U+00DE (except U+00D7, the multiplication
// sign), which in UTF-8 are C3 80..C3 9E and lower-case to C3 A0..C3 BE. Emoji names hold
// such letters ("Åland Islands Flag"); other scripts pass through unchanged.
std::string lower_utf8(const std::string& text);

// A caption for a class, lower case with the right article: "Ankle boot" -> "a photo of an
// ankle boot", "T-shirt/top" -> "a photo of a t-shirt/top"; with digits = true, "7" -> "a photo
// of the digit 7". Captions turn a classification set into an image-caption set for the VLM.
std::string templated_caption(const std::string& class_name, bool digits = false);

// Decodes a PNG of any colour type and bit depth (palette, grey, grey + alpha, RGB, RGBA; 1 to
// 16 bits; interlaced or not) into (3, H, W) uint8 RGB. 16-bit samples are scaled (rounded) to
// 8 bits. Alpha is composited over a white background: out = round(a*c + (1-a)*255) with
// a = alpha/255, in the stored (sRGB) values, without gamma correction.
// A file that cannot be read or decoded is a usage error naming the file and libpng's message.
// Limits, checked after the header and before the pixels are allocated or decoded: at most
// 16384 pixels a side and 2^25 pixels in all, no more image data than the file's size can
// inflate to, at most 256 MiB of file and 8 MiB for any one ancillary chunk.
torch::Tensor read_png_rgb(const std::string& path);
// The same from the file's bytes; `source` names it in messages.
torch::Tensor decode_png_rgb(std::string_view bytes, const std::string& source);

// The emoji image-caption set that scripts/fetch-data.sh emoji lays out in `folder`:
// folder/emoji.json (emoji-datasource's list) and folder/img/*.png (64x64 Google emoji).
// Images: every entry whose "has_img_google" is true, plus each of its "skin_variations" whose
// has_img_google is true (3786 in emoji-datasource-google 16.0.0). Entries without a Google
// image are skipped; an entry with one whose file is missing is an error.
// Caption: "name" lower-cased ("GRINNING FACE" -> "grinning face"; Latin-1 letters too), or
// "short_name" with '_' -> ' ' when name is null or empty. A skin variation appends its tones
// in CLDR's style: key "1F3FB" -> ", light skin tone"; "1F3FB-1F3FC" -> ", light skin tone,
// medium-light skin tone"; a tone repeated ("1F3FB-1F3FB") is named once.
// Group (ImageSet::groups): the base emoji, emoji_base() of the entry's "unified" code points
// (of its image's file name when it has none), shared by all its skin variations; entries
// that one of the other "obsoletes" or "obsoleted_by" ("man running" obsoletes the old
// "runner", "family: man, woman, boy" the old "family") join one group, named by the
// smallest base in it. 3786 images fall into 1703 groups.
// Order: sorted by image file name (byte order), so the set is deterministic. max_images > 0
// decodes only the first max_images in that order (quick runs and tests).
// Every image must be expected_size x expected_size (else a usage error naming the file and
// its size). pixels come out (N, 3, S, S) uint8, alpha composited over white; no labels.
ImageSet load_emoji(const std::string& folder, int64_t expected_size = 64, int64_t max_images = 0);

// The base emoji of a code-point sequence written as emoji-datasource writes it (hex, joined by
// '-', either case): the sequence with its variants taken out, so that all variants of one
// emoji, which look almost alike, have one base:
// - skin tones U+1F3FB..U+1F3FF and variation selectors U+FE0E, U+FE0F are dropped;
// - a zero-width joiner (U+200D) followed by the female sign U+2640, the male sign U+2642 or
//   the right arrow U+27A1 ("woman running", "person running facing right", a mirror image) is
//   dropped with it;
// - gendered people become the gender-neutral one: man U+1F468 and woman U+1F469 -> person
//   U+1F9D1 ("woman technologist" -> "technologist"), boy U+1F466 and girl U+1F467 -> child
//   U+1F9D2, old man U+1F474 and old woman U+1F475 -> older person U+1F9D3.
// Returned upper case, joined by '-': "1f3c3-1f3fb-200d-2640-fe0f" -> "1F3C3".
std::string emoji_base(std::string_view unified);

// A deterministic split of items into kept and held out that keeps every group whole: the
// groups (items with equal groups[i]; an empty `groups` makes every item its own group) are
// ordered by their size, then by their first item's index, and every `every`-th of them,
// starting with the first, is held out. Ordering by size spreads the held-out groups evenly
// over the sizes, so about 1/every of the groups and of the items are held out (on the
// emoji set, 385 of 3786 images in 171 of 1703 groups). Returns, per item, whether it is held
// out. `count` is the number of items (groups.size() when groups is not empty).
std::vector<bool> held_out_by_group(const std::vector<std::string>& groups, int64_t count,
                                    int64_t every);

// Where Debian's dataset-fashion-mnist puts its files (scripts/install-deps.sh installs it).
inline constexpr char kDebianFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Image data sets this family knows ("fashion-mnist", "mnist", "emoji") and their folders
// relative to the data directory ("images/fashion-mnist", "images/mnist", "emoji").
const Registry<std::string>& image_dataset_registry();

// The folder of an image data set: data_dir + the registry's folder; "fashion-mnist" falls
// back to kDebianFashionMnistDir when data_dir's copy does not exist. A name that is a path to
// an existing directory is returned as is (tests point at fixtures). The folder returned for a
// known name may not exist: the loaders then report the missing file with the fetch hint.
// Unknown names: usage error listing the valid ones.
std::string image_dataset_folder(const std::string& name, const std::string& data_dir);

// Per-channel mean and (population) standard deviation of pixels/255 over a whole set:
// (N, C, H, W) uint8 -> C values each. Exact integer histograms, no float copy of the set.
std::pair<std::vector<double>, std::vector<double>> channel_stats(const torch::Tensor& pixels);

// Turns a uint8 batch into model input, on the batch's device:
// (B, C, H, W) uint8 -> (B, 3, size, size) float32 = (resize(x / 255) - mean[c]) / std[c],
// where resize is bilinear with align_corners = false (skipped when H = W = size), and a grey
// batch (C = 1) is replicated to 3 channels. mean and std have C entries (grey: 1).
torch::Tensor preprocess_images(const torch::Tensor& pixels, int64_t size,
                                const std::vector<double>& mean, const std::vector<double>& std);

}  // namespace gradscope
