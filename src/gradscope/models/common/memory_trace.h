// A model of one training step's memory, written beside each model's forward: the tensors the
// forward allocates and drops, which of them autograd saves for backward, and the gradients
// each backward node allocates. `gradscope estimate` replays it to predict peak memory
// without allocating a tensor, for any preset (the paper sizes included).
//
// The rules follow what LibTorch's CPU kernels and autograd formulas do: a linear layer saves its input, not its output; softmax
// saves its output; a multiplication saves only the factors whose gradients need them; a
// reshape of a non-contiguous tensor copies it, and a batched matmul saves its copies. Sizes
// are bytes; the trace is in float32, the dtype of the CPU study.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradscope/core/config.h"

namespace gradscope {

class MemoryTrace {
 public:
  using Id = int;
  static constexpr int64_t kFloat = 4;  // bytes per float32 element
  static constexpr int64_t kLong = 8;   // bytes per int64 element

  // A tensor that lives across steps or exists before the forward starts: the batch, rotary
  // tables, cached masks. Counted in the steady state, never freed by the step.
  Id persistent(int64_t bytes);
  // A new tensor the forward code allocates and holds until release().
  Id alloc(int64_t bytes);
  // The forward code drops its reference; the tensor is freed unless a node saved it.
  void release(Id id);
  // A parameter; `bytes` is its size (and its gradient's). A matrix gives its rows and columns
  // (cols 0: a vector or a table of `rows` rows), for optimizers whose state depends on shape.
  int param(int64_t bytes, int64_t rows = 1, int64_t cols = 0);

  // An autograd node: it saves `saved` until its backward runs; its backward takes the
  // gradients of `outputs`, allocates one for each of `grad_inputs` (tensors that require
  // grad) and for each parameter in `params`, plus `scratch` bytes of temporaries.
  void node(std::vector<Id> saved, std::vector<Id> grad_inputs, std::vector<Id> outputs,
            std::vector<int> params = {}, int64_t scratch = 0);

  // Marks a block (blocks count in the order of model.blocks()) or a residual sub-layer of
  // one, the units checkpointing wraps: `in` is its input, `out` the tensor it returns.
  enum class Unit { kBlock, kAttention, kMlp };
  void begin(Unit unit, Id in);
  void end(Unit unit, Id out);

  // The step's loss; the forward releases everything else before the trace ends.
  void set_loss(Id id) { loss_ = id; }

  int64_t bytes(Id id) const { return tensors_[static_cast<size_t>(id)].bytes; }
  int64_t grad_bytes(Id id) const { return tensors_[static_cast<size_t>(id)].grad_bytes; }

  // ---- common layers, as gradscope's models implement them (models/common/layers.h) ----
  // A view of an existing tensor: no bytes of its own, but a gradient of `grad_bytes`.
  Id view(int64_t grad_bytes);
  // y = x W^T (+ b) for n rows; saves x (or `keep`, the tensor a view x belongs to). `weight`
  // reuses a parameter (tied embeddings); -1 makes a new one.
  Id linear(Id x, int64_t n, int64_t in, int64_t out, bool bias, int weight = -1, Id keep = -1);
  Id rms_norm(Id x, int64_t n, int64_t c);
  Id layer_norm(Id x, int64_t n, int64_t c, bool bias);
  // Returns the output; *weight receives the table's parameter (for tied heads).
  Id embedding(int64_t n, int64_t vocab, int64_t c, int* weight = nullptr);
  // Training-mode dropout (dropout() in layers.h): a bool mask of the input's size is saved.
  Id dropout(Id x, double p);
  // dropout(x, p) where the forward code keeps only the result: x is released if replaced.
  Id drop(Id x, double p);
  // x + dropout(branch, p), the end of a residual sub-layer; branch is released.
  Id residual(Id x, Id branch, double p);
  // Elementwise activation that saves its input (GELU, SiLU).
  Id activation(Id x);
  // a + b; neither is saved. `param`: b is that parameter (broadcast), not a tensor.
  Id add(Id a, Id b, int param = -1);
  // a * b, both requiring grad; saves both.
  Id mul(Id a, Id b);
  // A copy (contiguous(), a copying reshape, cat): the gradient passes through.
  Id copy(Id x, int64_t bytes);

  // --projections packed (packed_linear in layers.h), read by self_attention and by the
  // models' gated MLPs. Set before the model's trace is written.
  void set_packed_projections(bool packed) { packed_projections_ = packed; }
  bool packed_projections() const { return packed_projections_; }
  // Linear layers of widths `outs` reading the same x of n rows as one product: the stacked
  // weight is a copy that the product saves with x; the output is one tensor, returned first,
  // then one view of it per layer (the split's backward joins their gradients). The stacked
  // weight's gradient becomes the parameters' gradients. Release the output, not the views.
  std::vector<Id> packed_linear(Id x, int64_t n, int64_t in, const std::vector<int64_t>& outs,
                                bool bias);
  // --attention, and whether the step runs on CUDA: which attention path self_attention
  // follows (resolved_attention in layers.h). Set before the model's trace is written.
  void set_attention(Attention attention, bool cuda) {
    attention_ = attention;
    cuda_ = cuda;
  }
  // Self-attention of SelfAttentionImpl: projections, optional rotary, attention (SDPA's fused
  // kernel or the math path), output projection. `mask_bytes` is the bool mask's size (0
  // without one).
  struct AttentionShape {
    int64_t batch, tokens, hidden, heads, kv_heads, head_size;
    bool bias = false, rotary = false;
    double dropout = 0;
    int64_t mask_bytes = 0;
    // Whether the mask is the batch's own (padding, windows) rather than only the causal one,
    // which the fused kernel takes as a flag and never materializes.
    bool batch_mask = false;
    bool causal = false;
  };
  Id self_attention(Id x, const AttentionShape& s);
  // Whether an attention with dropout `dropout` takes SDPA's fused kernel.
  bool fused_attention(double dropout) const;
  // Cross-entropy (log_softmax then nll_loss, F::cross_entropy) over n rows of v classes,
  // summed: a classifier's loss.
  Id cross_entropy(Id logits, int64_t n, int64_t v);

  // ---- the loss head of a language model ----
  // --loss: 0 = the full cross-entropy; else --loss-chunk, the positions whose logits exist
  // at once (lm_loss).
  void set_loss_chunk(int64_t rows) { loss_chunk_ = rows; }
  // Marks where the loss head starts: the tensors allocated from here on are the head's, and
  // Replay::head_saved_bytes is what of them the forward leaves for backward (the `logits`
  // part of the estimate).
  void begin_head() { head_first_ = static_cast<Id>(tensors_.size()); }
  // The projection of n rows of `in` features to `vocab` logits (tied to `weight` if >= 0)
  // and their summed cross-entropy, full or chunked as set_loss_chunk says. Releases nothing
  // of x's; ends the trace's forward (the loss).
  void lm_loss(Id x, int64_t n, int64_t in, int64_t vocab, bool bias, int weight);

  // ---- LoRA (common/lora.h) ----
  // Adapters of rank `rank` on the projections named in `targets` (q, k, v, o, gate, up, down),
  // with dropout on their input; every parameter made while frozen() gets no gradient.
  struct Lora {
    std::vector<std::string> targets;
    int64_t rank = 0;
    double dropout = 0;
  };
  // Turns LoRA on (frozen from here on) when `lora` has targets. Set before the model's trace.
  void set_lora(Lora lora);
  // Parameters made while frozen get no gradient and no optimizer state (LoRA's base); a model
  // turns it off around a head that trains beside the adapters (ViT's classifier).
  void set_frozen(bool frozen) { frozen_ = frozen; }
  bool frozen() const { return frozen_; }
  // Whether adapt() adds adapters here (NanoVLM's vision tower: no).
  void set_adapting(bool adapting) { adapting_ = adapting; }
  // y, the output of the projection `target` (of n rows, in -> out) from x, plus its adapter's
  // update when LoRA adapts it: scaling * B(A(dropout(x))) added out of place (y released).
  // `target` may also be "gate_up" (GeGLU's Wi, adapted for gate or up).
  Id adapt(Id x, Id y, int64_t n, int64_t in, int64_t out, const std::string& target);

  // ---- replay ----
  struct Replay {
    int64_t forward_peak = 0;   // most live at once during the forward, above its start
    int64_t backward_peak = 0;  // most live at once during the backward, above the forward's start
    int64_t saved_bytes = 0;    // held for backward when the forward ends
    int64_t grads_bytes = 0;    // parameter gradients the backward leaves
    int64_t grads_at_backward_peak = 0;  // of the gradients, those allocated at backward_peak
    int64_t head_saved_bytes = 0;  // of saved_bytes, what the loss head holds (begin_head)
  };
  struct Checkpointing {
    bool enabled = false;
    int64_t every = 1;             // blocks 0, k, 2k, ... are wrapped
    Unit unit = Unit::kBlock;  // what a wrapped block recomputes: all, attention or MLP
    // --saved-input bf16: a wrapped unit keeps a bfloat16 copy of its (float32) input, half its
    // bytes, and widens it back for the recompute.
    bool input_bf16 = false;
  };
  // Replays the forward and backward. `grads_exist`: parameter gradients from an earlier
  // micro-batch are already allocated (accumulation), so new ones are added and freed.
  // `with_grad` false replays a forward under no_grad (evaluation): nothing is saved.
  // Memory a step holds beside the trace's tensors (a sharded step's collective buffers and
  // gathered parameters), modelled by the caller: the replay says where it is, the overlay
  // answers the bytes it holds, negative for bytes of the trace it has freed (gradients it
  // took over). Each call returns the most it held during the call, its transients included.
  class Overlay {
   public:
    virtual ~Overlay() = default;
    // The replay moves into block `block` of model.blocks() (-1: outside every block), in the
    // forward or in the backward (a recompute there included).
    virtual int64_t enter_block(int64_t block, bool backward) = 0;
    // Every backward node that makes trainable parameter `param`'s gradient has run (an index
    // into trainable_param_shapes()); at the end of backward, also for those that got none.
    virtual int64_t gradient_done(int param) = 0;
    virtual int64_t bytes() const = 0;
  };
  Replay replay(const Checkpointing& checkpointing, bool grads_exist, bool with_grad,
                Overlay* overlay = nullptr) const;

  int64_t persistent_bytes() const;
  int64_t params_bytes() const;  // every parameter, frozen ones included
  int64_t frozen_params_bytes() const;
  const std::vector<int64_t>& param_sizes() const { return params_; }
  // The sizes of the parameters that train (all without LoRA): what gets gradients and state.
  std::vector<int64_t> trainable_param_sizes() const;
  // The shapes of the parameters that train, for optimizers whose state depends on them.
  struct ParamShape {
    int64_t bytes = 0;
    int64_t rows = 1;
    int64_t cols = 0;           // 0: not a matrix
    bool block_matrix = false;  // a matrix inside a block (an attention or MLP projection)
    int64_t block = -1;         // the block of model.blocks() it belongs to; -1: none
  };
  std::vector<ParamShape> trainable_param_shapes() const;
  // Blocks marked with begin(kBlock, ...).
  int64_t block_count() const;

 private:
  // The written-out attention of self_attention (layers.cpp's math_attention): its output
  // laid out as (B, T, heads * HS).
  Id math_attention(Id q, Id k, Id v, Id k_full, Id v_full, const AttentionShape& s);
  enum class Kind { kAlloc, kRelease, kNode, kBegin, kEnd };
  struct Event {
    Kind kind;
    Id id = -1;  // alloc, release; begin/end: the unit's input/output
    int node = -1;
    Unit unit = Unit::kBlock;
  };
  struct Tensor {
    int64_t bytes;
    bool persistent;
    int64_t grad_bytes;
    bool with_grad_only = false;  // allocated only when the forward builds a graph
  };
  struct Node {
    std::vector<Id> saved, grad_inputs, outputs;
    std::vector<int> params;
    int64_t scratch;
    int64_t block;  // the block being traced when it was made; -1: none
    // Saved tensors whose memory becomes the gradients this node's backward hands on: freed
    // as those are made, not after.
    std::vector<Id> handed = {};
  };
  class Replayer;

  Id rotary(Id x, int64_t elements);

  std::vector<Tensor> tensors_;
  std::vector<int64_t> params_;
  std::vector<bool> param_frozen_;
  std::vector<ParamShape> param_shapes_;
  int block_depth_ = 0;
  int64_t blocks_begun_ = 0, open_block_ = -1;  // blocks traced so far; the one open
  Lora lora_;
  bool frozen_ = false;
  bool adapting_ = true;
  std::vector<Node> nodes_;
  std::vector<Event> events_;
  Id loss_ = -1;
  bool packed_projections_ = false;
  Attention attention_ = Attention::kAuto;
  bool cuda_ = false;
  Id head_first_ = -1;
  int64_t loss_chunk_ = 0;
};

}  // namespace gradscope
