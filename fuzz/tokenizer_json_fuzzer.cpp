// libFuzzer entry point of the tokenizer_json target (fuzz/targets.h).
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return gradscope::fuzz_tokenizer_json(data, size);
}
