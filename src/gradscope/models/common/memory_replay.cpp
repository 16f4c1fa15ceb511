// The replay of a memory trace (memory_trace.h): what a step's forward and backward hold,
// event by event, with checkpointed units recomputed in backward and an overlay for what a
// sharded step holds beside the trace.
#include "gradscope/models/common/memory_trace.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <vector>

namespace gradscope {

using Id = MemoryTrace::Id;

class MemoryTrace::Replayer {
 public:
  Replayer(const MemoryTrace& trace, const Checkpointing& checkpointing, bool grads_exist,
           Overlay* overlay)
      : t_(trace),
        ck_(checkpointing),
        overlay_(overlay),
        fwd_(trace.tensors_.size(), 0),
        saved_(trace.tensors_.size(), 0),
        allocated_(trace.tensors_.size(), false),
        grad_(trace.tensors_.size(), -1),
        param_grad_(trace.params_.size(), grads_exist) {
    find_units();
    if (grads_exist)
      for (const int64_t bytes : t_.params_) grads_live_ += bytes;
    if (overlay_) {
      // The backward nodes that make each parameter's gradient: each runs once, from the tape
      // or from a recompute's.
      nodes_left_.assign(t_.params_.size(), 0);
      for (const Node& n : t_.nodes_)
        for (int p : n.params) ++nodes_left_[static_cast<size_t>(p)];
      int trainable = 0;
      for (size_t p = 0; p < t_.params_.size(); ++p)
        trainable_index_.push_back(t_.param_frozen_[p] ? -1 : trainable++);
    }
  }

  Replay run(bool with_grad) {
    std::vector<Entry> tape;
    forward(0, t_.events_.size(), with_grad, with_grad && ck_.enabled, tape);
    Replay r;
    if (overlay_) moved(overlay_->enter_block(-1, false));
    r.forward_peak = peak_;
    // The step's code returns: every forward reference but the loss's is dropped.
    for (size_t id = 0; id < fwd_.size(); ++id) {
      if (static_cast<Id>(id) == t_.loss_) continue;
      fwd_[id] = 0;
      maybe_free(static_cast<Id>(id));
    }
    r.saved_bytes = live_;
    if (t_.head_first_ >= 0)
      for (size_t id = static_cast<size_t>(t_.head_first_); id < allocated_.size(); ++id)
        if (allocated_[id]) r.head_saved_bytes += t_.bytes(static_cast<Id>(id));
    if (!with_grad) return r;
    peak_ = live_ + extra();
    grads_at_peak_ = grads_live_;
    if (t_.loss_ >= 0) set_grad(t_.loss_, t_.bytes(t_.loss_));
    in_backward_ = true;
    backward(tape);
    if (overlay_) {
      // What backward never reached is done now (the step reduces it as zeros).
      moved(overlay_->enter_block(-1, true));
      for (size_t p = 0; p < nodes_left_.size(); ++p)
        if (trainable_index_[p] >= 0 && nodes_left_[p] > 0) {
          nodes_left_[p] = 0;
          moved(overlay_->gradient_done(trainable_index_[p]));
        }
    }
    r.backward_peak = peak_;
    r.grads_at_backward_peak = grads_at_peak_;
    for (size_t p = 0; p < t_.params_.size(); ++p)
      if (param_grad_[p]) r.grads_bytes += t_.params_[p];
    return r;
  }

 private:
  struct Unit {
    size_t begin, end;  // event indices of the markers
    Id in, out;
    bool checkpointed;
    int64_t block;  // the block it is or lies in; -1: none
    bool is_block;
  };
  struct Entry {
    int node = -1;  // an autograd node, or
    int unit = -1;  // a checkpointed unit (recomputed in backward)
  };

  void find_units() {
    std::vector<size_t> open;
    int64_t block = -1;
    for (size_t i = 0; i < t_.events_.size(); ++i) {
      const Event& e = t_.events_[i];
      if (e.kind == Kind::kBegin) {
        if (e.unit == MemoryTrace::Unit::kBlock) ++block;
        open.push_back(i);
      } else if (e.kind == Kind::kEnd) {
        if (open.empty()) throw std::logic_error("memory trace: unit ended twice");
        const size_t b = open.back();
        open.pop_back();
        const bool wrapped = ck_.enabled && block >= 0 && block % ck_.every == 0 &&
                             e.unit == ck_.unit && open.size() <= 1;
        unit_at_[b] = static_cast<int>(units_.size());
        units_.push_back({b, i, t_.events_[b].id, e.id, wrapped, block,
                          e.unit == MemoryTrace::Unit::kBlock});
      }
    }
    if (!open.empty()) throw std::logic_error("memory trace: a unit was not ended");
  }

  int64_t extra() const { return overlay_ ? overlay_->bytes() : 0; }
  void touch() { raise(live_ + extra()); }
  // After a call into the overlay: the most it held meanwhile.
  void moved(int64_t overlay_peak) { raise(live_ + overlay_peak); }
  // A new peak, and in backward the parameter gradients allocated at that moment.
  void raise(int64_t bytes) {
    if (bytes <= peak_) return;
    peak_ = bytes;
    if (in_backward_) grads_at_peak_ = grads_live_;
  }
  // The backward reaches block `block` (the overlay hears of changes only).
  void reach(int64_t block) {
    if (!overlay_ || block == backward_block_) return;
    backward_block_ = block;
    moved(overlay_->enter_block(block, true));
  }
  void maybe_free(Id id) {
    if (allocated_[id] && fwd_[id] == 0 && saved_[id] == 0) {
      allocated_[id] = false;
      live_ -= t_.bytes(id);
    }
  }
  void set_grad(Id id, int64_t bytes) {
    grad_[id] = bytes;
    live_ += bytes;
  }
  void drop_grad(Id id) {
    if (grad_[id] > 0) live_ -= grad_[id];
    grad_[id] = -1;
  }

  // Replays events [first, last). `checkpoint`: wrapped units run without saving anything,
  // and are recorded for a recompute in backward.
  void forward(size_t first, size_t last, bool with_grad, bool checkpoint,
               std::vector<Entry>& tape) {
    for (size_t i = first; i < last; ++i) {
      const Event& e = t_.events_[i];
      switch (e.kind) {
        case Kind::kAlloc:
          if (!with_grad && t_.tensors_[static_cast<size_t>(e.id)].with_grad_only) break;
          if (!allocated_[e.id]) {
            allocated_[e.id] = true;
            live_ += t_.bytes(e.id);
          }
          fwd_[e.id] = 1;
          touch();
          break;
        case Kind::kRelease:
          fwd_[e.id] = 0;
          maybe_free(e.id);
          break;
        case Kind::kNode:
          if (!with_grad) break;
          for (Id s : t_.nodes_[e.node].saved) ++saved_[s];
          for (Id s : t_.nodes_[e.node].handed) ++saved_[s];
          tape.push_back({e.node, -1});
          break;
        case Kind::kBegin: {
          auto it = unit_at_.find(i);
          // The forward enters a block (a recompute in backward is within its block's).
          const bool block =
              overlay_ && !in_backward_ && it != unit_at_.end() && units_[it->second].is_block;
          if (block) moved(overlay_->enter_block(units_[it->second].block, false));
          if (!checkpoint || it == unit_at_.end() || !units_[it->second].checkpointed) break;
          const Unit& u = units_[it->second];
          std::vector<Entry> none;
          forward(i + 1, u.end, /*with_grad=*/false, false, none);
          keep_input(u);
          tape.push_back({-1, it->second});
          i = u.end;
          if (block) moved(overlay_->enter_block(-1, false));
          break;
        }
        case Kind::kEnd:
          if (overlay_ && !in_backward_ && e.unit == MemoryTrace::Unit::kBlock)
            moved(overlay_->enter_block(-1, false));
          break;
      }
    }
  }

  void backward(const std::vector<Entry>& tape) {
    for (auto it = tape.rbegin(); it != tape.rend(); ++it) {
      if (it->unit >= 0) {
        reach(units_[it->unit].block);
        recompute(units_[it->unit]);
        continue;
      }
      const Node& n = t_.nodes_[it->node];
      reach(n.block);
      for (Id s : n.handed) {
        --saved_[s];
        maybe_free(s);
      }
      bool any = false;
      int64_t incoming = 0;
      for (Id o : n.outputs) {
        if (grad_[o] >= 0) {
          any = true;
          incoming += grad_[o];
        }
      }
      if (any) {
        const bool pass_through = n.scratch < 0;
        int64_t transient = std::max<int64_t>(n.scratch, 0);
        bool moved = false;
        for (Id in : n.grad_inputs) {
          if (grad_[in] >= 0) {
            transient += t_.grad_bytes(in);  // summed into the gradient already there
          } else if (pass_through) {
            // The first input takes over the incoming gradient's memory; the others share it.
            grad_[in] = moved ? 0 : incoming;
            moved = true;
          } else {
            set_grad(in, t_.grad_bytes(in));
          }
        }
        for (int p : n.params) {
          if (param_grad_[p]) {
            transient += t_.params_[p];  // added into .grad, then freed
          } else {
            param_grad_[p] = true;
            live_ += t_.params_[p];
            grads_live_ += t_.params_[p];
          }
        }
        raise(live_ + transient + extra());
        for (Id o : n.outputs) {
          if (moved)
            grad_[o] = -1;  // handed on, not freed
          else
            drop_grad(o);
        }
      }
      for (Id s : n.saved) {
        --saved_[s];
        maybe_free(s);
      }
      if (overlay_)
        for (int p : n.params)
          if (--nodes_left_[static_cast<size_t>(p)] == 0)
            moved(overlay_->gradient_done(trainable_index_[static_cast<size_t>(p)]));
    }
  }

  // What a checkpoint keeps of its input until backward: the input itself, or with
  // input_bf16 a bfloat16 copy of it (half a float32 input's bytes), the input then freed
  // when nothing else holds it.
  void keep_input(const Unit& u) {
    if (!ck_.input_bf16) {
      ++saved_[u.in];
      return;
    }
    live_ += t_.bytes(u.in) / 2;
    touch();
  }

  // A checkpointed unit in backward: its forward again with a graph, then its backward. A
  // bfloat16 copy of its input is widened back for the recompute (a float32 tensor of the
  // input's bytes), and both are freed with the unit's backward.
  void recompute(const Unit& u) {
    const int64_t widened = ck_.input_bf16 ? t_.bytes(u.in) : 0;
    live_ += widened;
    touch();
    if (grad_[u.out] >= 0) {
      std::vector<Entry> inner;
      forward(u.begin + 1, u.end, /*with_grad=*/true, false, inner);
      backward(inner);
      fwd_[u.out] = 0;
      maybe_free(u.out);
    }
    if (ck_.input_bf16) {
      live_ -= widened + t_.bytes(u.in) / 2;
      return;
    }
    --saved_[u.in];
    maybe_free(u.in);
  }

  const MemoryTrace& t_;
  Checkpointing ck_;
  Overlay* overlay_;
  bool in_backward_ = false;
  int64_t backward_block_ = -1;
  std::vector<int> nodes_left_;       // per parameter: backward nodes still to run
  std::vector<int> trainable_index_;  // per parameter: its index among the trainable; -1
  std::vector<int> fwd_, saved_;
  std::vector<bool> allocated_;
  std::vector<int64_t> grad_;  // -1: none
  std::vector<bool> param_grad_;
  std::vector<Unit> units_;
  std::map<size_t, int> unit_at_;
  int64_t live_ = 0, peak_ = 0;
  int64_t grads_live_ = 0;     // parameter gradients allocated (before backward: those that exist)
  int64_t grads_at_peak_ = 0;  // of them, at backward's peak
};

MemoryTrace::Replay MemoryTrace::replay(const Checkpointing& checkpointing, bool grads_exist,
                                        bool with_grad, Overlay* overlay) const {
  Replayer r(*this, checkpointing, grads_exist, overlay);
  return r.run(with_grad);
}

}  // namespace gradscope
