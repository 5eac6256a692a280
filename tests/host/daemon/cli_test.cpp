// `backhaul dlq ...` and `backhaul db migrate` as real processes against a daemon running
// in-process (the `run` commands are tested with the sandbox in run_api_test.cpp).
#include <atomic>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "core/jobs/job_store.h"
#include "tests/host/daemon/child_process.h"
#include "tests/host/daemon/daemon_fixture.h"
#include "tests/support/tcp_server.h"

namespace backhaul::daemon::testing {
namespace {

using nlohmann::json;

class CliTest : public DaemonTest {
 protected:
  CommandResult cli(std::vector<std::string> args) {
    args.insert(args.begin() + 2, {"--url", "http://127.0.0.1:" + std::to_string(daemon_->port())});
    return run_command(BACKHAUL_CLI_PATH, args, {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken},
                       dir_);
  }
};

TEST_F(CliTest, DlqListStatsRetryIgnorePurge) {
  start();
  const int64_t a = make_dead_letter("kind.a", "inst-1", "FATAL: scopes missing");
  const int64_t b = make_dead_letter("kind.b", "inst-2", "FATAL: gone");

  CommandResult list = cli({"dlq", "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.out.find("FATAL: scopes missing"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("kind.b"), std::string::npos) << list.out;

  CommandResult filtered = cli({"dlq", "list", "--kind", "kind.b", "--json"});
  ASSERT_EQ(filtered.exit_code, 0) << filtered.err;
  const json page = json::parse(filtered.out);
  ASSERT_EQ(page["items"].size(), 1u);
  EXPECT_EQ(page["items"][0]["id"], b);

  CommandResult stats = cli({"dlq", "stats"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_NE(stats.out.find("total 2"), std::string::npos) << stats.out;

  CommandResult retry = cli({"dlq", "retry", std::to_string(a)});
  ASSERT_EQ(retry.exit_code, 0) << retry.err;
  EXPECT_EQ(store().get_dead_letter(a)->status, jobs::DeadLetterStatus::kRetrying);
  CommandResult again = cli({"dlq", "retry", std::to_string(a)});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("CONFLICT"), std::string::npos) << again.err;

  CommandResult ignore = cli({"dlq", "ignore", std::to_string(b)});
  ASSERT_EQ(ignore.exit_code, 0) << ignore.err;
  EXPECT_EQ(store().get_dead_letter(b)->status, jobs::DeadLetterStatus::kIgnored);

  CommandResult bulk = cli({"dlq", "retry", "--all", "--limit", "5"});
  ASSERT_EQ(bulk.exit_code, 0) << bulk.err;
  EXPECT_NE(bulk.out.find("retried 0 dead letters"), std::string::npos) << bulk.out;

  clock_.advance_ms(3 * 86'400'000LL);
  CommandResult purge = cli({"dlq", "purge", "--older-than-days", "2"});
  ASSERT_EQ(purge.exit_code, 0) << purge.err;
  EXPECT_NE(purge.out.find("purged 1 "), std::string::npos) << purge.out;
  EXPECT_FALSE(store().get_dead_letter(b).has_value());

  CommandResult missing = cli({"dlq", "ignore", "999"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("DEAD_LETTER_NOT_FOUND"), std::string::npos) << missing.err;
}

// A filter given empty is sent, not dropped: the API refuses an empty kind or status, naming it,
// where the CLI used to leave the filter out and widen the request (`dlq retry --all --kind ""`
// retried every pending letter); an empty key keeps its meaning, letters without a key. An id
// with --all or filters is refused rather than half-read.
TEST_F(CliTest, AnEmptyFilterIsSentAndRefusedNotDropped) {
  start();
  const int64_t a = make_dead_letter("kind.a", "inst-1", "FATAL: scopes missing");

  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"dlq", "retry", "--all", "--limit", "5", "--kind", ""},
        std::vector<std::string>{"dlq", "list", "--kind", ""},
        std::vector<std::string>{"dlq", "list", "--status", ""}}) {
    const CommandResult refused = cli(args);
    EXPECT_EQ(refused.exit_code, 1) << args[1] << ": " << refused.out;
    EXPECT_NE(refused.err.find("must not be empty"), std::string::npos) << refused.err;
  }
  EXPECT_EQ(store().get_dead_letter(a)->status, jobs::DeadLetterStatus::kPending);

  const CommandResult no_key = cli({"dlq", "list", "--key", "", "--json"});
  ASSERT_EQ(no_key.exit_code, 0) << no_key.err;
  EXPECT_EQ(json::parse(no_key.out)["items"].size(), 0u) << "inst-1's letter has a key";

  const CommandResult both = cli({"dlq", "retry", std::to_string(a), "--all"});
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("give a dead letter ID, or --all with filters, not both"),
            std::string::npos)
      << both.err;
  EXPECT_EQ(store().get_dead_letter(a)->status, jobs::DeadLetterStatus::kPending);
}

TEST_F(CliTest, WrongTokenAndMissingTokenFail) {
  start();
  CommandResult wrong =
      run_command(BACKHAUL_CLI_PATH,
                  {"dlq", "stats", "--url", "http://127.0.0.1:" + std::to_string(daemon_->port())},
                  {"BACKHAUL_ADMIN_TOKEN=wrong"}, dir_);
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.err.find("UNAUTHORIZED"), std::string::npos) << wrong.err;
  CommandResult unset =
      run_command(BACKHAUL_CLI_PATH,
                  {"dlq", "stats", "--url", "http://127.0.0.1:" + std::to_string(daemon_->port()),
                   "--token-env", "BACKHAUL_TEST_UNSET_VARIABLE"},
                  {}, dir_);
  EXPECT_EQ(unset.exit_code, 1);
  EXPECT_NE(unset.err.find("BACKHAUL_TEST_UNSET_VARIABLE"), std::string::npos) << unset.err;
}

// From a review of the CLI: a token read from a file with its line break failed every request as
// "UNREACHABLE: ... invalid value for header Authorization"; a password in --url was printed back;
// there was no way to wait less than 30 s for a daemon that does not answer; --before 0 was
// dropped and the newest page shown.
TEST_F(CliTest, ATokenWithALineBreakTheUrlsPasswordATimeoutAndAZeroBeforeAreHandled) {
  start();
  const std::string url = "http://127.0.0.1:" + std::to_string(daemon_->port());
  const CommandResult line_break =
      run_command(BACKHAUL_CLI_PATH, {"dlq", "stats", "--url", url},
                  {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken + "\n"}, dir_);
  EXPECT_EQ(line_break.exit_code, 1);
  EXPECT_NE(line_break.err.find("environment variable BACKHAUL_ADMIN_TOKEN (the admin token) holds "
                                "a control character"),
            std::string::npos)
      << line_break.err;
  EXPECT_EQ(line_break.err.find(kToken), std::string::npos) << line_break.err;

  // A port that takes connections and never answers (until the test ends).
  std::atomic<bool> answered{false};
  backhaul::testing::TcpServer silent([&answered](Poco::Net::StreamSocket&) {
    while (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  const CommandResult no_answer = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "cancel", "7", "--url",
       "http://admin:hunter2@127.0.0.1:" + std::to_string(silent.port()), "--timeout-ms", "200"},
      {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_);
  EXPECT_EQ(no_answer.exit_code, 1);
  EXPECT_NE(
      no_answer.err.find("UNREACHABLE: no answer from backhauld at http://[REDACTED]@127.0.0.1:"),
      std::string::npos)
      << no_answer.err;
  EXPECT_NE(no_answer.err.find("200 ms"), std::string::npos) << no_answer.err;
  EXPECT_NE(no_answer.err.find("(the request may have been applied)"), std::string::npos)
      << no_answer.err;
  EXPECT_EQ(no_answer.err.find("hunter2"), std::string::npos) << no_answer.err;
  answered = true;

  for (const char* what : {"run", "dlq"}) {
    const CommandResult zero = cli({what, "list", "--before", "0"});
    EXPECT_NE(zero.exit_code, 0) << what;
    EXPECT_NE(zero.err.find("--before"), std::string::npos) << what << ": " << zero.err;
  }
}

// Options that cannot be honoured are refused, naming the option: an unknown log level turned
// logging off altogether, a --since past the int64 range ended in "error: stoll", a timeout of
// 0 failed every request, and --retries without a bound could shift the backoff past int64.
TEST_F(CliTest, AnUnknownLogLevelAnOutOfRangeSinceOrAZeroTimeoutIsRefused) {
  const CommandResult level =
      run_command(BACKHAUL_CLI_PATH, {"--log-level", "INFO", "db", "migrate"}, {}, dir_);
  EXPECT_NE(level.exit_code, 0);
  EXPECT_NE(level.err.find("--log-level"), std::string::npos) << level.err;
  const CommandResult since = run_command(BACKHAUL_CLI_PATH,
                                          {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t",
                                           "--resource-id", "1", "--since", "99999999999999999999"},
                                          {}, dir_);
  EXPECT_NE(since.exit_code, 0);
  EXPECT_NE(since.err.find("--since '99999999999999999999' is too large for a Unix ms time"),
            std::string::npos)
      << since.err;
  // strptime takes any day up to 31 and timegm rolled it into the next month.
  for (const std::string day :
       {"2024-02-31", "2023-02-29", "2024-04-31T10:00:00Z", "2024-01-01T23:59:60Z"}) {
    const CommandResult no_day = run_command(BACKHAUL_CLI_PATH,
                                             {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t",
                                              "--resource-id", "1", "--since", day},
                                             {}, dir_);
    EXPECT_EQ(no_day.exit_code, 1) << day;
    EXPECT_NE(no_day.err.find("--since '" + day + "' is not a date and time of the calendar"),
              std::string::npos)
        << no_day.err;
  }
  for (const std::string day : {"2024-02-29", "2024-01-31T12:00:00Z"}) {
    const CommandResult real_day =
        run_command(BACKHAUL_CLI_PATH,
                    {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t", "--resource-id", "1",
                     "--since", day, "--json", "-q"},
                    {}, dir_);
    EXPECT_EQ(real_day.exit_code, 0) << day << ": " << real_day.err;
  }
  // A timeout of 0 ms was taken, and every request failed at once.
  const CommandResult timeout = run_command(BACKHAUL_CLI_PATH,
                                            {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t",
                                             "--resource-id", "1", "--timeout-ms", "0"},
                                            {}, dir_);
  EXPECT_NE(timeout.exit_code, 0);
  EXPECT_NE(timeout.err.find("--timeout-ms"), std::string::npos) << timeout.err;
  // The backoff doubles per retry: 100 retries shifted past the width of int64 (undefined).
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--retries", "100"},
                                              std::vector<std::string>{"--max-wait-s", "0"}}) {
    std::vector<std::string> args = {"fetch",         "--plugin", FAKE_PLUGIN_PATH, "--token", "t",
                                     "--resource-id", "1"};
    args.insert(args.end(), bad.begin(), bad.end());
    const CommandResult refused = run_command(BACKHAUL_CLI_PATH, args, {}, dir_);
    EXPECT_NE(refused.exit_code, 0) << bad[0];
    EXPECT_NE(refused.err.find(bad[0]), std::string::npos) << refused.err;
  }
}

// A payload that is not JSON (the gateway's client would refuse it) fails its unit in `fetch`
// (exit 2, the reason on stderr), and --events writes no line for it: every line it writes is
// JSON. The payload went into the line as it was, and the command exited 0.
TEST_F(CliTest, FetchFailsAUnitWhosePayloadIsNotJsonAndWritesOnlyJsonLines) {
  const CommandResult fetched =
      run_command(BACKHAUL_CLI_PATH,
                  {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t", "--resource-id", "1",
                   "--config", R"({"cut_payloads": "yes"})", "--events", "--json", "-q"},
                  {}, dir_);
  EXPECT_EQ(fetched.exit_code, 2) << fetched.err;
  EXPECT_NE(fetched.err.find("failed: FATAL: plugin 'fake' returned a malformed page: event 0: "
                             "payload is not valid JSON"),
            std::string::npos)
      << fetched.err;
  std::istringstream lines(fetched.out);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    EXPECT_TRUE(json::accept(line)) << line;
  }
  EXPECT_GE(count, 1) << "the summary line";
}

// An answer without the fields a command reads (a daemon of another version, or something else
// at --url) ends the command with exit 1 naming the field. nlohmann's const operator[] on a
// missing key was an assertion: the CLI died of SIGABRT.
TEST_F(CliTest, AnAnswerWithoutTheFieldsACommandReadsIsReportedNamingTheField) {
  const std::string body =
      R"({"items": [{"id": 1}], "nextBefore": null, "status": "failed", "units": [{"jobId": 1}]})";
  const std::string answer =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  backhaul::testing::TcpServer impostor([&answer](Poco::Net::StreamSocket& socket) {
    std::string request;
    char chunk[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      const int n = socket.receiveBytes(chunk, sizeof chunk);
      if (n <= 0) return;
      request.append(chunk, static_cast<size_t>(n));
    }
    socket.sendBytes(answer.data(), static_cast<int>(answer.size()));
    socket.shutdown();
  });
  const std::string url = "http://127.0.0.1:" + std::to_string(impostor.port());
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"dlq", "list"}, std::vector<std::string>{"run", "list"},
        std::vector<std::string>{"run", "status", "7"}}) {
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--url", url});
    const CommandResult result =
        run_command(BACKHAUL_CLI_PATH, args, {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_);
    EXPECT_EQ(result.exit_code, 1) << command[0] << " " << command[1] << ": " << result.err;
    EXPECT_NE(result.err.find("UNEXPECTED_ANSWER: an answer of the admin API is not what this "
                              "command reads ("),
              std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find("not found"), std::string::npos) << result.err;
  }
}

TEST_F(CliTest, DbMigrateSqlitePrintsTheSchemaVersion) {
  const std::string db = (dir_ / "migrated.db").string();
  CommandResult migrate =
      run_command(BACKHAUL_CLI_PATH, {"db", "migrate", "--sqlite", db}, {}, dir_);
  ASSERT_EQ(migrate.exit_code, 0) << migrate.err;
  EXPECT_NE(migrate.out.find("sqlite store " + db + ": schema version "), std::string::npos)
      << migrate.out;
  auto store = jobs::open_sqlite_store(db);
  const int version = store->migrate();
  EXPECT_GE(version, 1);
  EXPECT_NE(migrate.out.find("schema version " + std::to_string(version) + "\n"), std::string::npos)
      << migrate.out;
  CommandResult neither = run_command(BACKHAUL_CLI_PATH, {"db", "migrate"}, {}, dir_);
  EXPECT_NE(neither.exit_code, 0);
}

}  // namespace
}  // namespace backhaul::daemon::testing
