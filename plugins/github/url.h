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

// `url`, the first page of a list paged by number (`per_page=P`, and no `page` or `page=1`),
// asking for half as many items (P/2); the other parameters are kept as written. nullopt when P/2
// would be under `min_per_page`, or `url` is not such a first page. Only the first: where a later
// page starts depends on how many items the server really puts on a page, which may be fewer than
// asked for (a server's own cap), and a later page halved by the number asked for would skip items.
std::optional<std::string> half_first_page(std::string_view url, int64_t min_per_page);

}  // namespace backhaul::github
