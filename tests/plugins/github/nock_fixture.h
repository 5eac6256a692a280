// Reads recorded GitHub exchanges in nock's format (what octokit/fixtures records) and turns them
// into ReplayTransport exchanges.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/http/replay_transport.h"

namespace backhaul::github_test {

// tests/fixtures/github/<relative>
std::filesystem::path fixture_path(const std::string& relative);

// Parses a JSON file; throws std::runtime_error naming the file.
nlohmann::json read_json(const std::filesystem::path& file);

// One nock entry {scope, method, path, status, response, rawHeaders | headers} as an exchange:
// url = scope (without a default port) + path; header names lower-cased; a string response is
// the body text, any other response is serialized JSON.
http::Exchange exchange_from_nock(const nlohmann::json& entry);

// Every entry of a nock array file whose method is `method` (recordings also hold setup calls).
std::vector<http::Exchange> load_nock(const std::string& relative,
                                      const std::string& method = "GET");

}  // namespace backhaul::github_test
