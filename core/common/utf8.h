// Repairs and cuts of UTF-8 text for places that must hold valid UTF-8 of a bounded size (error
// text in the job stores, a MySQL utf8mb4 column). is_utf8() (json_check.h) tells whether text
// needs either.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace backhaul {

// `text` with every byte sequence that is not UTF-8 (RFC 3629: no overlong forms, surrogates or
// code points above U+10FFFF) replaced by U+FFFD: error messages may quote anything (an HTTP
// body, a plugin's message).
std::string valid_utf8(std::string_view text);

// `text` on one line: control characters (a plugin's text, or a request line, may hold any) shown
// as \n, \r, \t or \xNN, and C1 controls and bidi overrides as \uNNNN, so that they cannot forge
// or hide lines of a report or a log, or move what a terminal shows of them.
std::string escape_controls(std::string_view text);

// True when `text` holds an ASCII control character (a token read from a file with its line
// break: every request would then fail as an invalid header).
bool has_control_character(std::string_view text);

// A prefix of `text` of at most `max_bytes` that ends on a UTF-8 character boundary.
std::string cut_utf8(std::string_view text, size_t max_bytes);

}  // namespace backhaul
