// Crash safety end to end (SPEC "what done looks like", issue 5): backhauld is killed with
// SIGKILL at random points of a multi-thousand-event backfill, several times, and restarted on the
// same store each time. The gateway must end with every expected delivery id, nothing unexpected,
// every unit completed, and no more than one page fetched again per unit interrupted by a kill.
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/host/daemon/process_fixture.h"
#include <signal.h>
#include <sys/wait.h>

namespace backhaul::daemon::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kKills = 5;
constexpr int kPerInstallation = 5;  // entity caps: at most this many units run at once

class CrashTest : public ProcessTest {
 protected:
  void SetUp() override {
    ProcessTest::SetUp();
    std::random_device random;
    seed_ = random();
  }
  uint32_t seed_ = 0;
};

TEST_F(CrashTest, SigkillAtRandomPointsLosesNothingAndRefetchesAtMostOnePagePerUnit) {
  std::mt19937 rng(seed_);
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // 3 repositories x 3 entity types x 1000 items in pages of 20: 9000 events, 450 pages.
  const uint16_t sandbox_port = start_sandbox({"--repos", "3", "--projects", "0", "--items", "1000",
                                               "--max-per-page", "20", "--slow-ms", "5"});
  ASSERT_NE(sandbox_port, 0) << sandbox_->stderr_text();

  json config = daemon_config();
  // A stable owner: a restarted daemon takes back at once what its killed self held.
  config["scheduler"] = {
      {"workers", 8}, {"owner", "crash-test-host"}, {"recover_own_leases", true}};
  config["pipeline"]["entity_caps"] = {{"per_installation", kPerInstallation}, {"global", 30}};

  ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
  const int64_t run_id = start_run("gh-inst-1", "github");
  ASSERT_NE(run_id, 0);

  int kills = 0;
  int64_t last_pages = 0;
  for (int k = 0; k < kKills; ++k) {
    // Kill after a random amount of further progress (0 to 60 pages), before the run ends.
    const int64_t target = last_pages + std::uniform_int_distribution<int>(0, 60)(rng);
    json run;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      run = get_run(run_id);
      if (run.value("status", "") != "queued" && run.value("status", "") != "running") break;
      if (run.value("pages", int64_t{0}) >= target) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const std::string status = run.value("status", "");
    if (status != "queued" && status != "running") break;  // finished before this kill
    last_pages = run.value("pages", int64_t{0});
    ASSERT_TRUE(daemon_->signal(SIGKILL));
    const int exit_status = daemon_->wait_exit(std::chrono::seconds(30));
    ASSERT_TRUE(WIFSIGNALED(exit_status)) << exit_status;
    ++kills;
    ASSERT_NE(start_daemon(), 0) << daemon_->stderr_text();
  }
  EXPECT_GE(kills, 2) << "the run ended before most kills: make the data larger";

  const json run = wait_finished(run_id, std::chrono::seconds(120));
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  EXPECT_EQ(run["unitsTotal"], 9);
  EXPECT_EQ(run["unitsDone"], 9);
  EXPECT_EQ(run["unitsFailed"], 0);

  const json sandbox_report = report("inst-1");
  const json& github = sandbox_report["gateway"]["by_provider"]["github"];
  EXPECT_EQ(github["missing"], 0) << sandbox_report.dump(2);
  EXPECT_EQ(github["unexpected"], 0) << sandbox_report.dump(2);
  EXPECT_EQ(github["unique"], github["expected"]);
  EXPECT_EQ(run["eventsDispatched"], github["unique"]) << "the run's counts are the real ones";
  // Every page of the run once, plus at most one page again for each unit a kill interrupted (at
  // most kPerInstallation run at once), plus one scope check per orchestrator attempt.
  const int64_t pages = run.value("pages", int64_t{0});
  const int64_t requests = sandbox_report["provider_requests"].value("github", int64_t{0});
  EXPECT_GE(requests, pages);
  EXPECT_LE(requests, pages + kills * kPerInstallation + (1 + kills))
      << "pages " << pages << ", kills " << kills;

  EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
}

}  // namespace
}  // namespace backhaul::daemon::testing
