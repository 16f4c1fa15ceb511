// libFuzzer entry point of the sweep_file target (fuzz/targets.h).
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return gradscope::fuzz_sweep_file(data, size);
}
