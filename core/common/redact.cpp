#include "core/common/redact.h"

#include <array>
#include <cstddef>
#include <optional>

// Rationale: redact() runs on every log line, so it is a single hand-written left-to-right scan
// instead of a set of regexes. The scan only stops at a handful of trigger characters (the first
// letter of a prefix or keyword, ':' of "://", '=' of a query parameter); text without any
// secret costs one pass and one copy. Every rule finds a span of the input to replace; spans never
// overlap because the scan resumes after the end of the last one.
//
// Every rule leaves "[REDACTED]" alone, so redact() is idempotent and contains_secret() is false
// for already-redacted text.

namespace backhaul {
namespace {

constexpr std::string_view kRedacted = "[REDACTED]";

struct Span {
  size_t begin;
  size_t end;
};

constexpr bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
constexpr bool is_digit(char c) { return c >= '0' && c <= '9'; }
constexpr bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }
constexpr bool is_word(char c) { return is_alnum(c) || c == '_'; }
constexpr bool is_blank(char c) { return c == ' ' || c == '\t'; }
constexpr char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

// GitHub and Vercel tokens: [A-Za-z0-9_] plus '.' and '-', which GitHub's stateless installation
// tokens (ghs_APPID_JWT) contain.
constexpr bool is_token_char(char c) { return is_word(c) || c == '.' || c == '-'; }

// An HTTP credential (RFC 6750 b64token, which also covers Basic's base64).
constexpr bool is_credential_char(char c) {
  return is_alnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/' ||
         c == '=';
}

// Ends a query parameter's value or a URL's authority when embedded in log text.
constexpr bool ends_embedded_value(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '"' || c == '\'' || c == '<' ||
         c == '>' || c == '\\';
}

// Case-insensitive: does `text` contain `lower_word` (given in lower case) at `pos`?
bool has_word_at(std::string_view text, size_t pos, std::string_view lower_word) {
  if (text.size() - pos < lower_word.size()) return false;
  for (size_t k = 0; k < lower_word.size(); ++k) {
    if (lower(text[pos + k]) != lower_word[k]) return false;
  }
  return true;
}

bool iequals(std::string_view a, std::string_view lower_b) {
  return a.size() == lower_b.size() && has_word_at(a, 0, lower_b);
}

// Characters at which some rule can start.
constexpr std::array<bool, 256> make_triggers() {
  std::array<bool, 256> t{};
  for (char c : std::string_view("gvbBtTaA:=")) t[static_cast<unsigned char>(c)] = true;
  return t;
}
constexpr std::array<bool, 256> kTriggers = make_triggers();

class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  // The first secret starting at or after `from`.
  std::optional<Span> next(size_t from) const {
    const char* const data = text_.data();
    const size_t size = text_.size();
    for (size_t i = from; i < size; ++i) {
      const char c = data[i];
      if (!kTriggers[static_cast<unsigned char>(c)]) continue;
      // The second character rules out most trigger letters cheaply ("the", "at", "page", …).
      const char second = i + 1 < size ? lower(data[i + 1]) : '\0';
      std::optional<Span> span;
      switch (c) {
        case 'g':
          if (second == 'h' || second == 'i') span = prefixed_token(i);
          break;
        case 'v':
          if (second == 'c') span = prefixed_token(i);
          break;
        case 'b':
        case 'B':
          if (second == 'e') span = scheme_credential(i, "bearer", /*needs_secret_shape=*/false);
          break;
        case 't':
        case 'T':
          if (second == 'o') span = scheme_credential(i, "token", /*needs_secret_shape=*/true);
          break;
        case 'a':
        case 'A':
          if (second == 'u') span = authorization_value(i);
          break;
        case ':':
          if (second == '/') span = url_userinfo(i);
          break;
        case '=':
          span = query_value(i, from);
          break;
        default:
          break;
      }
      if (span) return span;
    }
    return std::nullopt;
  }

 private:
  // A word boundary before `pos` for keyword rules.
  bool word_starts_at(size_t pos) const { return pos == 0 || !is_word(text_[pos - 1]); }

  size_t skip_blanks(size_t pos) const {
    while (pos < text_.size() && is_blank(text_[pos])) ++pos;
    return pos;
  }

  size_t credential_end(size_t pos) const {
    while (pos < text_.size() && is_credential_char(text_[pos])) ++pos;
    return pos;
  }

  // ghp_… gho_… ghu_… ghs_… ghr_… github_pat_… vcp_… vca_…: the whole token, prefix included.
  std::optional<Span> prefixed_token(size_t i) const {
    static constexpr std::string_view kPrefixes[] = {"ghp_", "gho_",        "ghu_", "ghs_",
                                                     "ghr_", "github_pat_", "vcp_", "vca_"};
    // Not inside a longer alphanumeric word ("xghp_" is not a token prefix).
    if (i > 0 && is_alnum(text_[i - 1])) return std::nullopt;
    for (std::string_view prefix : kPrefixes) {
      if (text_.substr(i, prefix.size()) != prefix) continue;
      size_t end = i + prefix.size();
      while (end < text_.size() && is_token_char(text_[end])) ++end;
      // A token never ends with '.', a sentence does: "… ghp_abc."
      while (end > i + prefix.size() && text_[end - 1] == '.') --end;
      if (end > i + prefix.size()) return Span{i, end};
      return std::nullopt;
    }
    return std::nullopt;
  }

  // "Bearer <credential>" / "token <credential>": the credential only. "token" is also an English
  // word ("token expired", "refreshing token for 42"), so outside Authorization-like text (see
  // authorization_value) its credential must look like one: 8+ characters with a digit.
  std::optional<Span> scheme_credential(size_t i, std::string_view scheme,
                                        bool needs_secret_shape) const {
    if (!word_starts_at(i) || !has_word_at(text_, i, scheme)) return std::nullopt;
    const size_t after = i + scheme.size();
    if (after >= text_.size() || !is_blank(text_[after])) return std::nullopt;
    const size_t begin = skip_blanks(after);
    const size_t end = credential_end(begin);
    if (end == begin) return std::nullopt;  // nothing, or "[REDACTED]"
    if (needs_secret_shape) {
      const std::string_view credential = text_.substr(begin, end - begin);
      bool has_digit = false;
      for (char c : credential) has_digit = has_digit || is_digit(c);
      if (credential.size() < 8 || !has_digit) return std::nullopt;
    }
    return Span{begin, end};
  }

  // Authorization-like text: "Authorization: <scheme> <credential>", "authorization=…" or JSON
  // "\"authorization\": \"…\"", any scheme (Bearer, token, Basic, …): the credential only. Prose
  // ("authorization failed for …") has no ':' or '=' after the word and is left alone.
  std::optional<Span> authorization_value(size_t i) const {
    static constexpr std::string_view kWord = "authorization";
    if (!word_starts_at(i) || !has_word_at(text_, i, kWord)) return std::nullopt;
    size_t pos = i + kWord.size();
    bool has_separator = false;
    while (pos < text_.size()) {
      const char c = text_[pos];
      if (c == ':' || c == '=') {
        has_separator = true;
      } else if (!(is_blank(c) || c == '"' || c == '\'' || c == '\\')) {  // '\\': escaped JSON
        break;
      }
      ++pos;
    }
    if (!has_separator) return std::nullopt;
    const size_t scheme_begin = pos;
    while (pos < text_.size() && is_alpha(text_[pos])) ++pos;
    if (pos == scheme_begin || pos >= text_.size() || !is_blank(text_[pos])) return std::nullopt;
    const size_t begin = skip_blanks(pos);
    const size_t end = credential_end(begin);
    if (end == begin) return std::nullopt;
    return Span{begin, end};
  }

  // scheme://user:password@host (or token@host): the userinfo.
  std::optional<Span> url_userinfo(size_t i) const {
    if (i == 0 || !is_alnum(text_[i - 1]) || text_.substr(i, 3) != "://") return std::nullopt;
    const size_t begin = i + 3;
    size_t at = std::string_view::npos;
    for (size_t pos = begin; pos < text_.size(); ++pos) {
      const char c = text_[pos];
      if (c == '/' || c == '?' || c == '#' || ends_embedded_value(c)) break;
      if (c == '@') at = pos;
    }
    if (at == std::string_view::npos || at == begin) return std::nullopt;
    if (text_.substr(begin, at - begin) == kRedacted) return std::nullopt;
    return Span{begin, at};
  }

  // name=value for the sensitive parameter names: the value. The name must not reach back before
  // `floor` (the end of the previous span).
  std::optional<Span> query_value(size_t i, size_t floor) const {
    static constexpr std::string_view kNames[] = {"access_token", "token",   "password",
                                                  "secret",       "api_key", "apikey"};
    size_t name_begin = i;
    while (name_begin > floor && is_word(text_[name_begin - 1])) --name_begin;
    if (name_begin > 0 && is_word(text_[name_begin - 1])) return std::nullopt;
    const std::string_view name = text_.substr(name_begin, i - name_begin);
    bool sensitive = false;
    for (std::string_view candidate : kNames) sensitive = sensitive || iequals(name, candidate);
    if (!sensitive) return std::nullopt;
    const size_t begin = i + 1;
    size_t end = begin;
    while (end < text_.size()) {
      const char c = text_[end];
      if (c == '&' || c == '#' || c == ';' || ends_embedded_value(c)) break;
      ++end;
    }
    if (end == begin || text_.substr(begin, end - begin) == kRedacted) return std::nullopt;
    return Span{begin, end};
  }

  std::string_view text_;
};

}  // namespace

std::string redact(std::string_view text) {
  const Scanner scanner(text);
  std::optional<Span> span = scanner.next(0);
  if (!span) return std::string(text);  // the common case: one copy, no rewriting

  std::string out;
  out.reserve(text.size() + 16);
  size_t copied = 0;
  while (span) {
    out.append(text, copied, span->begin - copied);
    out.append(kRedacted);
    copied = span->end;
    span = scanner.next(copied);
  }
  out.append(text, copied);
  return out;
}

bool contains_secret(std::string_view text) { return Scanner(text).next(0).has_value(); }

}  // namespace backhaul
