#include "gradscope/models/model.h"

#include "gradscope/models/common/layers.h"

namespace gradscope {

void Model::set_block_runner(RunnerLayer layer, LayeredBlockRunner runner) {
  runners_[static_cast<size_t>(layer)] = std::move(runner);
}

bool Model::has_block_runner() const {
  for (const auto& runner : runners_)
    if (runner) return true;
  return false;
}

torch::Tensor Model::run_block_from(size_t layer, Block& block, const torch::Tensor& x,
                                    const BlockContext& ctx) {
  while (layer < runners_.size() && !runners_[layer]) ++layer;
  if (layer == runners_.size()) {
    // Innermost, so that a recompute in backward, which runs the layers inside its own, is
    // labelled with the block too.
    const MemoryScope scope(block_scope_name(block));
    return block.forward(x, ctx);
  }
  const BlockRunner inner = [this, layer](Block& b, const torch::Tensor& in,
                                          const BlockContext& c) {
    return run_block_from(layer + 1, b, in, c);
  };
  return runners_[layer](block, x, ctx, inner);
}

const std::string& Model::block_scope_name(const Block& block) {
  const auto found = block_scope_names_.find(&block);
  if (found != block_scope_names_.end()) return found->second;
  for (const auto& item : named_modules("", /*include_self=*/false))
    if (item.value().get() == &block) return block_scope_names_[&block] = item.key();
  return block_scope_names_[&block] = "block";
}

void Model::set_packed_projections(bool packed) {
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* attention = module->as<SelfAttentionImpl>()) attention->set_packed(packed);
    if (auto* mlp = module->as<SwiGLUImpl>()) mlp->set_packed(packed);
  }
}

std::vector<std::string> Model::add_lora(const LoraOptions& options, at::Generator& gen) {
  const std::string scope = lora_scope();
  std::vector<std::string> adapted;
  if (scope.empty()) {
    adapted = attach_lora(*this, options, gen);
  } else {
    for (auto& name : attach_lora(*named_modules("", false)[scope], options, gen))
      adapted.push_back(scope + "." + name);
  }
  const auto keep = lora_trainable();
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    bool trains = is_lora_parameter(name);
    for (const auto& module : keep)
      trains = trains || name.compare(0, module.size() + 1, module + ".") == 0;
    item.value().set_requires_grad(trains);
  }
  return adapted;
}

}  // namespace gradscope
