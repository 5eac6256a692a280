#include "core/common/json_check.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace backhaul {
namespace {

class Checker {
 public:
  explicit Checker(std::string_view text)
      : p_(reinterpret_cast<const unsigned char*>(text.data())), end_(p_ + text.size()) {}

  bool utf8() {  // the whole text: well-formed UTF-8, nothing else asked
    while (p_ != end_) {
      if (*p_ < 0x80) {
        ++p_;
      } else if (!multibyte()) {
        return false;
      }
    }
    return true;
  }

  // value (',' value | '}' | ']')* with the open containers on an explicit stack, so nesting
  // depth costs memory, never the call stack.
  bool document() {
    std::vector<char> open;  // '{' or '['
    skip_space();
    for (;;) {
      // A value is expected here.
      if (at('{') || at('[')) {
        const char kind = static_cast<char>(*p_++);
        skip_space();
        if (at(kind == '{' ? '}' : ']')) {
          ++p_;
        } else {
          open.push_back(kind);
          if (kind == '{' && !key()) return false;
          continue;
        }
      } else if (!scalar()) {
        return false;
      }
      // After a value: close containers or go on to the next member.
      for (;;) {
        skip_space();
        if (open.empty()) return p_ == end_;
        if (at(',')) {
          ++p_;
          skip_space();
          if (open.back() == '{' && !key()) return false;
          break;
        }
        if (!at(open.back() == '{' ? '}' : ']')) return false;
        ++p_;
        open.pop_back();
      }
    }
  }

 private:
  bool at(char c) const { return p_ != end_ && *p_ == static_cast<unsigned char>(c); }

  void skip_space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  // "key" ':' then the value's leading whitespace.
  bool key() {
    if (!at('"') || !string()) return false;
    skip_space();
    if (!at(':')) return false;
    ++p_;
    skip_space();
    return true;
  }

  bool scalar() {
    if (p_ == end_) return false;
    switch (*p_) {
      case '"':
        return string();
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      default:
        return number();
    }
  }

  bool literal(std::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size()) return false;
    for (char c : word) {
      if (*p_++ != static_cast<unsigned char>(c)) return false;
    }
    return true;
  }

  bool digits() {
    const unsigned char* start = p_;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ != start;
  }

  // -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
  bool number() {
    if (at('-')) ++p_;
    if (at('0')) {
      ++p_;
    } else if (p_ == end_ || *p_ < '1' || *p_ > '9' || !digits()) {
      return false;
    }
    if (at('.')) {
      ++p_;
      if (!digits()) return false;
    }
    if (at('e') || at('E')) {
      ++p_;
      if (at('+') || at('-')) ++p_;
      if (!digits()) return false;
    }
    return true;
  }

  int hex4() {  // the value of 4 hex digits, or -1
    if (end_ - p_ < 4) return -1;
    int value = 0;
    for (int i = 0; i < 4; ++i) {
      const unsigned char c = *p_++;
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return -1;
      }
      value = value * 16 + digit;
    }
    return value;
  }

  bool escape() {  // after the backslash
    if (p_ == end_) return false;
    const unsigned char c = *p_++;
    switch (c) {
      case '"':
      case '\\':
      case '/':
      case 'b':
      case 'f':
      case 'n':
      case 'r':
      case 't':
        return true;
      case 'u': {
        const int unit = hex4();
        if (unit < 0) return false;
        if (unit >= 0xDC00 && unit <= 0xDFFF) return false;  // a low surrogate alone
        if (unit < 0xD800 || unit > 0xDBFF) return true;
        // A high surrogate must be followed by an escaped low one.
        if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
        p_ += 2;
        const int low = hex4();
        return low >= 0xDC00 && low <= 0xDFFF;
      }
      default:
        return false;
    }
  }

  bool continuation(unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    if (p_ == end_ || *p_ < lo || *p_ > hi) return false;
    ++p_;
    return true;
  }

  // One UTF-8 sequence of 2 to 4 bytes (RFC 3629: no overlongs, surrogates or > U+10FFFF).
  bool multibyte() {
    const unsigned char c = *p_++;
    if (c >= 0xC2 && c <= 0xDF) return continuation();
    if (c == 0xE0) return continuation(0xA0, 0xBF) && continuation();
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      return continuation() && continuation();
    }
    if (c == 0xED) return continuation(0x80, 0x9F) && continuation();
    if (c == 0xF0) return continuation(0x90, 0xBF) && continuation() && continuation();
    if (c >= 0xF1 && c <= 0xF3) return continuation() && continuation() && continuation();
    if (c == 0xF4) return continuation(0x80, 0x8F) && continuation() && continuation();
    return false;
  }

  bool string() {  // at the opening quote
    ++p_;
    while (p_ != end_) {
      const unsigned char c = *p_;
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        ++p_;
        if (!escape()) return false;
      } else if (c < 0x80) {
        ++p_;
      } else if (!multibyte()) {
        return false;
      }
    }
    return false;  // unterminated
  }

  const unsigned char* p_;
  const unsigned char* end_;
};

}  // namespace

bool is_json(std::string_view text) { return Checker(text).document(); }

bool is_utf8(std::string_view text) { return Checker(text).utf8(); }

std::optional<std::string> depth_problem(std::string_view text, size_t max_depth) {
  const size_t depth = json_depth(text);
  if (depth <= max_depth) return std::nullopt;
  return "nests " + std::to_string(depth) + " levels deep, more than " + std::to_string(max_depth);
}

}  // namespace backhaul
