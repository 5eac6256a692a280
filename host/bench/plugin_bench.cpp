// `backhaul-bench plugins`: cost of loading the bundled connectors and reading their
// descriptors, and of one fetch_page through the ABI on a recorded 100-item page with HTTP
// replaced by a replay (so the figure is plugin work: parsing, filtering, building events),
// next to the cost of only parsing the same body with the same JSON library.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/http/replay_transport.h"
#include "core/plugins/plugin_loader.h"
#include "host/bench/bench.h"

namespace backhaul::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

// 100 items made from one recorded item, each with its own number and id.
std::string github_page(const std::string& fixture_dir) {
  json recorded = read_json(fixture_dir + "/github/synthetic/pulls.json");
  json item = recorded.at(0).at("response").at(0);
  json page = json::array();
  for (int i = 0; i < 100; ++i) {
    json copy = item;
    copy["number"] = 1000 - i;
    copy["id"] = 279147407 + i;
    page.push_back(std::move(copy));
  }
  return page.dump();
}

std::string vercel_page(const std::string& fixture_dir) {
  json recorded = read_json(fixture_dir + "/vercel/synthetic/walk.page1.json");
  json item = recorded.at("deployments").at(0);
  json deployments = json::array();
  for (int i = 0; i < 100; ++i) {
    json copy = item;
    copy["uid"] = "dpl_bench" + std::to_string(i);
    copy["created"] = 1784461200000LL - i * 1000;
    deployments.push_back(std::move(copy));
  }
  return json{{"deployments", deployments}, {"pagination", nullptr}}.dump();
}

struct Target {
  const char* plugin;
  std::string url;
  std::string body;
  std::string config;
  plugins::FetchParams params;
};

void run(const std::string& plugin_dir, const std::string& fixture_dir, int iterations) {
  FakeClock clock;
  // 1. Load both plugins and read their descriptors, cold each time (the library is unmapped
  //    between iterations because nothing from it survives).
  std::vector<double> load_ms;
  for (int i = 0; i < 20; ++i) {
    http::ReplayTransport none;
    auto start = Clock::now();
    size_t types = 0;
    for (const char* id : {"github", "vercel"}) {
      plugins::Plugin p = plugins::load_plugin(plugin_dir + "/" + id + ".so", {none, clock});
      types += p.info().entity_types.size();
    }
    load_ms.push_back(micros(Clock::now() - start) / 1000.0);
    if (types != 4) throw std::runtime_error("unexpected descriptors");
  }
  std::cout << json{{"bench", "plugin_load"},
                    {"plugins", 2},
                    {"first_ms", load_ms.front()},
                    {"median_ms", median(load_ms)},
                    {"max_ms", *std::max_element(load_ms.begin(), load_ms.end())},
                    {"runs", load_ms.size()}}
                   .dump()
            << "\n";

  // 2. fetch_page on a 100-item page, HTTP replayed.
  std::vector<Target> targets;
  Target gh{
      "github",
      "https://api.github.com/repositories/1296269/pulls?state=all&sort=updated&direction=desc&"
      "per_page=100",
      github_page(fixture_dir),
      "{}",
      {}};
  gh.params.unit = {"inst-1", "1296269", "o/r", "ghs_bench"};
  gh.params.entity_type = "pull_request";
  targets.push_back(gh);
  Target vc{"vercel",
            "https://api.vercel.com/v6/deployments?projectId=prj_bench&limit=100",
            vercel_page(fixture_dir),
            "{}",
            {}};
  vc.params.unit = {"inst-1", "prj_bench", std::nullopt, "vcp_bench"};
  vc.params.entity_type = "deployment";
  targets.push_back(vc);

  for (const Target& t : targets) {
    http::ReplayTransport transport;
    http::Exchange e;
    e.method = "GET";
    e.url = t.url;
    e.response.status = 200;
    e.response.headers = {{"x-ratelimit-limit", "5000"},
                          {"x-ratelimit-remaining", "4999"},
                          {"x-ratelimit-reset", "1900000000"}};
    e.response.body = t.body;
    transport.add(e);
    plugins::Plugin plugin =
        plugins::load_plugin(plugin_dir + "/" + t.plugin + ".so", {transport, clock});
    plugins::Connector connector = plugin.create(t.config);
    size_t events = 0;
    for (int i = 0; i < 20; ++i) events = connector.fetch_page(t.params).size();  // warm up
    if (events != 100) throw std::runtime_error(std::string(t.plugin) + ": expected 100 events");
    auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) connector.fetch_page(t.params);
    double per_page = micros(Clock::now() - start) / iterations;
    start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      json parsed = json::parse(t.body);
      if (parsed.is_null()) throw std::runtime_error("parse");
    }
    double parse_only = micros(Clock::now() - start) / iterations;
    std::cout << json{{"bench", "fetch_page"},
                      {"plugin", t.plugin},
                      {"items", 100},
                      {"body_bytes", t.body.size()},
                      {"us_per_page", per_page},
                      {"us_per_item", per_page / 100},
                      {"json_parse_us", parse_only},
                      {"parse_share", parse_only / per_page},
                      {"iterations", iterations}}
                     .dump()
              << "\n";
  }
}

}  // namespace

void add_plugin_bench(CLI::App& app) {
  auto plugin_dir = std::make_shared<std::string>(BACKHAUL_BENCH_PLUGIN_DIR);
  auto fixture_dir = std::make_shared<std::string>(BACKHAUL_BENCH_FIXTURE_DIR);
  auto iterations = std::make_shared<int>(300);
  CLI::App* cmd = app.add_subcommand(
      "plugins", "plugin load time and fetch_page overhead through the ABI (HTTP replayed)");
  cmd->add_option("--plugin-dir", *plugin_dir, "directory with github.so and vercel.so")
      ->capture_default_str();
  cmd->add_option("--fixtures", *fixture_dir, "tests/fixtures directory")->capture_default_str();
  cmd->add_option("--iterations", *iterations, "fetch_page calls per plugin")
      ->capture_default_str()
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));  // the figures are per call
  cmd->callback([=] { run(*plugin_dir, *fixture_dir, *iterations); });
}

}  // namespace backhaul::bench
