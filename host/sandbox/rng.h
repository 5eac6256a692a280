// Deterministic hashing for generated data: every generated value is a pure function of
// (seed, what, where), so any item can be produced on its own, in any order, on any thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace backhaul::sandbox {

// The splitmix64 finalizer. A bijection on 64-bit values (see unmix64).
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

namespace detail {

// Multiplicative inverse of an odd number modulo 2^64 (Newton's iteration).
constexpr uint64_t inverse_odd(uint64_t a) {
  uint64_t x = a;  // correct to 3 bits; each step doubles the number of correct bits
  for (int i = 0; i < 6; ++i) x *= 2 - a * x;
  return x;
}

constexpr uint64_t unshift_xor(uint64_t y, int shift) {
  uint64_t x = y;
  for (int i = 0; i < 64 / shift + 1; ++i) x = y ^ (x >> shift);
  return x;
}

}  // namespace detail

// Inverse of mix64: unmix64(mix64(x)) == x.
constexpr uint64_t unmix64(uint64_t z) {
  z = detail::unshift_xor(z, 31);
  z *= detail::inverse_odd(0x94d049bb133111ebULL);
  z = detail::unshift_xor(z, 27);
  z *= detail::inverse_odd(0xbf58476d1ce4e5b9ULL);
  return detail::unshift_xor(z, 30);
}

static_assert(unmix64(mix64(0x0123456789abcdefULL)) == 0x0123456789abcdefULL);

// Hashes a sequence of integers into one well-mixed value.
inline uint64_t hash64(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (uint64_t part : parts) h = mix64(h ^ mix64(part + 0x9e3779b97f4a7c15ULL));
  return h;
}

// FNV-1a: a stable (implementation-independent) hash of text.
constexpr uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// A splitmix64 stream: next() yields the sequence seeded by `seed`.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0, bound); bound > 0.
  uint64_t below(uint64_t bound) { return next() % bound; }
  // Uniform in [0, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

inline constexpr std::string_view kBase62 =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

// Exactly 11 base62 digits (62^11 > 2^64), most significant first, so the text is invertible.
inline std::string base62_fixed11(uint64_t value) {
  std::string out(11, '0');
  for (int i = 10; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kBase62[value % 62];
    value /= 62;
  }
  return out;
}

// Inverse of base62_fixed11; false if `text` is not 11 base62 digits or overflows 64 bits.
inline bool parse_base62_fixed11(std::string_view text, uint64_t* value) {
  if (text.size() != 11) return false;
  uint64_t acc = 0;
  for (char c : text) {
    size_t digit = kBase62.find(c);
    if (digit == std::string_view::npos) return false;
    if (acc > (UINT64_MAX - digit) / 62) return false;
    acc = acc * 62 + digit;
  }
  *value = acc;
  return true;
}

// `length` pseudo-random characters of [A-Za-z0-9] drawn from `rng`.
inline std::string random_alnum(SplitMix64& rng, size_t length) {
  std::string out(length, '0');
  for (char& c : out) c = kBase62[rng.below(62)];
  return out;
}

// `length` lower-case hex digits drawn from `rng` (commit SHAs).
inline std::string random_hex(SplitMix64& rng, size_t length) {
  static constexpr std::string_view kHex = "0123456789abcdef";
  std::string out(length, '0');
  for (char& c : out) c = kHex[rng.below(16)];
  return out;
}

}  // namespace backhaul::sandbox
