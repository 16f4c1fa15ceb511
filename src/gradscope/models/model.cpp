#include "gradscope/models/model.h"

#include "gradscope/models/common/layers.h"

namespace gradscope {

void Model::set_packed_projections(bool packed) {
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* attention = module->as<SelfAttentionImpl>()) attention->set_packed(packed);
    if (auto* mlp = module->as<SwiGLUImpl>()) mlp->set_packed(packed);
  }
}

}  // namespace gradscope
