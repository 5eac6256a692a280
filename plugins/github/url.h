// Small URL helpers: just what the connector needs to build request URLs and vet cursors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace backhaul::github {

// Percent-encodes everything outside RFC 3986 "unreserved" (A-Z a-z 0-9 - . _ ~), so that the
// result is safe as one path segment or one query value.
std::string percent_encode(std::string_view s);

// "scheme://authority" of an absolute http:// or https:// URL with a non-empty authority, in a
// form that compares as origins do: scheme and host lower-cased, a default port (:443, :80)
// dropped. nullopt for anything else.
std::optional<std::string> http_origin(std::string_view url);

// ASCII case-insensitive equality (header tokens, GitHub's owner and repository names).
bool iequals(std::string_view a, std::string_view b);

// The path of an absolute URL ("scheme://authority/path?query#fragment"): from the '/' after the
// authority up to the query or fragment, as written (not decoded). Empty when there is none.
std::string_view url_path(std::string_view url);

// `url`, a page of a list paged by number (`per_page=P`, and `page=N` or none for the first),
// asking for pages half as large (P/2) from the same place, or from a little before it when P is
// odd: page (N-1)*P / (P/2) + 1. The items in between come again, which is harmless where items
// are delivered by id; none is skipped. The other parameters are kept as written. nullopt when
// P/2 would be under `min_per_page`, or `url` has no such per_page or page (one paged by a cursor,
// `after=`, or a fragment).
std::optional<std::string> half_page(std::string_view url, int64_t min_per_page);

}  // namespace backhaul::github
