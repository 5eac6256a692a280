#include "host/cli/admin_client.h"

#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>
#include <Poco/Exception.h>
#include <Poco/URI.h>

#include "core/common/redact.h"
#include "core/common/utf8.h"
#include "core/http/poco_transport.h"

namespace backhaul::cli {

nlohmann::json AdminApiError::envelope() const {
  nlohmann::json error = {{"code", code_}, {"message", message_}};
  if (status_ > 0) error["status"] = status_;
  if (!details_.is_null()) error["details"] = details_;
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
  if (!uri.getRawQuery().empty() || !uri.getFragment().empty()) {
    return "'" + redact(url) + "' has a query or fragment; give the daemon's base URL";
  }
  return "";
}

void add_endpoint_options(CLI::App& command, AdminEndpoint& endpoint) {
  // Not envname(): CLI11 would give BACKHAUL_URL to the --url of every subcommand, whose
  // options share `endpoint`, over the one given. AdminClient checks the URL.
  if (const char* url = std::getenv("BACKHAUL_URL")) endpoint.url = url;
  command.add_option("--url", endpoint.url, "admin API of backhauld (env BACKHAUL_URL)")
      ->capture_default_str();
  command
      .add_option("--token-env", endpoint.token_env,
                  "environment variable holding the admin bearer token")
      ->capture_default_str();
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
  nlohmann::json parsed = nlohmann::json::parse(response.body, nullptr, false);
  if (response.status >= 200 && response.status < 300 && !parsed.is_discarded()) return parsed;
  // The API's error envelope; anything else (a proxy's {"error":"Bad Gateway"}) is an answer
  // without one, and keeps its status, which says whether a wait may pass it.
  if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_object()) {
    const nlohmann::json& error = parsed["error"];
    auto text = [&](const char* key, const char* otherwise) {
      auto it = error.find(key);
      return it != error.end() && it->is_string() ? it->get<std::string>() : otherwise;
    };
    throw AdminApiError(response.status, text("code", "UNKNOWN"), text("message", "no message"),
                        error.value("details", nlohmann::json()));
  }
  throw AdminApiError(
      response.status, "UNKNOWN",
      "unexpected answer " + std::to_string(response.status) + " from " + redact(request.url));
}

void append_query(std::string* target, const std::string& name, const std::string& value) {
  std::string encoded;
  Poco::URI::encode(value, "&=+?#/", encoded);
  *target += (target->empty() ? "?" : "&") + name + "=" + encoded;
}

}  // namespace backhaul::cli
