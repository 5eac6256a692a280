#include "host/cli/admin_client.h"

#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>
#include <Poco/Exception.h>
#include <Poco/URI.h>

#include "core/common/json_check.h"
#include "core/common/redact.h"
#include "core/common/utf8.h"
#include "core/http/poco_transport.h"

namespace backhaul::cli {

AdminApiError::AdminApiError(int status, std::string code, const std::string& message,
                             nlohmann::json details, std::optional<bool> retryable)
    // An answer without the API's code: its HTTP status is what says what happened (the envelope
    // carries it as `status`, and the message as it came).
    : Error(escape_controls(
          code + ": " + message +
          (code == "UNKNOWN" && status > 0 ? " (HTTP " + std::to_string(status) + ")" : ""))),
      status_(status),
      code_(std::move(code)),
      message_(message),
      details_(std::move(details)),
      retryable_(retryable) {}

nlohmann::json AdminApiError::envelope() const {
  nlohmann::json error = {{"code", code_}, {"message", message_}};
  if (status_ > 0) error["status"] = status_;
  if (!details_.is_null()) error["details"] = details_;
  if (retryable_) error["retryable"] = *retryable_;
  return {{"error", std::move(error)}};
}

void reading_answers(const std::function<void()>& command, bool json_output) {
  try {
    try {
      command();
    } catch (const nlohmann::json::exception& e) {
      // 403: a key not found; 302: a value of another type; 304: at() and 306: value() of what
      // is not an object. Others (an argument that is not UTF-8, say) are not the answer's.
      if (e.id != 403 && e.id != 302 && e.id != 304 && e.id != 306) throw;
      throw AdminApiError(
          0, "UNEXPECTED_ANSWER",
          std::string("an answer of the admin API is not what this command reads (") + e.what() +
              "): is --url a backhauld of this version?");
    }
  } catch (const AdminApiError& e) {
    if (json_output) std::cout << e.envelope().dump(2) << "\n";
    throw;
  }
}

std::string check_admin_url(const std::string& url) {
  Poco::URI uri;
  try {
    uri = Poco::URI(url);
  } catch (const Poco::Exception& e) {
    return "'" + redact(url) + "' is not a URL: " + e.displayText();
  }
  if (uri.getScheme() != "http" && uri.getScheme() != "https") {
    return "'" + redact(url) + "' is not an http:// or https:// URL";
  }
  if (uri.getHost().empty()) return "'" + redact(url) + "' names no host";
  // Looked for in the text: Poco drops a '?' or '#' with nothing after it, which would then be
  // sent as part of every request's path.
  if (url.find_first_of("?#") != std::string::npos) {
    return "'" + redact(url) + "' has a query or fragment ('?' or '#'); give the daemon's base URL";
  }
  // The admin API reads no user info: a password there would only be shown (in --help, in
  // errors) and sent in the clear.
  if (!uri.getUserInfo().empty() || uri.getAuthority().find('@') != std::string::npos) {
    return "'" + redact(url) +
           "' holds user info (user:password@), which the admin API does not read: give the "
           "token in the variable --token-env names";
  }
  return "";
}

void add_endpoint_options(CLI::App& command, AdminEndpoint& endpoint) {
  // Not envname(): CLI11 would give BACKHAUL_URL to the --url of every subcommand, whose
  // options share `endpoint`, over the one given. AdminClient checks the URL.
  if (const char* url = std::getenv("BACKHAUL_URL")) endpoint.url = url;
  // The default shown is redacted: BACKHAUL_URL may hold a password (refused when used), which
  // --help would print.
  command.add_option("--url", endpoint.url, "admin API of backhauld (env BACKHAUL_URL)")
      ->default_str(redact(endpoint.url));
  command
      .add_option("--token-env", endpoint.token_env,
                  "environment variable holding the admin bearer token")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& name) -> std::string {
            return name.empty() ? "names no environment variable (empty)" : "";
          },
          "VAR", "variable name"));
  command
      .add_option("--timeout-ms", endpoint.timeout_ms, "time limit of each request to backhauld")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
}

CLI::Option* add_id_argument(CLI::App& command, int64_t& id, const std::string& what) {
  return command.add_option("id", id, what + " id")
      ->check(CLI::Validator(
          [what](const std::string& text) -> std::string {
            int64_t value = 0;
            if (CLI::detail::lexical_cast(text, value) && value > 0) return "";
            return "a " + what + " id is a positive integer, not '" + text + "'";
          },
          "ID", "positive id"));
}

AdminClient::AdminClient(AdminEndpoint endpoint)
    : endpoint_(std::move(endpoint)), transport_(std::make_unique<http::PocoTransport>()) {
  // Before the token, and not as "no answer" at the first request.
  if (const std::string why = check_admin_url(endpoint_.url); !why.empty()) {
    throw ConfigError("--url (or BACKHAUL_URL): " + why);
  }
  const char* token = std::getenv(endpoint_.token_env.c_str());
  if (token == nullptr || *token == '\0') {
    throw ConfigError("environment variable " + endpoint_.token_env +
                      " (the admin token) is not set");
  }
  token_ = token;
  // A line break at its end (the token read from a file) would make every request fail as an
  // invalid header, which says nothing of the variable.
  if (has_control_character(token_)) {
    throw ConfigError("environment variable " + endpoint_.token_env +
                      " (the admin token) holds a control character (a line break at its end?)");
  }
  // Nor a space at either end: the daemon refuses such a token at start, and the header's value
  // loses its spaces on the way, so what authenticated would be another token than the one given.
  if (token_.front() == ' ' || token_.back() == ' ') {
    throw ConfigError("environment variable " + endpoint_.token_env +
                      " (the admin token) begins or ends with a space, which an HTTP header drops "
                      "(it could never match)");
  }
  while (!endpoint_.url.empty() && endpoint_.url.back() == '/') endpoint_.url.pop_back();
}

AdminClient::~AdminClient() = default;

nlohmann::json AdminClient::get(const std::string& target) {
  return request("GET", target, nlohmann::json());
}

nlohmann::json AdminClient::post(const std::string& target, const nlohmann::json& body) {
  return request("POST", target, body);
}

nlohmann::json AdminClient::request(const std::string& method, const std::string& target,
                                    const nlohmann::json& body) {
  http::Request request;
  request.method = method;
  request.url = endpoint_.url + target;
  request.timeout = std::chrono::milliseconds(endpoint_.timeout_ms);
  request.headers = {{"Authorization", "Bearer " + token_}, {"Accept", "application/json"}};
  if (!body.is_null()) {
    request.headers.emplace_back("Content-Type", "application/json");
    request.body = body.dump();
  } else if (method != "GET") {
    request.body = "";
  }
  http::Response response;
  try {
    response = transport_->perform(request);
  } catch (const Error& e) {
    // Refused, cut off or timed out: a request other than a GET may have been applied all the
    // same. The URL's credentials, if any, are not repeated.
    throw AdminApiError(0, "UNREACHABLE",
                        "no answer from backhauld at " + redact(endpoint_.url) + ": " +
                            redact(e.what()) +
                            (method == "GET" ? "" : " (the request may have been applied)"));
  }
  // Before parsing: nlohmann parses any depth, but copies and dumps recursively, and a body
  // nested a million deep overflowed the stack at the first copy (the error's details).
  if (const auto problem = depth_problem(response.body)) {
    throw AdminApiError(response.status, "UNEXPECTED_ANSWER",
                        "the answer (HTTP " + std::to_string(response.status) + ") from " +
                            redact(request.url) + " " + *problem +
                            " (the depth limit of answers): is --url a backhauld of this version?");
  }
  nlohmann::json parsed = nlohmann::json::parse(response.body, nullptr, false);
  if (response.status >= 200 && response.status < 300 && !parsed.is_discarded()) return parsed;
  // The API's error envelope; anything else (a proxy's {"error":"Bad Gateway"}) is an answer
  // without one, and keeps its status, which says whether a wait may pass it.
  if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_object()) {
    const nlohmann::json& error = parsed["error"];
    auto text = [&](const char* key) -> std::optional<std::string> {
      auto it = error.find(key);
      if (it == error.end() || !it->is_string()) return std::nullopt;
      return it->get<std::string>();
    };
    const std::optional<std::string> code = text("code");
    const std::string message = text("message").value_or("no message");
    const auto retryable = error.find("retryable");
    throw AdminApiError(response.status, code.value_or("UNKNOWN"), message,
                        error.value("details", nlohmann::json()),
                        retryable != error.end() && retryable->is_boolean()
                            ? std::optional<bool>(retryable->get<bool>())
                            : std::nullopt);
  }
  throw AdminApiError(
      response.status, "UNKNOWN",
      "unexpected answer " + std::to_string(response.status) + " from " + redact(request.url));
}

std::string shown(const nlohmann::json& text) { return escape_controls(text.get<std::string>()); }

namespace {

// `word` as one word of a POSIX shell: as it is when nothing in it is special, else quoted.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789._:/@%+=,-") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (const char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

std::string next_page_hint(const std::vector<std::pair<std::string, std::string>>& options,
                           int64_t next_before) {
  std::string hint = "more:";
  for (const auto& [name, value] : options) hint += " " + name + " " + shell_word(value);
  return escape_controls(hint + " --before " + std::to_string(next_before));
}

void append_query(std::string* target, const std::string& name, const std::string& value) {
  std::string encoded;
  Poco::URI::encode(value, "&=+?#/", encoded);
  *target += (target->empty() ? "?" : "&") + name + "=" + encoded;
}

}  // namespace backhaul::cli
