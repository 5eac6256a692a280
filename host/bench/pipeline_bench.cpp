// backhaul-bench pipeline: the whole backfill end to end, as an operator runs it. Starts the
// sandbox and the daemon (backhauld, embedded SQLite store) as real processes on 127.0.0.1,
// measures the daemon's start-up to ready and idle RSS, starts one run over a large installation,
// and reports pages/s, events/s, daemon CPU seconds per 1000 events and peak RSS. Then, in the
// same sitting, measures the sandbox gateway's raw webhook rate with wrk (when installed), which
// the pipeline's events/s is compared with. Both processes are stopped by their PIDs.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/common/errors.h"
#include "core/common/proc.h"
#include "core/http/poco_transport.h"
#include "host/bench/bench.h"
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backhaul::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Steady = std::chrono::steady_clock;

double seconds_since(Steady::time_point t) {
  return std::chrono::duration<double>(Steady::now() - t).count();
}

// A child process, killed (by its PID) and reaped when this goes out of scope.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
        const fs::path& log) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    int rc = posix_spawn(&pid_, argv[0].c_str(), &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw Error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  ~Child() { stop(SIGKILL); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  // Sends `signal` and waits for the exit; returns the wait status.
  int stop(int signal) {
    if (pid_ <= 0) return 0;
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
    return status;
  }

 private:
  pid_t pid_ = 0;
};

int wait_for_port(const fs::path& file, const Child& child, const fs::path& log) {
  auto start = Steady::now();
  while (seconds_since(start) < 30) {
    std::ifstream in(file);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (!child.alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  throw Error("no port in " + file.string() + "; log:\n" + text.str());
}

struct Api {
  http::PocoTransport transport;
  std::string base;
  std::string token;

  json call(const std::string& method, const std::string& path, const json& body = nullptr,
            int* status = nullptr) {
    http::Request r;
    r.method = method;
    r.url = base + path;
    r.headers.emplace_back("Authorization", "Bearer " + token);
    if (!body.is_null()) {
      r.headers.emplace_back("Content-Type", "application/json");
      r.body = body.dump();
    }
    http::Response response = transport.perform(r);
    if (status) *status = response.status;
    json j = json::parse(response.body, nullptr, false);
    return j.is_discarded() ? json() : j;
  }
};

struct PipelineOptions {
  int repos = 50;
  int64_t items = 2000;  // per entity type per repository: 20 pages of 100
  int workers = 8;
  int per_installation = 5;
  std::string isolation = "none";
  int wrk_seconds = 5;
  std::string bin_dir;
  std::string plugin_dir = BACKHAUL_BENCH_PLUGIN_DIR;
};

// Raw rate of POST /gateway/webhooks/github measured with wrk: `prefix` + a distinct delivery id +
// `suffix` as the body of every request.
std::optional<double> wrk_posts_per_s(const std::string& url, int seconds, const fs::path& dir,
                                      const std::string& prefix, const std::string& suffix) {
  if (std::system("command -v wrk >/dev/null 2>&1") != 0) return std::nullopt;
  // Lua long brackets hold any text that does not contain their closing bracket.
  std::string level = "=";
  while ((prefix + suffix).find("]" + level + "]") != std::string::npos) level += "=";
  fs::path script = dir / "post.lua";
  std::ofstream(script) << "counter = 0\nprefix = [" << level << "[" << prefix << "]" << level
                        << "]\nsuffix = [" << level << "[" << suffix << "]" << level << "]\n"
                        << R"(
request = function()
  counter = counter + 1
  local body = prefix .. "wrk-" .. math.random(1, 1000000000) .. "-" .. counter .. suffix
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
)";
  fs::path out = dir / "wrk.txt";
  std::string cmd = "wrk -t2 -c16 -d" + std::to_string(seconds) + "s -s " + script.string() + " " +
                    url + " > " + out.string() + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return std::nullopt;
  std::ifstream in(out);
  std::string line;
  std::regex rps(R"(Requests/sec:\s+([0-9.]+))");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, rps)) return std::stod(m[1]);
  }
  return std::nullopt;
}

// A body the pipeline really sent (the sandbox keeps the first one), split around its delivery
// id, so that wrk posts the same events; nullopt when the sandbox has none.
std::optional<std::pair<std::string, std::string>> event_template(http::Transport& transport,
                                                                  const std::string& sandbox_url) {
  http::Request request;
  request.url = sandbox_url + "/_sandbox/sample-webhook?provider=github";
  http::Response response = transport.perform(request);
  if (response.status != 200) return std::nullopt;
  const json body = json::parse(response.body, nullptr, false);
  if (!body.is_object() || !body.contains("deliveryId")) return std::nullopt;
  const std::string id = body["deliveryId"].get<std::string>();
  const std::string field = "\"deliveryId\":\"" + id + "\"";
  const size_t at = response.body.find(field);
  if (at == std::string::npos) return std::nullopt;
  const size_t id_at = at + field.size() - id.size() - 1;
  return std::make_pair(response.body.substr(0, id_at), response.body.substr(id_at + id.size()));
}

void run(const PipelineOptions& o) {
  fs::path dir =
      fs::temp_directory_path() / ("backhaul-bench-pipeline-" + std::to_string(getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};

  Child sandbox({o.bin_dir + "/backhaul-sandbox", "--port", "0", "--port-file",
                 (dir / "sandbox.port").string(), "--installations", "1", "--repos",
                 std::to_string(o.repos), "--projects", "0", "--items", std::to_string(o.items)},
                {}, dir / "sandbox.log");
  const std::string sandbox_url =
      "http://127.0.0.1:" +
      std::to_string(wait_for_port(dir / "sandbox.port", sandbox, dir / "sandbox.log"));

  json config = {{"store", {{"backend", "sqlite"}, {"path", (dir / "backhaul.db").string()}}},
                 {"plugins",
                  {{"directories", {o.plugin_dir}},
                   {"connectors", {{"github", {{"base_url", sandbox_url + "/github"}}}}},
                   {"isolation", {{"mode", o.isolation}}}}},
                 {"gateway", {{"url", sandbox_url + "/gateway"}}},
                 {"admin",
                  {{"port", 0},
                   {"token_env", "BACKHAUL_BENCH_ADMIN_TOKEN"},
                   {"audit_log", (dir / "audit.log").string()}}},
                 {"scheduler", {{"workers", o.workers}}},
                 {"pipeline",
                  {{"throttle_per_hour", 1e9},
                   {"throttle_burst", 1e6},
                   {"entity_caps", {{"per_installation", o.per_installation}, {"global", 30}}}}},
                 {"logging", {{"level", "warn"}}}};
  std::ofstream(dir / "config.json") << config.dump(2);

  const std::string token = "bench-admin-token";
  auto t_spawn = Steady::now();
  Child daemon({o.bin_dir + "/backhauld", "--config", (dir / "config.json").string(), "--port-file",
                (dir / "daemon.port").string()},
               {"BACKHAUL_BENCH_ADMIN_TOKEN=" + token}, dir / "daemon.log");
  Api api;
  api.base = "http://127.0.0.1:" +
             std::to_string(wait_for_port(dir / "daemon.port", daemon, dir / "daemon.log"));
  api.token = token;
  double ready_ms = -1;
  while (seconds_since(t_spawn) < 30) {
    int status = 0;
    try {
      api.call("GET", "/health/ready", nullptr, &status);
    } catch (const std::exception&) {
    }
    if (status == 200) {
      ready_ms = seconds_since(t_spawn) * 1000;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (ready_ms < 0) throw Error("the daemon did not become ready within 30 s");
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t idle_rss_kb = proc_status_kb(daemon.pid(), "VmRSS");
  const double cpu_before = proc_cpu_s(daemon.pid());
  // Isolation mode: the plugin worker processes' CPU counts too (they live until the stop).
  auto workers_cpu_s = [&] {
    double sum = 0;
    for (pid_t child : child_pids(daemon.pid())) sum += proc_cpu_s(child);
    return sum;
  };
  const double workers_cpu_before = workers_cpu_s();

  int status = 0;
  json start =
      api.call("POST", "/v1/runs",
               {{"installationId", "gh-inst-1"}, {"provider", "github"}, {"depth", 30}}, &status);
  if (status != 202)
    throw Error("POST /v1/runs answered " + std::to_string(status) + ": " + start.dump());
  const int64_t run_id = start.at("runId").get<int64_t>();
  auto t_run = Steady::now();
  json view;
  int64_t peak_rss_kb = 0;
  while (true) {
    view = api.call("GET", "/v1/runs/" + std::to_string(run_id));
    peak_rss_kb = std::max(peak_rss_kb, proc_status_kb(daemon.pid(), "VmRSS"));
    std::string s = view.value("status", "");
    if (s == "succeeded" || s == "failed" || s == "cancelled") break;
    if (!daemon.alive()) throw Error("the daemon exited during the run");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double run_s = seconds_since(t_run);
  const double cpu_s = proc_cpu_s(daemon.pid()) - cpu_before;
  const double workers_cpu = workers_cpu_s() - workers_cpu_before;
  int64_t workers_rss_kb = 0;
  for (pid_t child : child_pids(daemon.pid())) workers_rss_kb += proc_status_kb(child, "VmRSS");
  peak_rss_kb = std::max(peak_rss_kb, proc_status_kb(daemon.pid(), "VmHWM"));
  const int64_t pages = view.value("pages", int64_t{0});
  const int64_t events = view.value("eventsDispatched", int64_t{0});

  http::Request report_request;
  report_request.url = sandbox_url + "/_sandbox/report";
  json report = json::parse(api.transport.perform(report_request).body, nullptr, false);
  const int stop_status = daemon.stop(SIGTERM);

  // The gateway's raw rate on the events the pipeline sent (same bodies), and on a minimal event.
  const std::string hooks = sandbox_url + "/gateway/webhooks/github";
  std::optional<double> raw;
  std::size_t event_bytes = 0;
  if (auto tpl = event_template(api.transport, sandbox_url)) {
    event_bytes = tpl->first.size() + tpl->second.size() + 24;  // + a wrk-style delivery id
    raw = wrk_posts_per_s(hooks, o.wrk_seconds, dir, tpl->first, tpl->second);
  }
  std::optional<double> raw_small = wrk_posts_per_s(
      hooks, o.wrk_seconds, dir, R"({"connectionId":"gh-inst-1","orgId":"org-1","deliveryId":")",
      R"(","eventType":"issues","payload":{"action":"opened","issue":{"id":1}},"receivedAt":0})");
  json line = {
      {"bench", "pipeline"},
      {"status", view.value("status", "")},
      {"repos", o.repos},
      {"items_per_type", o.items},
      {"workers", o.workers},
      {"per_installation_cap", o.per_installation},
      {"units", view.value("unitsTotal", 0)},
      {"pages", pages},
      {"events", events},
      {"seconds", run_s},
      {"pages_per_s", pages / run_s},
      {"events_per_s", events / run_s},
      {"daemon_cpu_s", cpu_s},
      {"cpu_s_per_1000_events", events > 0 ? cpu_s * 1000 / static_cast<double>(events) : 0},
      {"isolation", o.isolation},
      {"plugin_workers_cpu_s", workers_cpu},
      {"plugin_workers_rss_kb", workers_rss_kb},
      {"daemon_startup_to_ready_ms", ready_ms},
      {"daemon_idle_rss_kb", idle_rss_kb},
      {"daemon_peak_rss_kb", peak_rss_kb},
      {"daemon_exit_on_sigterm",
       WIFEXITED(stop_status) ? json(WEXITSTATUS(stop_status)) : json("signal")},
      {"gateway_complete", report.is_object() && report.value("complete", false)},
      {"event_bytes", event_bytes},
      {"gateway_raw_posts_per_s", raw ? json(*raw) : json(nullptr)},
      {"gateway_raw_small_posts_per_s", raw_small ? json(*raw_small) : json(nullptr)},
      {"events_per_s_vs_raw", raw && *raw > 0 ? json(events / run_s / *raw) : json(nullptr)}};
  std::cout << line.dump() << std::endl;
}

}  // namespace

void add_pipeline_bench(CLI::App& app) {
  auto o = std::make_shared<PipelineOptions>();
  o->bin_dir = BACKHAUL_BENCH_BIN_DIR;
  CLI::App* cmd = app.add_subcommand(
      "pipeline", "a whole backfill through backhauld on the sandbox, beside the raw webhook rate");
  cmd->add_option("--repos", o->repos, "repositories in the installation")->capture_default_str();
  cmd->add_option("--items", o->items, "items per entity type per repository")
      ->capture_default_str();
  cmd->add_option("--workers", o->workers, "daemon workers")->capture_default_str();
  cmd->add_option("--isolation", o->isolation,
                  "plugins.isolation.mode: none, or process (plugin calls in worker processes)")
      ->check(CLI::IsMember({"none", "process"}))
      ->capture_default_str();
  cmd->add_option("--per-installation", o->per_installation, "entity jobs per installation")
      ->capture_default_str();
  cmd->add_option("--wrk-seconds", o->wrk_seconds, "length of the raw webhook measurement")
      ->capture_default_str();
  cmd->add_option("--bin-dir", o->bin_dir, "where backhauld and backhaul-sandbox are")
      ->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace backhaul::bench
