// The CLI's client of backhauld's admin API (docs/daemon.md): JSON over HTTP with the bearer
// token from the environment, errors turned into one exception carrying the envelope's code.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/errors.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace backhaul::http {
class Transport;
}

namespace backhaul::cli {

// The daemon answered with an error envelope, or could not be reached (code "UNREACHABLE").
// what() is "CODE: message", its control characters escaped (escape_controls): the message is the
// daemon's (or a plugin's, or anything's at --url), bound for a terminal. envelope() keeps it as
// it came, JSON-escaped when dumped.
class AdminApiError : public Error {
 public:
  AdminApiError(int status, std::string code, const std::string& message,
                nlohmann::json details = nullptr, std::optional<bool> retryable = std::nullopt);
  int status() const noexcept { return status_; }  // 0: no HTTP answer
  const std::string& code() const noexcept { return code_; }
  // The envelope's `retryable`; nullopt when the answer had none (no envelope: a proxy's 502).
  std::optional<bool> retryable() const noexcept { return retryable_; }
  // As the API's envelope, {"error": {"code", "message", "status", "details", "retryable"}}:
  // what --json prints on stdout in place of an answer.
  nlohmann::json envelope() const;

 private:
  int status_;
  std::string code_;
  std::string message_;
  nlohmann::json details_;
  std::optional<bool> retryable_;
};

struct AdminEndpoint {
  std::string url = "http://127.0.0.1:8470";  // the daemon's admin API
  std::string token_env = "BACKHAUL_ADMIN_TOKEN";
  int timeout_ms = 30'000;
};

// Runs `command`, which reads answers of the admin API: one that lacks a field the command reads,
// or has it of another type (a daemon of another version, or not a daemon at all), ends it with
// an AdminApiError (code UNEXPECTED_ANSWER) naming the field, rather than in nlohmann's terms.
// With `json_output` (--json), an AdminApiError's envelope goes to stdout before it is rethrown,
// so that stdout holds one JSON document whatever happened.
void reading_answers(const std::function<void()>& command, bool json_output);

// Why `url` cannot be the admin API's base URL (not http(s), no host, a '?' or '#', user info),
// or "" when it can. Credentials in it are not repeated.
std::string check_admin_url(const std::string& url);

// Adds --url, --token-env and --timeout-ms to a subcommand (shared by `run` and `dlq`).
void add_endpoint_options(CLI::App& command, AdminEndpoint& endpoint);

// Adds the positional `id` of a run or a dead letter (`what`), which must be a positive integer.
CLI::Option* add_id_argument(CLI::App& command, int64_t& id, const std::string& what);

class AdminClient {
 public:
  // Reads the token from endpoint.token_env; throws ConfigError naming the variable when unset.
  explicit AdminClient(AdminEndpoint endpoint);
  ~AdminClient();
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;

  // `target` is "/v1/...". Returns the parsed body of a 2xx answer; throws AdminApiError.
  nlohmann::json get(const std::string& target);
  nlohmann::json post(const std::string& target, const nlohmann::json& body = nlohmann::json());
  nlohmann::json request(const std::string& method, const std::string& target,
                         const nlohmann::json& body);

 private:
  AdminEndpoint endpoint_;
  std::string token_;
  std::unique_ptr<http::Transport> transport_;
};

// A string of an answer as a terminal may show it: escape_controls of it (the daemon's text, a
// plugin's error among it, may hold escape sequences). Throws as get<std::string>() when it is
// not a string.
std::string shown(const nlohmann::json& text);

// The line that says how to read the page after this one of a list: "more: --kind 'a b' --limit
// 20 --before 41", with the options given (`options`: name and value; quoted for a shell where
// needed), since the next page is one of the same filtered list.
std::string next_page_hint(const std::vector<std::pair<std::string, std::string>>& options,
                           int64_t next_before);

// Appends "name=value" (percent-encoded) to a query string being built ("" or "?a=b").
void append_query(std::string* target, const std::string& name, const std::string& value);

}  // namespace backhaul::cli
