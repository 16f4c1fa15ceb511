// What the published tensor names (hf_weights.cpp) and configurations (hf_config.cpp) share.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace gradscope::hf_weights_detail {

// A usage error unless `model` is one of the registry's models with published names.
void check_published(const std::string& model);

// ViT's classes: the architecture's num_labels, checked.
int64_t vit_num_labels(const nlohmann::json& arch);

}  // namespace gradscope::hf_weights_detail
