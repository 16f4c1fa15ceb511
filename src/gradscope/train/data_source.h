// The inputs of a run: a model kind's data set, served as micro-batches by sample index.
// A batch depends on (seed, first sample, count) alone, so every strategy and every split
// of the effective batch sees the same samples.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/data/split.h"
#include "gradscope/models/model.h"
#include "gradscope/models/registry.h"

namespace gradscope {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Training samples [first, first + count), on the CPU.
  virtual Batch train_batch(int64_t first, int64_t count) const = 0;
  // Held-out samples [first, first + count), in order, wrapping around: the validation
  // split's, or (a source made for --lr auto's search) the search split's.
  virtual Batch val_batch(int64_t first, int64_t count) const = 0;
  virtual int64_t val_samples() const = 0;
  // What the record says about the data (data set, sizes, reference losses).
  virtual nlohmann::json describe() const = 0;
};

// Builds the data source of a model family's kind for the resolved architecture.
// Throws a usage error when the data or the tokenizer is missing (the hint names the fetch).
// `resident_bytes`, when given, receives what the source keeps in CPU tensor memory, measured
// with the tracking allocator (installed here if need be) around the loading.
// `split` says which samples it serves (data/split.h); the search split of each kind:
// - text (causal and masked LM): as many tokens as the validation split (2%), just before it;
// - images with a standard test file (Fashion-MNIST, MNIST): every tenth image of the
//   training file (the test file is not read);
// - emoji: every tenth base emoji group of the training side, chosen as the validation
//   groups are (held_out_by_group), so no base emoji is on two sides;
// - toy problems: no data, the trials evaluate the function itself.
// With config.lr_auto, the run's describe() says what its search split was ("lr_search_split").
std::unique_ptr<DataSource> make_data_source(const ModelFamily& family, const nlohmann::json& arch,
                                             const RunConfig& config,
                                             int64_t* resident_bytes = nullptr,
                                             DataSplit split = DataSplit::kRun);

}  // namespace gradscope
