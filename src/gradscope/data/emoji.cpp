// The emoji set: its list read with limits, captions from the names, images grouped so that
// an emoji's variants (skin tones) stay on one side of the split (images.h).
#include "gradscope/data/images.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"

namespace gradscope {
namespace fs = std::filesystem;

namespace {

std::string emoji_fetch_hint() {
  return "run scripts/fetch-data.sh emoji (or make data) to fetch the emoji set into "
         "$GRADSCOPE_DATA (default ~/.cache/gradscope)";
}

constexpr char kEmojiDamagedHint[] =
    "the emoji set is damaged or not the one gradscope fetches: scripts/fetch-data.sh emoji "
    "fetches a whole copy";

using nlohmann::json;

struct EmojiItem {
  std::string image;  // file name under img/
  std::string caption;
  std::string base;  // emoji_base of its entry, until grouped; then its group
};

// emoji-datasource's list has 2 MB; more than this is no emoji list.
constexpr int64_t kEmojiListMaxBytes = int64_t{64} << 20;

// An image named by the list is a file in img/: a name that would reach outside it (a path,
// "..") is refused.
void check_image_name(const std::string& image, const std::string& json_path,
                      const std::string& what) {
  if (image.empty()) fail_usage(fmt::format("{}: {} has no image file name", json_path, what));
  if (image == "." || image == ".." || image.find('/') != std::string::npos ||
      image.find('\0') != std::string::npos)
    fail_usage(fmt::format("{}: {} names the image '{}', which is not a file name in img/",
                           json_path, what, image),
               kEmojiDamagedHint);
}

bool json_true(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

std::string json_string(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// "1F3FB-1F3FC" -> ", light skin tone, medium-light skin tone"; a repeated tone is named once,
// as in CLDR's names ("kiss: person, person, light skin tone").
std::string skin_tone_suffix(const std::string& key, const std::string& json_path) {
  static const std::map<std::string, std::string> tones{{"1F3FB", "light"},
                                                        {"1F3FC", "medium-light"},
                                                        {"1F3FD", "medium"},
                                                        {"1F3FE", "medium-dark"},
                                                        {"1F3FF", "dark"}};
  std::string suffix;
  std::vector<std::string> named;
  size_t begin = 0;
  while (begin <= key.size()) {
    size_t end = key.find('-', begin);
    if (end == std::string::npos) end = key.size();
    std::string code = key.substr(begin, end - begin);
    for (char& ch : code) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    const auto it = tones.find(code);
    if (it == tones.end())
      fail_usage(
          fmt::format("{}: unknown skin tone '{}' in skin variation '{}'", json_path, code, key),
          "the tones are 1F3FB..1F3FF");
    if (std::find(named.begin(), named.end(), code) == named.end()) {
      named.push_back(code);
      suffix += ", " + it->second + " skin tone";
    }
    begin = end + 1;
  }
  return suffix;
}

// The entries of emoji.json that have a Google image, with their captions, sorted by file name.
std::vector<EmojiItem> emoji_items(const std::string& json_path) {
  const json entries =
      parse_json_input(read_input_file(json_path, "emoji list", kEmojiListMaxBytes), json_path,
                       kEmojiDamagedHint);
  if (!entries.is_array())
    fail_usage(fmt::format("{}: expected a JSON array of emoji, found a {}", json_path,
                           entries.type_name()));

  std::vector<EmojiItem> items;
  // Bases that are one group (obsoletes / obsoleted_by): union-find whose root is the smallest
  // base of its group, so the group's name does not depend on the list's order.
  std::map<std::string, std::string> parent;
  const auto root_of = [&parent](std::string base) {
    for (auto it = parent.find(base); it != parent.end() && it->second != base;
         it = parent.find(base))
      base = it->second;
    return base;
  };
  const auto join = [&](const std::string& a, const std::string& b) {
    const std::string ra = root_of(a), rb = root_of(b);
    parent[std::max(ra, rb)] = std::min(ra, rb);
    parent.emplace(std::min(ra, rb), std::min(ra, rb));
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& entry = entries[i];
    if (!entry.is_object())
      fail_usage(
          fmt::format("{}: entry {} is a {}, not an object", json_path, i, entry.type_name()));
    std::string base = lower_utf8(json_string(entry, "name"));
    if (base.empty()) {
      base = json_string(entry, "short_name");
      std::replace(base.begin(), base.end(), '_', ' ');
    }
    const std::string image = json_string(entry, "image");
    if (base.empty()) base = image.substr(0, image.rfind('.'));
    std::string unified = json_string(entry, "unified");
    if (unified.empty()) unified = image.substr(0, image.rfind('.'));
    const std::string group = emoji_base(unified);
    join(group, group);
    for (const char* link : {"obsoletes", "obsoleted_by"}) {
      const std::string other = json_string(entry, link);
      if (!other.empty()) join(group, emoji_base(other));
    }
    if (json_true(entry, "has_img_google")) {
      check_image_name(image, json_path, fmt::format("entry {} ('{}')", i, base));
      items.push_back({image, base, group});
    }
    const auto variations = entry.find("skin_variations");
    if (variations == entry.end() || !variations->is_object()) continue;
    for (const auto& [key, variation] : variations->items()) {
      if (!variation.is_object() || !json_true(variation, "has_img_google")) continue;
      const std::string variation_image = json_string(variation, "image");
      check_image_name(variation_image, json_path,
                       fmt::format("skin variation {} of entry {} ('{}')", key, i, base));
      items.push_back({variation_image, base + skin_tone_suffix(key, json_path), group});
    }
  }
  for (auto& item : items) item.base = root_of(item.base);
  std::sort(items.begin(), items.end(),
            [](const EmojiItem& a, const EmojiItem& b) { return a.image < b.image; });
  for (size_t i = 1; i < items.size(); ++i)
    if (items[i].image == items[i - 1].image)
      fail_usage(fmt::format("{} lists the image {} twice ('{}' and '{}')", json_path,
                             items[i].image, items[i - 1].caption, items[i].caption));
  return items;
}

}  // namespace

ImageSet load_emoji(const std::string& folder, int64_t expected_size, int64_t max_images) {
  check_usage(expected_size >= 1, fmt::format("emoji size {} must be positive", expected_size));
  check_usage(max_images >= 0,
              fmt::format("max_images {} must be 0 (all) or positive", max_images));
  const fs::path json_path = fs::path(folder) / "emoji.json";
  std::error_code ec;
  if (!fs::exists(json_path, ec))
    fail_usage(fmt::format("emoji data set is missing: {} does not exist", json_path.string()),
               emoji_fetch_hint());
  const std::vector<EmojiItem> items = emoji_items(json_path.string());

  // Every listed image must be there, whatever max_images: a partial folder is an error, not a
  // smaller data set.
  const fs::path img = fs::path(folder) / "img";
  for (const auto& item : items)
    if (!fs::exists(img / item.image, ec))
      fail_usage(fmt::format("{} is missing ({} lists it with has_img_google true)",
                             (img / item.image).string(), json_path.string()),
                 kEmojiDamagedHint);

  const auto total = static_cast<int64_t>(items.size());
  const int64_t count = max_images > 0 ? std::min(max_images, total) : total;
  const int64_t s = expected_size;
  ImageSet set;
  set.pixels = torch::empty({count, 3, s, s}, torch::kUInt8);  // (N, 3, S, S)
  set.captions.reserve(count);
  uint8_t* dst = set.pixels.data_ptr<uint8_t>();
  for (int64_t i = 0; i < count; ++i) {
    const std::string path = (img / items[i].image).string();
    const torch::Tensor rgb = read_png_rgb(path);  // (3, H, W)
    if (rgb.size(1) != s || rgb.size(2) != s)
      fail_usage(fmt::format("{} is {}x{} pixels; the emoji set's images are {}x{}", path,
                             rgb.size(2), rgb.size(1), s, s),
                 kEmojiDamagedHint);
    std::memcpy(dst + i * 3 * s * s, rgb.data_ptr<uint8_t>(), 3 * s * s);
    set.captions.push_back(items[i].caption);
    set.groups.push_back(items[i].base);
  }
  return set;
}

std::string emoji_base(std::string_view unified) {
  std::vector<std::string> points;
  size_t begin = 0;
  while (begin <= unified.size()) {
    size_t end = unified.find('-', begin);
    if (end == std::string_view::npos) end = unified.size();
    std::string point(unified.substr(begin, end - begin));
    for (char& ch : point) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    // Leading zeros do not make another code point ("0023" and "23").
    point.erase(0, std::min(point.find_first_not_of('0'), point.size() - 1));
    if (!point.empty()) points.push_back(point);
    begin = end + 1;
  }
  static const std::map<std::string, std::string> neutral{{"1F468", "1F9D1"}, {"1F469", "1F9D1"},
                                                          {"1F466", "1F9D2"}, {"1F467", "1F9D2"},
                                                          {"1F474", "1F9D3"}, {"1F475", "1F9D3"}};
  const auto is_tone = [](const std::string& p) {
    return p.size() == 5 && p.compare("1F3FB") >= 0 && p.compare("1F3FF") <= 0;
  };
  std::vector<std::string> kept;
  for (const auto& p : points)
    if (!is_tone(p) && p != "FE0E" && p != "FE0F") kept.push_back(p);
  std::string out;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (kept[i] == "200D" && i + 1 < kept.size() &&
        (kept[i + 1] == "2640" || kept[i + 1] == "2642" || kept[i + 1] == "27A1")) {
      ++i;
      continue;
    }
    const auto it = neutral.find(kept[i]);
    out += (out.empty() ? "" : "-") + (it == neutral.end() ? kept[i] : it->second);
  }
  return out;
}

std::vector<bool> held_out_by_group(const std::vector<std::string>& groups, int64_t count,
                                    int64_t every) {
  check_usage(every >= 1, fmt::format("a split that holds out every {}th group", every));
  check_usage(groups.empty() || static_cast<int64_t>(groups.size()) == count,
              fmt::format("{} group names for {} items", groups.size(), count));
  // Each group's items, in item order; groups in order of their first item.
  std::vector<std::vector<int64_t>> members;
  std::map<std::string, size_t> index;
  for (int64_t i = 0; i < count; ++i) {
    if (groups.empty()) {
      members.push_back({i});
      continue;
    }
    const auto [it, added] = index.emplace(groups[i], members.size());
    if (added) members.emplace_back();
    members[it->second].push_back(i);
  }
  // A stable sort by size keeps the first-item order among groups of one size.
  std::stable_sort(members.begin(), members.end(),
                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
  std::vector<bool> held(static_cast<size_t>(std::max<int64_t>(count, 0)), false);
  for (size_t g = 0; g < members.size(); g += static_cast<size_t>(every))
    for (int64_t i : members[g]) held[static_cast<size_t>(i)] = true;
  return held;
}

}  // namespace gradscope
