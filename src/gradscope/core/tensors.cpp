#include "gradscope/core/tensors.h"

#include <unordered_set>

namespace gradscope {

int64_t tensors_bytes(const std::vector<torch::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t total_bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    if (!t.has_storage()) {
      // Sparse and other storage-less layouts: what the tensor reports for itself.
      total_bytes += static_cast<int64_t>(t.nbytes());
      continue;
    }
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (seen.insert(storage).second) total_bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return total_bytes;
}

int64_t grads_bytes(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  return tensors_bytes(grads);
}

}  // namespace gradscope
