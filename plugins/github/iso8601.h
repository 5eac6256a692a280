// UTC timestamps in the ISO 8601 form GitHub uses ("2022-07-19T04:39:16Z").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace backhaul::github {

// "YYYY-MM-DDTHH:MM:SSZ" for a time in milliseconds since the Unix epoch (milliseconds are
// truncated: GitHub's `since` has one-second resolution).
std::string format_iso8601(int64_t unix_ms);

// Milliseconds since the Unix epoch of "YYYY-MM-DDTHH:MM:SS" followed by optional fractional
// seconds and "Z" or a "+HH:MM"/"-HH:MM" offset; nullopt for anything else.
std::optional<int64_t> parse_iso8601(std::string_view text);

// Milliseconds since the Unix epoch of an HTTP date in the IMF-fixdate form of RFC 9110 5.6.7,
// "Sun, 06 Nov 1994 08:49:37 GMT" (what GitHub sends in Date and an HTTP-date Retry-After), and
// nothing else: case as shown, single spaces, a day name that is the date's, "GMT". The obsolete
// RFC 850 and asctime forms are nullopt, as is surrounding whitespace.
std::optional<int64_t> parse_imf_fixdate(std::string_view text);

}  // namespace backhaul::github
