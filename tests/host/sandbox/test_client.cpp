#include "tests/host/sandbox/test_client.h"

#include <algorithm>
#include <cctype>
#include <istream>
#include <sstream>
#include <stdexcept>

#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/StreamCopier.h>

namespace backhaul::sandbox::testing {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

std::string HttpResult::header(const std::string& lower_case_name) const {
  auto it = headers.find(lower_case_name);
  return it == headers.end() ? std::string() : it->second;
}

bool HttpResult::has_header(const std::string& lower_case_name) const {
  return headers.contains(lower_case_name);
}

TestClient::TestClient(uint16_t port) : port_(port), session_("127.0.0.1", port) {
  session_.setKeepAlive(true);
  session_.setTimeout(Poco::Timespan(30, 0));
}

HttpResult TestClient::request(const std::string& method, const std::string& target,
                               const Headers& headers, const std::string& body) {
  Poco::Net::HTTPRequest request(method, target, Poco::Net::HTTPMessage::HTTP_1_1);
  request.setKeepAlive(true);
  for (const auto& [name, value] : headers) request.set(name, value);
  if (method == "POST" || !body.empty()) {
    request.setContentType("application/json");
    request.setContentLength(static_cast<std::streamsize>(body.size()));
  }
  session_.sendRequest(request) << body;
  Poco::Net::HTTPResponse response;
  std::istream& in = session_.receiveResponse(response);
  HttpResult result;
  result.status = static_cast<int>(response.getStatus());
  for (const auto& [name, value] : response) result.headers.emplace(lower(name), value);
  Poco::StreamCopier::copyToString(in, result.body);
  return result;
}

HttpResult TestClient::get_url(const std::string& url, const Headers& headers) {
  const std::string origin = "http://127.0.0.1:" + std::to_string(port_);
  if (url.rfind(origin + "/", 0) != 0) throw std::runtime_error("foreign URL: " + url);
  return get(url.substr(origin.size()), headers);
}

std::string TestClient::token(const std::string& connection_id) {
  HttpResult result = get("/gateway/connections/" + connection_id + "/token");
  if (result.status != 200)
    throw std::runtime_error("token: HTTP " + std::to_string(result.status));
  return result.json().at("accessToken").get<std::string>();
}

Headers github_headers(const std::string& token) {
  return {{"Authorization", "Bearer " + token},
          {"User-Agent", "backhaul-sandbox-test"},
          {"Accept", "application/vnd.github+json"}};
}

Headers vercel_headers(const std::string& token) { return {{"Authorization", "Bearer " + token}}; }

Link parse_link(const std::string& header) {
  Link link;
  std::stringstream parts(header);
  std::string part;
  while (std::getline(parts, part, ',')) {
    const size_t open = part.find('<');
    const size_t close = part.find('>');
    const size_t rel = part.find("rel=\"");
    if (open == std::string::npos || close == std::string::npos || rel == std::string::npos) {
      throw std::runtime_error("malformed link part: " + part);
    }
    const std::string name = part.substr(rel + 5, part.find('"', rel + 5) - rel - 5);
    link.urls[name] = part.substr(open + 1, close - open - 1);
    link.rels.push_back(name);
  }
  return link;
}

nlohmann::json webhook_body(const std::string& connection_id, const std::string& delivery_id,
                            const std::string& event_type) {
  // The org of the connection's installation: "gh-inst-2" -> "org-2".
  const size_t inst = connection_id.rfind("inst-");
  const std::string org =
      "org-" + (inst == std::string::npos ? "1" : connection_id.substr(inst + 5));
  return {{"connectionId", connection_id},     {"orgId", org},
          {"deliveryId", delivery_id},         {"eventType", event_type},
          {"payload", {{"action", "opened"}}}, {"receivedAt", "2027-01-15T08:00:00Z"}};
}

}  // namespace backhaul::sandbox::testing
