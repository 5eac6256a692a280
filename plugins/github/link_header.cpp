#include "link_header.h"

#include <string>

#include "url.h"

namespace backhaul::github {
namespace {

constexpr std::string_view::size_type npos = std::string_view::npos;

bool is_ows(char c) { return c == ' ' || c == '\t'; }

// True when the whitespace-separated list of relation types contains `rel`.
bool lists_rel(std::string_view types, std::string_view rel) {
  size_t i = 0;
  while (i < types.size()) {
    while (i < types.size() && is_ows(types[i])) ++i;
    size_t end = i;
    while (end < types.size() && !is_ows(types[end])) ++end;
    if (end > i && iequals(types.substr(i, end - i), rel)) return true;
    i = end;
  }
  return false;
}

// Walks one header value. Positions only move forward, so every loop terminates.
class LinkScanner {
 public:
  explicit LinkScanner(std::string_view header) : h_(header) {}

  bool at_end() const { return i_ >= h_.size(); }
  char peek() const { return at_end() ? '\0' : h_[i_]; }
  void skip_ows() {
    while (!at_end() && is_ows(h_[i_])) ++i_;
  }
  void skip_separators() {
    while (!at_end() && (is_ows(h_[i_]) || h_[i_] == ',')) ++i_;
  }

  // Consumes "<target>"; nullopt (and nothing consumed) when there is none.
  std::optional<std::string_view> target() {
    if (peek() != '<') return std::nullopt;
    const size_t close = h_.find('>', i_ + 1);
    if (close == npos) return std::nullopt;
    std::string_view uri = h_.substr(i_ + 1, close - i_ - 1);
    i_ = close + 1;
    while (!uri.empty() && is_ows(uri.front())) uri.remove_prefix(1);
    while (!uri.empty() && is_ows(uri.back())) uri.remove_suffix(1);
    return uri;
  }

  // Consumes one "; name[=value]" parameter. False at the end of the link-value (',' or end of
  // header) or when the text is not a parameter.
  bool parameter(std::string_view& name, std::string& value) {
    skip_ows();
    if (peek() != ';') return false;
    ++i_;
    skip_ows();
    const size_t start = i_;
    while (!at_end() && h_[i_] != '=' && h_[i_] != ';' && h_[i_] != ',' && !is_ows(h_[i_])) ++i_;
    name = h_.substr(start, i_ - start);
    value.clear();
    skip_ows();
    if (peek() != '=') return true;
    ++i_;
    skip_ows();
    if (peek() == '"') {
      quoted(value);
    } else {
      const size_t v = i_;
      while (!at_end() && h_[i_] != ';' && h_[i_] != ',' && !is_ows(h_[i_])) ++i_;
      value.assign(h_.substr(v, i_ - v));
    }
    return true;
  }

  // Skips the rest of a malformed link-value: up to the next ',' outside quotes and <...>.
  void skip_link_value() {
    bool in_quotes = false;
    bool in_angle = false;
    for (; !at_end(); ++i_) {
      const char c = h_[i_];
      if (in_quotes) {
        if (c == '\\') {
          ++i_;
        } else if (c == '"') {
          in_quotes = false;
        }
      } else if (in_angle) {
        in_angle = c != '>';
      } else if (c == '"') {
        in_quotes = true;
      } else if (c == '<') {
        in_angle = true;
      } else if (c == ',') {
        return;
      }
    }
  }

 private:
  // Reads a quoted-string (at the opening quote) into `out`, undoing backslash escapes.
  void quoted(std::string& out) {
    ++i_;
    while (!at_end() && h_[i_] != '"') {
      if (h_[i_] == '\\' && i_ + 1 < h_.size()) ++i_;
      out.push_back(h_[i_++]);
    }
    if (!at_end()) ++i_;  // closing quote
  }

  std::string_view h_;
  size_t i_ = 0;
};

}  // namespace

std::optional<std::string_view> find_link(std::string_view header, std::string_view rel) {
  LinkScanner scan(header);
  std::string_view name;
  std::string value;
  for (scan.skip_separators(); !scan.at_end(); scan.skip_separators()) {
    const std::optional<std::string_view> target = scan.target();
    if (!target) {
      scan.skip_link_value();
      continue;
    }
    bool seen_rel = false;  // RFC 8288 3.3: only the first rel parameter counts
    bool matches = false;
    while (scan.parameter(name, value)) {
      if (!seen_rel && iequals(name, "rel")) {
        seen_rel = true;
        matches = lists_rel(value, rel);
      }
    }
    if (scan.peek() != ',' && !scan.at_end()) scan.skip_link_value();
    if (matches) return target;
  }
  return std::nullopt;
}

}  // namespace backhaul::github
