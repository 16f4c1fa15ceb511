// libFuzzer entry point of the idx target (fuzz/targets.h).
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return gradscope::fuzz_idx(data, size);
}
