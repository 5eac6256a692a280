// RFC 8288 Link header parsing, as GitHub paginates:
//   <https://api.github.com/repositories/1/issues?page=2>; rel="next", <...>; rel="last"
#pragma once

#include <optional>
#include <string_view>

namespace backhaul::github {

// The target of the first link whose rel parameter lists `rel` (relation types compare
// case-insensitively; rel may hold several space-separated types, quoted or not). Tolerates any
// order of links and parameters, extra parameters, optional whitespace, commas and semicolons
// inside quoted values and inside <...>. A malformed link-value is skipped, never fatal. The view
// points into `header`; the URI is returned verbatim (no resolution or unescaping).
std::optional<std::string_view> find_link(std::string_view header, std::string_view rel);

}  // namespace backhaul::github
