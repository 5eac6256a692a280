// Sandbox lifecycle, determinism, and a reference backfill client that walks every resource the
// way the connectors must, through injected faults, and ends with a complete report.
#include "host/sandbox/sandbox.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/Timespan.h>
#include <gtest/gtest.h>

#include "host/common/process.h"
#include "tests/host/sandbox/test_client.h"
#include <unistd.h>

namespace backhaul::sandbox {
namespace {

using nlohmann::json;
using testing::FakeClock;
using testing::github_headers;
using testing::HttpResult;
using testing::parse_link;
using testing::TestClient;
using testing::vercel_headers;
using testing::webhook_body;

TEST(SandboxTest, StartsOnAnEphemeralPortAndStopsWithIdleConnectionsOpen) {
  Sandbox sandbox({});
  EXPECT_EQ(sandbox.port(), 0);
  sandbox.start();
  ASSERT_NE(sandbox.port(), 0);
  EXPECT_EQ(sandbox.base_url(), "http://127.0.0.1:" + std::to_string(sandbox.port()));
  EXPECT_THROW(sandbox.start(), std::logic_error);

  TestClient client(sandbox.port());  // keeps its keep-alive connection open
  EXPECT_EQ(client.get("/_sandbox/health").status, 200);
  EXPECT_EQ(client.get("/nowhere").status, 404);
  const auto before = std::chrono::steady_clock::now();
  sandbox.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(3));
  sandbox.stop();  // idempotent
}

// A request the sandbox cannot read was answered 500 on a connection kept alive, and the bytes
// after it were read as a request of their own. Now it is a 400, the only answer: the connection
// closes.
TEST(SandboxTest, ARequestThatCannotBeReadIsAnsweredOnceAndItsConnectionClosed) {
  Sandbox sandbox({});
  sandbox.start();
  Poco::Net::StreamSocket socket(Poco::Net::SocketAddress("127.0.0.1", sandbox.port()));
  socket.setReceiveTimeout(Poco::Timespan(10, 0));
  const std::string request =
      "POST /gateway/webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
      "Content-Length: 40\r\n\r\n{}GET /_sandbox/health HTTP/1.1\r\nHost: x\r\n\r\n";
  socket.sendBytes(request.data(), static_cast<int>(request.size()));
  std::string answer;
  char buffer[4096];
  for (int n; (n = socket.receiveBytes(buffer, sizeof buffer)) > 0;) answer.append(buffer, n);
  EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
  EXPECT_EQ(answer.find("HTTP/1.1 ", 1), std::string::npos) << "one answer: " << answer;
  EXPECT_NE(answer.find("Content-Length is given 2 times"), std::string::npos) << answer;
}

// The port file of `--port-file`: two writers of one path (a restart racing the old process's
// last write, say) each write a temporary of their own; neither fails and the file holds a port.
TEST(PortFileTest, TwoWritersOfOnePathNeitherFailNorLeaveTemporaries) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("backhaul-port-file-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "port").string();
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (uint16_t port : {uint16_t{4101}, uint16_t{4102}}) {
    writers.emplace_back([&, port] {
      for (int i = 0; i < 300; ++i) {
        try {
          host::write_port_file(path, port);
        } catch (const std::exception&) {
          ++failures;
        }
      }
    });
  }
  for (auto& writer : writers) writer.join();
  EXPECT_EQ(failures.load(), 0);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(text == "4101\n" || text == "4102\n") << text;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1) << "temporaries left";
  try {
    host::write_port_file((dir / "no-such-dir" / "port").string(), 4101);
    ADD_FAILURE() << "a port file in a missing directory was written";
  } catch (const std::system_error& error) {
    EXPECT_NE(std::string(error.what()).find("no-such-dir"), std::string::npos) << error.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(SandboxTest, RejectsInvalidOptions) {
  SandboxOptions options;
  options.items = -1;
  EXPECT_THROW(Sandbox{options}, std::invalid_argument);
  options = {};
  options.faults.fail_rate = 1.5;
  EXPECT_THROW(Sandbox{options}, std::invalid_argument);
  Sandbox sandbox({});
  EXPECT_THROW(sandbox.report("inst-2"), std::invalid_argument);
}

// Fetches `paths` (GitHub and Vercel) from a fresh sandbox and returns the bodies.
std::vector<std::string> bodies(uint64_t seed, const std::vector<std::string>& paths) {
  FakeClock clock;
  SandboxOptions options;
  options.seed = seed;
  options.now_ms = clock.function();
  Sandbox sandbox(options);
  sandbox.start();
  TestClient client(sandbox.port());
  const std::string github = client.token("gh-inst-1");
  const std::string vercel = client.token("vc-inst-1");
  std::vector<std::string> out;
  for (const std::string& path : paths) {
    const bool is_github = path.rfind("/github/", 0) == 0;
    HttpResult result =
        client.get(path, is_github ? github_headers(github) : vercel_headers(vercel));
    EXPECT_EQ(result.status, 200) << path;
    out.push_back(result.body);
  }
  return out;
}

TEST(SandboxTest, SameSeedServesIdenticalBodies) {
  const std::vector<std::string> paths = {
      "/github/repos/org-1/repo-1",
      "/github/repos/org-1/repo-2/pulls?state=all&per_page=100&page=2",
      "/github/repos/org-1/repo-3/issues?state=all&per_page=100",
      "/github/repositories/100001/releases?per_page=50&page=3",
      "/vercel/v6/deployments?projectId=prj_1_1&limit=100",
      "/vercel/v9/projects/prj_1_1"};
  const auto first = bodies(42, paths);
  EXPECT_EQ(first, bodies(42, paths));
  const auto other = bodies(43, paths);
  for (size_t k = 1; k < paths.size(); ++k) EXPECT_NE(first[k], other[k]) << paths[k];
}

// A backfill client written the way the connectors must behave: Link-header walks with
// state=all, PR entries skipped in issues, the Vercel cursor re-reading the boundary millisecond
// and de-duplicating, retries on 429/5xx and a token refresh on 401/403 invalidToken.
class ReferenceBackfill {
 public:
  explicit ReferenceBackfill(uint16_t port) : client_(port) {}

  void run(int installation) {
    const std::string inst = "inst-" + std::to_string(installation);
    const json github = client_.get("/gateway/connections/gh-" + inst).json();
    for (const auto& resource : github["resources"]) {
      const std::string repo_id = resource["providerResourceId"];
      const std::string base = "/github/repositories/" + repo_id + "/";
      walk_github(inst, base + "pulls?state=all&sort=updated&direction=desc&per_page=100",
                  [&](const json& pull) {
                    return "backfill-" + inst + "-" + repo_id + "-pr-" + pull["number"].dump();
                  });
      walk_github(inst, base + "issues?state=all&per_page=100", [&](const json& issue) {
        if (issue.contains("pull_request")) return std::string();
        return "backfill-" + inst + "-" + repo_id + "-issue-" + issue["number"].dump();
      });
      walk_github(inst, base + "releases?per_page=100", [&](const json& release) {
        return "backfill-" + inst + "-" + repo_id + "-release-" + release["id"].dump();
      });
    }
    const json vercel = client_.get("/gateway/connections/vc-" + inst).json();
    for (const auto& resource : vercel["resources"])
      walk_vercel(inst, resource["providerResourceId"]);
  }

  int retries = 0;
  int refreshes = 0;

 private:
  // GETs with retries: 429/5xx again, auth failures once more with a fresh token.
  HttpResult fetch(const std::string& connection, const std::string& target, bool is_github) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      std::string& token = tokens_[connection];
      if (token.empty()) token = client_.token(connection);
      HttpResult result = is_github ? client_.get(target, github_headers(token))
                                    : client_.get(target, vercel_headers(token));
      if (result.status == 401 || (result.status == 403 && !is_github)) {
        token.clear();
        ++refreshes;
        continue;
      }
      if (result.status == 429 || result.status >= 500) {
        ++retries;
        continue;
      }
      return result;
    }
    throw std::runtime_error("gave up on " + target);
  }

  template <typename DeliveryId>
  void walk_github(const std::string& inst, std::string target, DeliveryId delivery_id) {
    while (true) {
      HttpResult page = fetch("gh-" + inst, target, true);
      ASSERT_EQ(page.status, 200) << page.body;
      for (const auto& item : page.json()) {
        const std::string id = delivery_id(item);
        if (!id.empty()) deliver("github", "gh-" + inst, id);
      }
      const auto link = page.has_header("link") ? parse_link(page.header("link")) : testing::Link{};
      if (!link.urls.count("next")) return;
      const std::string& next = link.urls.at("next");
      target = next.substr(next.find("/github/"));
    }
  }

  void walk_vercel(const std::string& inst, const std::string& project) {
    std::set<std::string> seen;
    std::string until;
    while (true) {
      HttpResult page =
          fetch("vc-" + inst, "/vercel/v6/deployments?projectId=" + project + "&limit=100" + until,
                false);
      ASSERT_EQ(page.status, 200) << page.body;
      const json body = page.json();
      for (const auto& deployment : body["deployments"]) {
        const std::string uid = deployment["uid"];
        if (seen.insert(uid).second) {
          deliver("vercel", "vc-" + inst, "backfill-" + inst + "-" + project + "-deploy-" + uid);
        }
      }
      if (body["pagination"]["next"].is_null()) return;
      until = "&until=" + std::to_string(body["pagination"]["next"].get<int64_t>() + 1);
    }
  }

  void deliver(const std::string& provider, const std::string& connection, const std::string& id) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      const int status =
          client_.post("/gateway/webhooks/" + provider, webhook_body(connection, id).dump()).status;
      if (status == 202 || status == 200) return;
      ASSERT_EQ(status, 503);
      ++retries;
    }
    FAIL() << "gave up delivering " << id;
  }

  TestClient client_;
  std::map<std::string, std::string> tokens_;
};

TEST(SandboxTest, ReferenceBackfillThroughFaultsDeliversExactlyTheExpectedIds) {
  FakeClock clock;
  SandboxOptions options;
  options.installations = 2;
  options.repos = 2;
  options.projects = 2;
  options.items = 230;
  options.now_ms = clock.function();
  options.faults.burst_429_every = 7;
  options.faults.burst_len = 2;
  options.faults.token_ttl_requests = 5;
  options.faults.fail_rate = 0.1;
  options.faults.gateway_fail_rate = 0.05;
  options.faults.rate_limit = 1'000'000;
  Sandbox sandbox(options);
  sandbox.start();

  ReferenceBackfill backfill(sandbox.port());
  backfill.run(1);
  backfill.run(2);

  const Report report = sandbox.report();
  EXPECT_EQ(report.gateway.expected, 2 * (2 * 3 * 230 + 2 * 230));
  EXPECT_EQ(report.gateway.missing, 0);
  EXPECT_EQ(report.gateway.unexpected, 0);
  EXPECT_EQ(report.gateway.duplicates, 0);
  EXPECT_TRUE(report.complete());
  EXPECT_GT(report.faults_injected.at("burst_429"), 0);
  EXPECT_GT(report.faults_injected.at("token_expired"), 0);
  EXPECT_GT(report.faults_injected.at("provider_5xx"), 0);
  EXPECT_GT(report.faults_injected.at("gateway_5xx"), 0);
  EXPECT_GT(backfill.refreshes, 0);
  EXPECT_GT(report.provider_requests_by_installation.at("inst-2").at("vercel"), 0);
}

}  // namespace
}  // namespace backhaul::sandbox
