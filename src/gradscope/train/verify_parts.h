// What the checks of `gradscope verify` share (verify.cpp: one process against itself,
// verify_sharding.cpp: several ranks against one process): the tolerance every reordering of
// a sum is held to, verify's reference optimizer, and how a check's session starts.
#pragma once

#include <torch/torch.h>

#include "gradscope/strategy/strategy.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace verify_parts {

// A sum over the batch in another order (micro-batches, ranks, chunks of positions, SDPA's
// blocks of keys) agrees to float32's rounding, norm-wise per tensor:
inline constexpr double kAccumulationTolerance = 1e-5;
// bfloat16 keeps 8 significant bits (2^-8 = 3.9e-3 relative spacing). Each micro-batch's
// products are rounded to it apart, so accumulation sums k rounded parts where standard
// training rounds one sum: differences of about one spacing per element, well under 2e-2
// norm-wise; an accumulation that dropped or doubled a micro-batch is off by 1/k or more.
inline constexpr double kAccumulationToleranceBf16 = 2e-2;
// The optimizer verify steps with where a check compares parameters: SGD, whose update is
// linear in the gradient (the same arithmetic in a fused step or after backward) and whose
// momentum folds micro-batches exactly. Verify's own choice, never the run's.
inline constexpr const char* kReferenceOptimizer = "sgd";

class NullObserver : public PhaseObserver {
 public:
  void enter(Phase) override {}
};

// LoRA's B starts at zero, which leaves A without a gradient in the first step: every check
// draws B from the seed instead, the same in every session, so that both matrices are checked.
inline void nonzero_adapters(Session& session) {
  if (!session.config().lora()) return;
  auto gen = at::detail::createCPUGenerator(session.config().seed + 1);
  draw_lora_b(session.model(), 0.02, gen);
}

}  // namespace verify_parts
}  // namespace gradscope
