// libFuzzer entry point of the run_record target (fuzz/targets.h).
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return gradscope::fuzz_run_record(data, size);
}
