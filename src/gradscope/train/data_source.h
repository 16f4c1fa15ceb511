// The inputs of a run: a model kind's data set, served as micro-batches by sample index.
// A batch depends on (seed, first sample, count) alone, so every strategy and every split
// of the effective batch sees the same samples.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/models/model.h"
#include "gradscope/models/registry.h"

namespace gradscope {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Training samples [first, first + count), on the CPU.
  virtual Batch train_batch(int64_t first, int64_t count) const = 0;
  // Validation samples [first, first + count), in order, wrapping around.
  virtual Batch val_batch(int64_t first, int64_t count) const = 0;
  virtual int64_t val_samples() const = 0;
  // What the record says about the data (data set, sizes, reference losses).
  virtual nlohmann::json describe() const = 0;
};

// Builds the data source of a model family's kind for the resolved architecture.
// Throws a usage error when the data or the tokenizer is missing (the hint names the fetch).
// `resident_bytes`, when given, receives what the source keeps in CPU tensor memory, measured
// with the tracking allocator (installed here if need be) around the loading.
std::unique_ptr<DataSource> make_data_source(const ModelFamily& family, const nlohmann::json& arch,
                                             const RunConfig& config,
                                             int64_t* resident_bytes = nullptr);

}  // namespace gradscope
