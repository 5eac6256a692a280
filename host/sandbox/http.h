// The request/response values the fake APIs share (from host/common/http.h) and their time
// helpers. The Poco server converts to and from these, so handlers are plain functions of values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "host/common/http.h"

namespace backhaul::sandbox {

// The request/response values and parsing helpers live in host/common/http.h, shared with the
// daemon's admin API.
using host::json_response;
using host::parse_int;
using host::percent_decode;
using host::Query;
using host::Request;
using host::Response;
using host::split_path;

// "2024-05-01T12:34:56Z" (seconds precision, UTC).
std::string format_iso8601(int64_t epoch_ms);

// ISO 8601 date-time: YYYY-MM-DDTHH:MM:SS, optional fraction, then Z or +hh:mm / -hh:mm (a bare
// date YYYY-MM-DD means midnight UTC). Returns milliseconds since the epoch.
std::optional<int64_t> parse_iso8601(std::string_view text);

}  // namespace backhaul::sandbox
