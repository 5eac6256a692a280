#include "core/validate/fixtures.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/common/errors.h"
#include "core/common/json_check.h"

namespace backhaul::validate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read fixture " + path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::optional<std::string> string_member(const json& doc, const char* key, const fs::path& file) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw ConfigError(file.string() + ": " + key + " must be a string");
  return it->get<std::string>();
}

std::vector<std::string> entity_types(const json& doc, const fs::path& file) {
  std::vector<std::string> out;
  if (auto one = string_member(doc, "entity_type", file)) out.push_back(*one);
  auto it = doc.find("entity_types");
  if (it == doc.end()) return out;
  if (!it->is_array()) throw ConfigError(file.string() + ": entity_types must be an array");
  for (const json& t : *it) {
    if (!t.is_string() || t.get_ref<const std::string&>().empty())
      throw ConfigError(file.string() + ": entity_types must hold non-empty strings");
    out.push_back(t.get<std::string>());
  }
  return out;
}

FixtureSettings parse_settings(const fs::path& file) {
  const std::string text = read_file(file);
  // "config" is dumped back to text, recursively: one nested hundreds of thousands deep would
  // overflow the stack there.
  if (auto problem = depth_problem(text)) throw ConfigError(file.string() + ": " + *problem);
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    throw ConfigError(file.string() + ": not a JSON object");
  FixtureSettings s;
  if (auto it = doc.find("resource"); it != doc.end()) {
    if (!it->is_object()) throw ConfigError(file.string() + ": resource must be an object");
    s.resource_id = string_member(*it, "id", file);
    s.resource_name = string_member(*it, "name", file);
  }
  s.entity_types = entity_types(doc, file);
  if (auto it = doc.find("config"); it != doc.end()) {
    // A string is taken verbatim (to test odd configs); anything else is serialized.
    s.config_json = it->is_string() ? it->get<std::string>() : it->dump();
  }
  s.installation_id = string_member(doc, "installation_id", file);
  if (auto it = doc.find("since_unix_ms"); it != doc.end()) {
    if (!it->is_number_integer())
      throw ConfigError(file.string() + ": since_unix_ms must be an integer");
    s.since_unix_ms = it->get<int64_t>();
  }
  if (auto it = doc.find("max_pages"); it != doc.end()) {
    if (!it->is_number_unsigned() || it->get<size_t>() == 0)
      throw ConfigError(file.string() + ": max_pages must be a positive integer");
    s.max_pages = it->get<size_t>();
  }
  return s;
}

std::string match_key(std::string_view method, std::string_view url) {
  return http::to_lower(method) + " " + http::canonical_url(url);
}

}  // namespace

Fixtures load_fixtures(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError("fixtures directory " + dir.string() + " does not exist");
  Fixtures out;
  out.dir = dir;
  // Every call with an error_code: a filesystem error (a symbolic link that loops, a directory
  // that cannot be listed) is the fixtures' problem, named, not a std::filesystem_error.
  auto unreadable = [](const fs::path& path, const std::error_code& error) {
    return ConfigError("cannot read fixture " + path.string() + ": " + error.message());
  };
  std::vector<fs::path> files;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (it->path().extension() != ".json") continue;
    std::error_code entry_ec;
    const bool regular = it->is_regular_file(entry_ec);
    if (entry_ec) throw unreadable(it->path(), entry_ec);
    if (regular) files.push_back(it->path());
  }
  if (ec) throw unreadable(dir, ec);
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    if (file.filename() == kSettingsFileName) {
      out.settings = parse_settings(file);
      continue;
    }
    try {
      auto exchanges = http::ReplayTransport::parse(read_file(file), file.string());
      std::move(exchanges.begin(), exchanges.end(), std::back_inserter(out.exchanges));
    } catch (const ConfigError&) {
      throw;
    } catch (const Error& e) {
      throw ConfigError(e.what());
    }
  }
  if (out.exchanges.empty())
    throw ConfigError("fixtures directory " + dir.string() + " holds no recorded exchanges");
  return out;
}

FixtureTransport::FixtureTransport(const std::vector<http::Exchange>& exchanges)
    : exchanges_(exchanges) {
  for (size_t i = 0; i < exchanges_.size(); ++i) {
    index_.emplace(match_key(exchanges_[i].method, exchanges_[i].url), i);  // keeps the first
  }
}

std::optional<std::string> FixtureTransport::first_unmatched() const {
  std::lock_guard lock(mutex_);
  return first_unmatched_;
}

http::Response FixtureTransport::perform(const http::Request& request) {
  requests_.fetch_add(1);
  auto it = index_.find(match_key(request.method, request.url));
  if (it == index_.end()) {
    std::string what = request.method + " " + request.url;
    {
      std::lock_guard lock(mutex_);
      if (!first_unmatched_) first_unmatched_ = what;
    }
    throw http::TransportError("no recorded exchange for " + what);
  }
  const http::Exchange& e = exchanges_[it->second];
  if (e.error) throw http::TransportError(request.method + " " + request.url + ": " + *e.error);
  http::Response response = e.response;
  if (response.url.empty()) response.url = e.url;
  return response;
}

}  // namespace backhaul::validate
