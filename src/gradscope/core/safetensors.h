// Weights in the safetensors format (https://github.com/huggingface/safetensors), read and
// written by gradscope itself, with the file names Hugging Face gives a model's weights.
//
// A file is: 8 bytes, a little-endian u64 N; N bytes of UTF-8 JSON, an object that maps each
// tensor's name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
// "__metadata__" object of strings; then the data buffer, whose bytes the tensors cover
// exactly, each little-endian in C order, at offsets counted from the buffer's start.
// A sharded set is a folder with model.safetensors.index.json ({"metadata": {"total_size"},
// "weight_map": {name: shard file}}) and its shards.
//
// Files come from outside: every length, offset and shape is checked against the file's size
// before anything is allocated or read, and every failure is a usage error (exit 2) naming
// the file and the tensor (docs/input-safety.md). Only float32, bfloat16 and float16 tensors
// are read; those and int64 (token ids and labels, beside a batch's outputs) are written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace gradscope {

// One tensor's entry in a header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16"
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets in the data buffer
  std::string file;            // the file it is in
};

// The entries of a .safetensors file, or of a folder (model.safetensors, or
// model.safetensors.index.json and its shards), checked against the files' sizes; sorted by
// name. A folder holding both model.safetensors and an index is read from model.safetensors,
// as Hugging Face's loaders do.
std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path);

// Every tensor of a file or folder, as CPU tensors of the file's dtype (float32, bfloat16,
// float16). Every header is checked before the first tensor is allocated, and each tensor is
// read straight into its storage.
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path);

// Writes `tensors` (in this order, any device, made contiguous on the CPU) to one file,
// atomically (temporary file + rename; core/files.h). Metadata: {"format": "pt"} plus
// `metadata` (which may replace "format"). Names must be unique, non-empty UTF-8 other than
// "__metadata__"; a tensor of another dtype is a usage error naming it. The header is padded
// with spaces to a multiple of 8 bytes, as the reference writer does.
void write_safetensors(const std::string& file,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a folder's weights: model.safetensors when the total fits max_shard_bytes, else shards
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json (as Hugging Face names
// them). Tensors fill shards in order; a tensor larger than max_shard_bytes gets a shard of its
// own. Files of an earlier set in `dir` that this one does not use (model.safetensors, the
// index, shards named as above) are removed, so the folder reads back as what was written.
// Returns the files written.
std::vector<std::string> write_safetensors_set(
    const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
    int64_t max_shard_bytes = int64_t{5} << 30);

}  // namespace gradscope
