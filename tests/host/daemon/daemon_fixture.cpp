#include "tests/host/daemon/daemon_fixture.h"

#include <fstream>
#include <random>

#include "core/common/logging.h"

namespace backhaul::daemon::testing {

namespace fs = std::filesystem;
using nlohmann::json;

void DaemonTest::SetUp() {
  std::random_device random;
  dir_ = fs::temp_directory_path() / ("backhauld-test-" + std::to_string(random()));
  fs::create_directories(dir_);
  logging::configure(logging::Format::kText, "warn");
}

void DaemonTest::TearDown() {
  client_.reset();
  daemon_.reset();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void DaemonTest::start(const std::function<void(json&)>& edit) {
  json config = {
      {"store", {{"path", "jobs.db"}}},
      {"plugins", {{"directories", {BACKHAUL_TEST_PLUGIN_DIR}}}},
      {"gateway", {{"url", "http://127.0.0.1:9/gateway"}}},
      {"admin", {{"port", 0}, {"token_env", "BACKHAUL_TEST_TOKEN"}, {"max_body_bytes", 4096}}},
      {"scheduler", {{"workers", 2}}},
      {"shutdown", {{"grace_ms", 1000}}}};
  if (edit) edit(config);
  auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "BACKHAUL_TEST_TOKEN") return std::string(kToken);
    return std::nullopt;
  };
  daemon_ = std::make_unique<Daemon>(parse_config(config.dump(), dir_, env), clock_);
  daemon_->start();
  client_ = std::make_unique<sandbox::testing::TestClient>(daemon_->port());
}

HttpResult DaemonTest::call(const std::string& method, const std::string& target,
                            const std::string& body, const Headers& extra) {
  Headers headers = {{"Authorization", std::string("Bearer ") + kToken}};
  headers.insert(headers.end(), extra.begin(), extra.end());
  return client_->request(method, target, headers, body);
}

HttpResult DaemonTest::call_without_token(const std::string& method, const std::string& target) {
  return client_->request(method, target);
}

jobs::JobId DaemonTest::enqueue(const std::string& kind, const std::string& key, int max_attempts) {
  jobs::JobSpec spec;
  spec.kind = kind;
  spec.payload = R"({"unit":"x"})";
  spec.concurrency_key = key;
  spec.max_attempts = max_attempts;
  return store().enqueue(spec, now()).id;
}

std::string DaemonTest::claim(const std::string& kind) {
  auto claimed = store().claim({"test", 1, now(), 60'000, {kind}});
  if (claimed.size() != 1) throw std::runtime_error("nothing to claim of kind " + kind);
  return claimed[0].lease_token;
}

int64_t DaemonTest::make_dead_letter(const std::string& kind, const std::string& key,
                                     const std::string& error) {
  const jobs::JobId id = enqueue(kind, key, 1);
  auto claimed = store().claim({"test", 1, now(), 60'000, {kind}});
  if (claimed.size() != 1 || claimed[0].job.id != id) throw std::runtime_error("claim failed");
  store().fail(id, claimed[0].lease_token, {error, /*fatal=*/true, 0}, now());
  jobs::DeadLetterQuery query;
  query.kind = kind;
  for (const jobs::DeadLetter& letter : store().list_dead_letters(query).items) {
    if (letter.job_id == id) return letter.id;
  }
  throw std::runtime_error("no dead letter for job " + std::to_string(id));
}

std::vector<json> DaemonTest::audit_lines() const {
  std::ifstream in(dir_ / "audit.log");
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

}  // namespace backhaul::daemon::testing
