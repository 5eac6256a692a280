#include "vercel_test_support.h"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace backhaul::vercel::testing {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(read_file(path));
}

std::string fixture(const std::string& relative_path) {
  return read_file(kFixtureDir / relative_path);
}

std::string recorded_error_body(size_t index) {
  const nlohmann::json bodies = read_json(kFixtureDir / "recorded/error-bodies.json");
  return bodies.at(index).at("body").dump();
}

http::Headers rate_limit_headers(int64_t remaining, int64_t limit, int64_t reset_seconds) {
  return {{"content-type", "application/json; charset=utf-8"},
          {"x-ratelimit-limit", std::to_string(limit)},
          {"x-ratelimit-remaining", std::to_string(remaining)},
          {"x-ratelimit-reset", std::to_string(reset_seconds)}};
}

std::string list_url(std::string_view project_id, std::string_view extra_query, int limit) {
  return std::string(kBaseUrl) + "/v6/deployments?projectId=" + std::string(project_id) +
         "&limit=" + std::to_string(limit) + std::string(extra_query);
}

std::map<std::string, std::string> query_of(std::string_view url) {
  std::map<std::string, std::string> params;
  const size_t question = url.find('?');
  if (question == std::string_view::npos) return params;
  std::string_view query = url.substr(question + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const size_t eq = pair.find('=');
    params[std::string(pair.substr(0, eq))] =
        eq == std::string_view::npos ? "" : std::string(pair.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return params;
}

std::optional<std::string> header_of(const http::Request& request, std::string_view name) {
  for (const auto& [key, value] : request.headers) {
    if (http::to_lower(key) == http::to_lower(name)) return value;
  }
  return std::nullopt;
}

std::vector<Event> events_of(const plugins::Page& page) {
  std::vector<Event> events;
  for (size_t i = 0; i < page.size(); ++i) {
    const plugins::EventView view = page.event(i);
    events.push_back({std::string(view.delivery_id), std::string(view.event_type),
                      nlohmann::json::parse(view.payload_json)});
  }
  return events;
}

std::vector<std::string> uids_of(const std::vector<Event>& events) {
  std::vector<std::string> uids;
  for (const Event& event : events) {
    uids.push_back(event.payload.at("payload").at("deployment").at("id").get<std::string>());
  }
  return uids;
}

Walk walk(const plugins::Connector& connector, plugins::FetchParams params, size_t max_pages) {
  Walk result;
  while (result.pages < max_pages) {
    const plugins::Page page = connector.fetch_page(params);
    ++result.pages;
    for (Event& event : events_of(page)) result.events.push_back(std::move(event));
    const std::optional<std::string_view> next = page.next_cursor();
    if (!next) return result;
    result.cursors.emplace_back(*next);
    params.cursor = std::string(*next);
  }
  ADD_FAILURE() << "pagination did not end within " << max_pages << " pages";
  return result;
}

plugins::Unit VercelTest::unit(std::string_view project_id) {
  return {std::string(kInstallation), std::string(project_id), std::nullopt, std::string(kToken)};
}

plugins::FetchParams VercelTest::params(std::string_view project_id,
                                        std::optional<std::string> cursor, int64_t since_unix_ms) {
  return {unit(project_id), "deployment", since_unix_ms, std::move(cursor)};
}

void VercelTest::reply(const std::string& url, int status, std::string body,
                       http::Headers headers) {
  http::Exchange exchange;
  exchange.method = "GET";
  exchange.url = url;
  exchange.response.status = status;
  exchange.response.headers = std::move(headers);
  exchange.response.body = std::move(body);
  exchange.response.url = url;
  transport_.add(std::move(exchange));
}

}  // namespace backhaul::vercel::testing
