// libFuzzer entry point of the png target (fuzz/targets.h).
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return gradscope::fuzz_png(data, size);
}
