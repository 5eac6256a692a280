// Removes secrets from text before it is logged or stored (SPEC F5).
#pragma once

#include <string>
#include <string_view>

namespace backhaul {

// Replaces, with "[REDACTED]":
//   GitHub tokens: ghp_…, gho_…, ghu_…, ghs_…, ghr_… and github_pat_… (any length, [A-Za-z0-9_]
//   plus '.' and '-', which GitHub's stateless ghs_APPID_JWT installation tokens contain);
//   Vercel-style tokens: vcp_…, vca_… (any length);
//   the credential after "Bearer " / "token " in Authorization-like text (case-insensitive);
//   user:password@ (or token@) in URLs: scheme://[REDACTED]@host;
//   values of query parameters named access_token, token, password, secret, api_key, apikey.
// Text without secrets is returned unchanged. [thread-safe]
std::string redact(std::string_view text);

// True when redact(text) would change it.
bool contains_secret(std::string_view text);

}  // namespace backhaul
