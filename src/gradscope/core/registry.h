// One explicit registry per family (models, optimizers, strategies, datasets, tokenizers).
// Entries are added in one function per family, one line each: no static self-registration,
// so the whole family is visible in one place and link order never matters.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gradscope/core/error.h"

namespace gradscope {

template <typename Entry>
class Registry {
 public:
  explicit Registry(std::string family) : family_(std::move(family)) {}

  Registry& add(std::string name, std::string description, Entry entry) {
    items_.push_back({std::move(name), std::move(description), std::move(entry)});
    return *this;
  }

  bool contains(const std::string& name) const { return find(name) != nullptr; }

  // Throws a usage error that lists the valid names when `name` is unknown.
  const Entry& get(const std::string& name) const {
    if (const auto* item = find(name)) return item->entry;
    fail_usage("unknown " + family_ + " '" + name + "'",
               "valid " + family_ + "s: " + names_joined());
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& item : items_) out.push_back(item.name);
    return out;
  }

  std::string names_joined() const {
    std::string out;
    for (const auto& item : items_) out += (out.empty() ? "" : ", ") + item.name;
    return out;
  }

  struct Item {
    std::string name;
    std::string description;
    Entry entry;
  };
  const std::vector<Item>& items() const { return items_; }
  const std::string& family() const { return family_; }

 private:
  const Item* find(const std::string& name) const {
    for (const auto& item : items_)
      if (item.name == name) return &item;
    return nullptr;
  }

  std::string family_;
  std::vector<Item> items_;
};

}  // namespace gradscope
