#include "gradscope/core/memory_scope.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <tuple>

#include <ATen/SequenceNumber.h>

namespace gradscope {
namespace memory_scope_state {

struct Entry {
  enum Kind { kModule, kComponent, kWholePath } kind = kModule;
  std::string text;
  MemoryComponent component = MemoryComponent::kOther;
  bool has_component = false;  // kWholePath: whether it carries an override
};

struct State {
  std::mutex mutex;
  std::vector<TimelineLabel> labels;
  std::map<std::tuple<int, std::string, std::string>, uint32_t> ids;
  std::vector<Entry> stack;
  std::string phase;
  // Sequence numbers, cut into disjoint segments each holding the innermost module whose
  // forward made those nodes: first -> (end, module). A scope closing fills the parts of its
  // range the scopes inside it (closed before it) left uncovered.
  std::map<uint64_t, std::pair<uint64_t, ModuleOfNode>> segments;
  std::atomic<uint32_t> current{kUnnamedLabel};
  std::atomic<MemoryLabelListener> listener{nullptr};

  State() {
    labels.push_back({MemoryComponent::kOther, "", ""});
    labels.push_back({MemoryComponent::kOther, "label table full", ""});
    ids[{static_cast<int>(MemoryComponent::kOther), "", ""}] = kUnnamedLabel;
    ids[{static_cast<int>(MemoryComponent::kOther), "label table full", ""}] = kOverflowLabel;
  }
};

State& state() {
  static State* s = new State();  // used by allocations during static destruction too
  return *s;
}

uint32_t intern_locked(State& s, const TimelineLabel& label) {
  const auto key = std::make_tuple(static_cast<int>(label.component), label.module, label.phase);
  const auto found = s.ids.find(key);
  if (found != s.ids.end()) return found->second;
  if (s.labels.size() >= kMaxMemoryLabels) return kOverflowLabel;
  const auto id = static_cast<uint32_t>(s.labels.size());
  s.labels.push_back(label);
  s.ids.emplace(key, id);
  return id;
}

std::string module_locked(const State& s) {
  std::string path;
  for (const Entry& e : s.stack) {
    if (e.kind == Entry::kWholePath) path = e.text;
    if (e.kind != Entry::kModule) continue;
    if (!path.empty()) path += '/';
    path += e.text;
  }
  return path;
}

std::optional<MemoryComponent> override_locked(const State& s) {
  std::optional<MemoryComponent> component;
  for (const Entry& e : s.stack)
    if (e.kind == Entry::kComponent || (e.kind == Entry::kWholePath && e.has_component))
      component = e.component;
  return component;
}

void update_locked(State& s) {
  const MemoryComponent component = override_locked(s).value_or(default_component(s.phase));
  s.current.store(intern_locked(s, {component, module_locked(s), s.phase}),
                  std::memory_order_relaxed);
}

// Gives [first, end)'s sequence numbers not yet in a segment to `module`.
void cover_locked(State& s, uint64_t first, uint64_t end, const ModuleOfNode& module) {
  uint64_t pos = first;
  auto it = s.segments.upper_bound(first);
  if (it != s.segments.begin() && std::prev(it)->second.first > first)
    pos = std::prev(it)->second.first;  // a segment holding `first` covers the start
  while (pos < end) {
    if (it != s.segments.end() && it->first < end) {
      if (it->first > pos) s.segments.emplace_hint(it, pos, std::make_pair(it->first, module));
      pos = std::max(pos, it->second.first);
      ++it;
    } else {
      s.segments.emplace_hint(it, pos, std::make_pair(end, module));
      pos = end;
    }
  }
}

void notify(State& s) {
  if (const MemoryLabelListener listener = s.listener.load(std::memory_order_acquire))
    listener(s.current.load(std::memory_order_relaxed));
}

void push(Entry entry) {
  State& s = state();
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.stack.push_back(std::move(entry));
    update_locked(s);
  }
  notify(s);
}

}  // namespace memory_scope_state

using memory_scope_state::Entry;
using memory_scope_state::state;

uint32_t intern_memory_label(const TimelineLabel& label) {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return memory_scope_state::intern_locked(s, label);
}

TimelineLabel memory_label(uint32_t id) {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return id < s.labels.size() ? s.labels[id] : s.labels[kUnnamedLabel];
}

uint32_t memory_label_count() {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return static_cast<uint32_t>(s.labels.size());
}

uint32_t current_memory_label() { return state().current.load(std::memory_order_relaxed); }

void set_memory_phase(const std::string& phase) {
  auto& s = state();
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (s.phase == phase) return;
    s.phase = phase;
    memory_scope_state::update_locked(s);
  }
  memory_scope_state::notify(s);
}

void set_memory_label_listener(MemoryLabelListener listener) {
  state().listener.store(listener, std::memory_order_release);
}

std::string current_memory_phase() {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return s.phase;
}

std::string current_memory_module() {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return memory_scope_state::module_locked(s);
}

MemoryScope::MemoryScope(const std::string& module)
    : active_(true), records_range_(true), first_sequence_nr_(at::sequence_number::peek()) {
  memory_scope_state::push({Entry::kModule, module, MemoryComponent::kOther});
}

MemoryScope::MemoryScope(MemoryComponent component) : active_(true) {
  memory_scope_state::push({Entry::kComponent, "", component});
}

MemoryScope MemoryScope::whole_path(const ModuleOfNode& module) {
  MemoryScope scope;
  scope.active_ = true;
  memory_scope_state::push({Entry::kWholePath, module.path,
                            module.component.value_or(MemoryComponent::kOther),
                            module.component.has_value()});
  return scope;
}

MemoryScope::MemoryScope(MemoryScope&& other) noexcept
    : active_(other.active_),
      records_range_(other.records_range_),
      first_sequence_nr_(other.first_sequence_nr_) {
  other.active_ = false;
}

MemoryScope::~MemoryScope() {
  if (!active_) return;
  const uint64_t end = records_range_ ? at::sequence_number::peek() : 0;
  auto& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  if (records_range_ && end > first_sequence_nr_) {
    if (s.segments.size() >= kMaxModuleRanges) s.segments.clear();
    memory_scope_state::cover_locked(s, first_sequence_nr_, end,
                                     {memory_scope_state::module_locked(s),
                                      memory_scope_state::override_locked(s)});
  }
  if (!s.stack.empty()) s.stack.pop_back();
  memory_scope_state::update_locked(s);
  lock.unlock();
  memory_scope_state::notify(s);
}

std::optional<ModuleOfNode> module_of_node(uint64_t sequence_nr) {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.segments.upper_bound(sequence_nr);
  if (it == s.segments.begin()) return std::nullopt;
  --it;
  if (sequence_nr >= it->second.first) return std::nullopt;
  return it->second.second;
}

void clear_module_ranges() {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.segments.clear();
}

MemoryComponent default_component(const std::string& phase) {
  if (phase == "forward" || phase == "backward") return MemoryComponent::kActivations;
  if (phase == "comm") return MemoryComponent::kCollectiveBuffers;
  return MemoryComponent::kOther;
}

}  // namespace gradscope
