// The cross-entropy of a language-model head, taken over chunks of positions (--loss
// chunked): the logits of the whole batch, (N, V), are never held, in forward or backward.
//
//   loss = sum over rows i with targets[i] != ignore_index of
//          logsumexp(hidden[i] W^T + b) - (hidden[i] W^T + b)[targets[i]]
//
// the same sum F::cross_entropy(F::linear(hidden, W, b), targets, reduction sum) computes.
// Per chunk of chunk_rows rows: the chunk's logits (chunk, V), the row's maximum and log-sum
// of exponentials (log-softmax's own arithmetic) and the chunk's summed loss; then, when
// autograd is recording and an input requires a gradient, that chunk's softmax - one-hot in
// place of its logits, the chunk's rows of grad_hidden = grad_logits W, and grad_W +=
// grad_logits^T hidden_chunk, grad_b += the column sums of grad_logits. The gradients are
// thus taken in forward, for an incoming gradient of 1, while each chunk's logits exist
// (the head's three matmuls, as in the full path, none computed twice); forward keeps them
// (the size of hidden, W and b) in place of the logits, and backward scales them by the
// incoming gradient and hands them on. Backward can therefore run once per forward
// (retain_graph is refused). Without a graph (no_grad, or nothing requires a gradient)
// only the loss is computed and nothing is kept.
//
// Dtypes: under autocast (the trainer's bf16 scope) the head matmuls run in autocast's lower
// precision and the softmax, logsumexp and loss in float32, as autocast runs the full path
// (F::linear in bfloat16, cross_entropy in float32); without autocast everything runs in
// hidden's dtype (float32 or float64), the softmax in at least float32. The gradient's
// matmuls use the matmul dtype too, as autograd would for the full path; grad_W and grad_b
// are summed over chunks in the weight's dtype.
//
// Exactness: per row the values are the full path's up to the rounding of its logsumexp (a
// few units of float32's last place). What differs is the order of three sums over rows: the
// loss (chunk sums, then their sum), grad_W and grad_b (one product per chunk, added up,
// instead of one product over all rows; under bfloat16 each chunk's product is rounded to
// bfloat16 before the sum, as the micro-batches of accumulation are). And the incoming
// gradient g multiplies the finished gradients, where the full path multiplies grad_logits:
// in float32 a rounding apart; under bfloat16 grad_logits is rounded before the scaling
// rather than after. docs/strategies.md, "The chunked loss", derives the tolerance
// `gradscope verify` holds it to.
//
// Dimension legend: N rows (positions), C hidden size, V vocabulary.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace gradscope {

// hidden (..., C), weight (V, C), bias (V) or undefined -> logits (..., V): F::linear, with a
// backward of its own that hands on the weight's gradient as the product itself. Autograd's
// linear takes the same product, grad_logits^T hidden as (V, C), but hands on a view of it
// (the transpose of its transpose), which shares its storage with another tensor: the engine
// cannot add into it, so a weight tied to an embedding gets its two gradients summed into a
// third (V, C) tensor while both addends live. Here the engine adds the second gradient in
// place into the first: two tensors of the weight's size, not three. grad_hidden =
// grad_logits W and grad_b = the column sums, as autograd's; hidden is kept only when the
// weight needs a gradient, the weight only when hidden does. Float32 and float64 without
// autocast; other dtypes, and anything under autocast, take F::linear.
torch::Tensor head_logits(const torch::Tensor& hidden, const torch::Tensor& weight,
                          const torch::Tensor& bias = {});

// logits (N, V), targets (N) int64 -> () the summed cross-entropy over the rows whose target
// is not ignore_index, F::cross_entropy(logits, targets, reduction sum) to a rounding (the
// full path of --loss). Float32 logits, contiguous: the loss's forward overwrites them, block
// by block of rows (about kLogitsBlockBytes each, while they are in cache; one block on CUDA),
// with softmax - one-hot, their gradient for an incoming gradient of 1, and keeps them; its
// backward scales them by the incoming gradient (0 on ignored rows) in place and hands them on
// as the logits' gradient. The step thus holds one (N, V) tensor, the logits, from the head's
// product to its backward, where F::cross_entropy keeps its log-softmax and makes two more of
// the same size in backward; a caller that needs the logits afterwards keeps a copy. As
// chunked_cross_entropy, a second backward (retain_graph) and a backward that builds a graph
// (create_graph) are refused, and so are logits that are a leaf requiring a gradient. Other
// logits take F::cross_entropy, which leaves them as they are and keeps its log-softmax
// instead: bfloat16 ones (under autocast) on a float32 copy, strided float32 and float64 ones
// as they are.
torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets,
                                int64_t ignore_index);

// The bytes of logits cross_entropy_sum takes at once on the CPU (at least one row).
inline constexpr int64_t kLogitsBlockBytes = int64_t{2} << 20;

// hidden (N, C), weight (V, C), bias (V) or undefined, targets (N) int64 -> () summed loss,
// in float32 (float64 when hidden is float64). Differentiable in hidden, weight and bias.
// chunk_rows >= 1; a chunk larger than N is one chunk.
torch::Tensor chunked_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& bias, const torch::Tensor& targets,
                                    int64_t chunk_rows, int64_t ignore_index);

}  // namespace gradscope
