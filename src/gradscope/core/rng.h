// Counter-based randomness: a value depends on (seed, index) alone, never on a shared
// generator, so the data stream is the same whatever the batch split or thread.
#pragma once

#include <cstdint>

namespace gradscope {

// SplitMix64 finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of a (seed, stream, index) triple: independent streams for independent uses.
inline uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed) ^ stream) ^ index);
}

// Uniform double in [0, 1) from a hash.
inline double unit_double(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

}  // namespace gradscope
