#include "core/http/replay_transport.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/common/json_check.h"

namespace backhaul::http {
namespace {

using nlohmann::json;

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

Headers parse_headers(const json& j, const std::string& where) {
  Headers headers;
  if (j.is_null()) return headers;
  if (j.is_object()) {
    for (const auto& [name, value] : j.items()) {
      if (value.is_array()) {  // a repeated header
        for (const auto& v : value) {
          if (!v.is_string()) throw Error(where + ": headers." + name + " must hold strings");
          headers.emplace_back(to_lower(name), v.get<std::string>());
        }
      } else {
        headers.emplace_back(to_lower(name),
                             value.is_string() ? value.get<std::string>() : value.dump());
      }
    }
    return headers;
  }
  if (j.is_array()) {  // [[name, value], ...]
    for (const auto& pair : j) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
        throw Error(where + ": headers must be an object or a list of [name, value] pairs");
      headers.emplace_back(to_lower(pair[0].get<std::string>()), pair[1].get<std::string>());
    }
    return headers;
  }
  throw Error(where + ": headers must be an object or a list of [name, value] pairs");
}

Exchange parse_exchange(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": an exchange must be an object");
  const json& req = j.value("request", json());
  const json& res = j.value("response", json());
  if (!req.is_object() || !req.contains("url") || !req["url"].is_string())
    throw Error(where + ": request.url (string) is required");
  if (req.contains("method") && !req["method"].is_string())
    throw Error(where + ": request.method must be a string");
  Exchange e;
  e.method = upper(req.value("method", std::string("GET")));
  e.url = req["url"].get<std::string>();
  if (j.contains("error")) {  // a network failure instead of a response
    if (!j["error"].is_string()) throw Error(where + ": error must be a string");
    e.error = j["error"].get<std::string>();
    return e;
  }
  if (!res.is_object() || !res.contains("status") || !res["status"].is_number_integer())
    throw Error(where + ": response.status (integer) is required");
  e.response.status = res["status"].get<int>();
  e.response.headers = parse_headers(res.value("headers", json()), where);
  if (res.contains("body_text")) {
    if (!res["body_text"].is_string()) throw Error(where + ": response.body_text must be a string");
    e.response.body = res["body_text"].get<std::string>();
  } else if (res.contains("body")) {
    const json& body = res["body"];
    e.response.body = body.is_string() ? body.get<std::string>() : body.dump();
  }
  if (res.contains("url") && !res["url"].is_string())
    throw Error(where + ": response.url must be a string");
  e.response.url = res.value("url", e.url);
  return e;
}

}  // namespace

std::string canonical_url(std::string_view url) {
  size_t q = url.find('?');
  if (q == std::string_view::npos) return std::string(url);
  std::string_view query = url.substr(q + 1);
  size_t hash = query.find('#');
  if (hash != std::string_view::npos) query = query.substr(0, hash);
  std::vector<std::string_view> params;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view p = query.substr(0, amp);
    if (!p.empty()) params.push_back(p);
    if (amp == std::string_view::npos) break;
    query = query.substr(amp + 1);
  }
  std::sort(params.begin(), params.end());
  std::string out(url.substr(0, q));
  for (size_t i = 0; i < params.size(); ++i) {
    out += i == 0 ? '?' : '&';
    out += params[i];
  }
  return out;
}

ReplayTransport::ReplayTransport(std::vector<Exchange> exchanges)
    : exchanges_(std::move(exchanges)) {}

std::vector<Exchange> ReplayTransport::parse(std::string_view text, const std::string& origin) {
  // A body or header value is dumped back to text, recursively: one nested hundreds of thousands
  // deep would overflow the stack there.
  if (auto problem = depth_problem(text)) throw Error(origin + ": " + *problem);
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw Error(origin + ": not valid JSON");
  if (!doc.is_object() || !doc.contains("exchanges") || !doc["exchanges"].is_array())
    throw Error(origin + ": expected an object with an \"exchanges\" array");
  std::vector<Exchange> out;
  size_t index = 0;
  for (const json& j : doc["exchanges"]) {
    out.push_back(parse_exchange(j, origin + ": exchanges[" + std::to_string(index++) + "]"));
  }
  return out;
}

ReplayTransport ReplayTransport::from_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw Error("fixtures directory " + dir.string() + " does not exist");
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry);
  }
  std::sort(files.begin(), files.end());
  std::vector<Exchange> all;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot read fixture " + file.string());
    std::stringstream buffer;
    buffer << in.rdbuf();
    auto exchanges = parse(buffer.str(), file.string());
    std::move(exchanges.begin(), exchanges.end(), std::back_inserter(all));
  }
  return ReplayTransport(std::move(all));
}

void ReplayTransport::add(Exchange exchange) {
  std::lock_guard lock(mutex_);
  exchange.method = upper(std::move(exchange.method));
  if (exchange.response.url.empty()) exchange.response.url = exchange.url;
  exchanges_.push_back(std::move(exchange));
}

Response ReplayTransport::perform(const Request& request) {
  std::string method = upper(request.method);
  std::string wanted = canonical_url(request.url);
  std::lock_guard lock(mutex_);
  requests_.push_back(request);
  for (const Exchange& e : exchanges_) {
    if (e.method != method || canonical_url(e.url) != wanted) continue;
    if (e.error) throw TransportError(method + " " + request.url + ": " + *e.error);
    return e.response;
  }
  unmatched_.push_back(method + " " + request.url);
  throw TransportError("no recorded exchange for " + method + " " + request.url);
}

std::vector<Request> ReplayTransport::requests() const {
  std::lock_guard lock(mutex_);
  return requests_;
}

std::vector<std::string> ReplayTransport::unmatched() const {
  std::lock_guard lock(mutex_);
  return unmatched_;
}

size_t ReplayTransport::request_count() const {
  std::lock_guard lock(mutex_);
  return requests_.size();
}

}  // namespace backhaul::http
