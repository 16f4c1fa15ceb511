#include "gradscope/measure/memory_window.h"

#include <ATen/record_function.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "gradscope/core/memory_scope.h"

namespace gradscope {
namespace memory_window {

// A backward node's ObserverContext: the module scope pushed while it runs.
struct NodeScope final : at::ObserverContext {
  explicit NodeScope(MemoryScope s) : scope(std::move(s)) {}
  MemoryScope scope;
};

std::unique_ptr<at::ObserverContext> enter_node(const at::RecordFunction& fn) {
  const int64_t seq = fn.seqNr();
  if (seq < 0) return nullptr;
  std::optional<ModuleOfNode> module = module_of_node(static_cast<uint64_t>(seq));
  if (!module) return nullptr;
  return std::make_unique<NodeScope>(MemoryScope::whole_path(*module));
}

void leave_node(const at::RecordFunction&, at::ObserverContext*) {
  // The context (and with it the scope) is destroyed by RecordFunction after this returns.
}

// The recorder whose window is open, for the operator hook (a plain function).
std::atomic<MemoryWindowRecorder*> g_recording{nullptr};

void operator_done(const at::RecordFunction& fn, at::ObserverContext*) {
  MemoryWindowRecorder* recorder = g_recording.load(std::memory_order_acquire);
  if (recorder == nullptr) return;
  for (const c10::IValue& out : fn.outputs()) {
    if (out.isTensor()) {
      recorder->describe(out.toTensor(), fn.name());
    } else if (out.isTensorList()) {
      for (const at::Tensor& t : out.toTensorVector()) recorder->describe(t, fn.name());
    }
  }
}

std::string dtype_text(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type()));
}

}  // namespace memory_window

void install_backward_memory_labels() {
  static std::once_flag once;
  std::call_once(once, [] {
    at::addGlobalCallback(
        at::RecordFunctionCallback(&memory_window::enter_node, &memory_window::leave_node)
            .scopes({at::RecordScope::BACKWARD_FUNCTION}));
  });
}

struct MemoryWindowRecorder::State {
  explicit State(const std::string& path, int64_t cap) : writer(path, cap) {}
  std::mutex mutex;
  TimelineWriter writer;
  std::chrono::steady_clock::time_point t0;
  bool opening = false;  // what was live before the window is being told: at 0 ns
  std::unordered_map<uint64_t, int64_t> alloc_event;  // live blocks of the window -> event
  std::unordered_map<uint64_t, bool> named;           // of those, the ones a tensor names
  std::vector<TimelineTensor> tensors;
  std::vector<TimelinePhase> phases;
  at::CallbackHandle operator_hook = 0;
};

MemoryWindowRecorder::MemoryWindowRecorder(const std::string& path, int64_t cap_bytes)
    : state_(std::make_unique<State>(path, cap_bytes)) {}

MemoryWindowRecorder::~MemoryWindowRecorder() {
  if (!open_) return;
  memory_window::g_recording.store(nullptr, std::memory_order_release);
  at::removeCallback(state_->operator_hook);
  CpuMemoryTracker::install().set_observer(nullptr);
}

void MemoryWindowRecorder::open(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  std::vector<at::Tensor> tensors;
  tensors.reserve(named.size());
  for (const auto& [name, t] : named) tensors.push_back(t);
  state_->t0 = std::chrono::steady_clock::now();
  tracker.start_window();
  state_->opening = true;
  tracker.set_observer(this, tensors);
  state_->opening = false;
  open_ = true;
  for (const auto& [name, t] : named) {
    if (!t.defined() || !t.has_storage()) continue;
    const std::lock_guard<std::mutex> lock(state_->mutex);
    const auto address = reinterpret_cast<uint64_t>(t.storage().data_ptr().get());
    const auto found = state_->alloc_event.find(address);
    if (found == state_->alloc_event.end() || state_->named[address]) continue;
    state_->named[address] = true;
    state_->tensors.push_back({found->second, name, t.sizes().vec(), memory_window::dtype_text(t)});
  }
  memory_window::g_recording.store(this, std::memory_order_release);
  state_->operator_hook = at::addGlobalCallback(
      at::RecordFunctionCallback(nullptr, &memory_window::operator_done)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

void MemoryWindowRecorder::phase(int64_t step, const std::string& phase) {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  auto& phases = state_->phases;
  if (!phases.empty()) phases.back().end_event = state_->writer.written();
  phases.push_back({step, phase, state_->writer.written(), state_->writer.written()});
}

void MemoryWindowRecorder::on_event(TimelineEventKind kind, uint64_t address, int64_t bytes,
                                    uint32_t label, int64_t live, uint32_t previous) {
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  const int64_t t_ns = s.opening ? 0
                                 : std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - s.t0)
                                       .count();
  if (kind == TimelineEventKind::kRelabel && s.alloc_event.count(address) == 0) {
    // A block from before the window that no named tensor holds: it leaves its old label's
    // unnamed bytes and is, from here, a block of the window under its new label.
    s.writer.add({TimelineEventKind::kFree, previous, address, bytes, live - bytes, t_ns});
    kind = TimelineEventKind::kAlloc;
  }
  const int64_t index = s.writer.written();
  s.writer.add({kind, label, address, bytes, live, t_ns});
  const bool written = s.writer.written() > index;
  if (kind == TimelineEventKind::kAlloc && address != 0 && written) {
    s.alloc_event[address] = index;
    s.named.erase(address);
  } else if (kind == TimelineEventKind::kFree) {
    s.alloc_event.erase(address);
    s.named.erase(address);
  }
}

void MemoryWindowRecorder::describe(const at::Tensor& t, const char* name) {
  if (!t.defined() || !t.has_storage()) return;
  // An operation's output is made by aten::empty inside it, which ends first: the operation
  // that returns it names it.
  if (std::strncmp(name, "aten::empty", 11) == 0) return;
  const auto address = reinterpret_cast<uint64_t>(t.storage().data_ptr().get());
  if (address == 0) return;
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (s.tensors.size() >= kTimelineMaxTensors) return;
  const auto found = s.alloc_event.find(address);
  if (found == s.alloc_event.end()) return;
  bool& named = s.named[address];
  if (named) return;
  named = true;
  s.tensors.push_back({found->second, name, t.sizes().vec(), memory_window::dtype_text(t)});
}

void MemoryWindowRecorder::close(TimelineMeta meta) {
  if (!open_) return;
  memory_window::g_recording.store(nullptr, std::memory_order_release);
  at::removeCallback(state_->operator_hook);
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  tracker.set_observer(nullptr);
  open_ = false;
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.phases.empty()) s.phases.back().end_event = s.writer.written();
  for (uint32_t id = 0, n = memory_label_count(); id < n; ++id)
    meta.labels.push_back(memory_label(id));
  meta.phases = std::move(s.phases);
  meta.tensors = std::move(s.tensors);
  std::sort(meta.tensors.begin(), meta.tensors.end(),
            [](const TimelineTensor& a, const TimelineTensor& b) { return a.event < b.event; });
  meta.window_peak_bytes = tracker.window_peak_bytes();
  s.writer.finish(std::move(meta));
}

}  // namespace gradscope
