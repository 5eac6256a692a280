// FNV-1a: a stable (implementation-independent) 64-bit hash of text, for names and payloads that
// must compare equal across processes and builds. Not for untrusted keys of a hash table.
#pragma once

#include <cstdint>
#include <string_view>

namespace backhaul {

constexpr uint64_t fnv1a(std::string_view text, uint64_t seed = 14695981039346656037ull) {
  uint64_t h = seed;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace backhaul
