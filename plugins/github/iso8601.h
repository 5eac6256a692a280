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

}  // namespace backhaul::github
