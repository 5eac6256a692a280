// Small URL helpers: just what the connector needs to build request URLs and vet cursors.
#pragma once

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

}  // namespace backhaul::github
