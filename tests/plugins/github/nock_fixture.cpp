#include "nock_fixture.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace backhaul::github_test {
namespace {

using nlohmann::json;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string header_value(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// nock writes the scope with its port: "https://api.github.com:443".
std::string origin_of_scope(std::string scope) {
  const auto strip = [&scope](std::string_view scheme, std::string_view port) {
    if (scope.rfind(scheme, 0) == 0 && scope.size() > port.size() &&
        scope.compare(scope.size() - port.size(), port.size(), port) == 0) {
      scope.resize(scope.size() - port.size());
    }
  };
  strip("https://", ":443");
  strip("http://", ":80");
  return scope;
}

http::Headers headers_of(const json& entry) {
  http::Headers headers;
  if (const auto raw = entry.find("rawHeaders"); raw != entry.end()) {
    for (size_t i = 0; i + 1 < raw->size(); i += 2) {
      headers.emplace_back(lower((*raw)[i].get<std::string>()), header_value((*raw)[i + 1]));
    }
  } else if (const auto object = entry.find("headers"); object != entry.end()) {
    for (const auto& [name, value] : object->items()) {
      headers.emplace_back(lower(name), header_value(value));
    }
  }
  return headers;
}

}  // namespace

std::filesystem::path fixture_path(const std::string& relative) {
  return std::filesystem::path(BACKHAUL_GITHUB_FIXTURES_DIR) / relative;
}

nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
}

http::Exchange exchange_from_nock(const json& entry) {
  http::Exchange exchange;
  exchange.method = upper(entry.at("method").get<std::string>());
  exchange.url =
      origin_of_scope(entry.at("scope").get<std::string>()) + entry.at("path").get<std::string>();
  exchange.response.status = entry.at("status").get<int>();
  exchange.response.headers = headers_of(entry);
  const json& body = entry.at("response");
  exchange.response.body = body.is_string() ? body.get<std::string>() : body.dump();
  exchange.response.url = exchange.url;
  return exchange;
}

std::vector<http::Exchange> load_nock(const std::string& relative, const std::string& method) {
  std::vector<http::Exchange> out;
  for (const json& entry : read_json(fixture_path(relative))) {
    if (upper(entry.at("method").get<std::string>()) == method) {
      out.push_back(exchange_from_nock(entry));
    }
  }
  return out;
}

}  // namespace backhaul::github_test
