// `backhaul dlq ...` and `backhaul db migrate` as real processes against a daemon running
// in-process, and `run --wait` against a scripted stand-in that fails on cue (the `run` commands
// are tested with the sandbox in run_api_test.cpp).
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <Poco/Data/SQLite/Connector.h>
#include <Poco/Data/Session.h>
#include <gtest/gtest.h>

#include "core/common/json_check.h"
#include "core/jobs/job_store.h"
#include "tests/host/daemon/child_process.h"
#include "tests/host/daemon/daemon_fixture.h"
#include "tests/support/scripted_http_server.h"
#include "tests/support/tcp_server.h"
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

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
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("id excludes --all"), std::string::npos) << both.err;
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
  const CommandResult no_answer =
      run_command(BACKHAUL_CLI_PATH,
                  {"run", "cancel", "7", "--url",
                   "http://127.0.0.1:" + std::to_string(silent.port()), "--timeout-ms", "200"},
                  {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_);
  EXPECT_EQ(no_answer.exit_code, 1);
  EXPECT_NE(no_answer.err.find("UNREACHABLE: no answer from backhauld at http://127.0.0.1:"),
            std::string::npos)
      << no_answer.err;
  EXPECT_NE(no_answer.err.find("200 ms"), std::string::npos) << no_answer.err;
  EXPECT_NE(no_answer.err.find("(the request may have been applied)"), std::string::npos)
      << no_answer.err;
  answered = true;

  for (const char* what : {"run", "dlq"}) {
    const CommandResult zero = cli({what, "list", "--before", "0"});
    EXPECT_NE(zero.exit_code, 0) << what;
    EXPECT_NE(zero.err.find("--before"), std::string::npos) << what << ": " << zero.err;
  }
}

// A token with a space at either end (copied with one) is not the daemon's token, which refuses
// one at start: it was sent, and was let in only because the daemon's HTTP parser drops the spaces
// around a header's value (anything on the way that kept them answered 401, naming no variable).
// It is refused before any request, naming the variable, as the daemon refuses it.
TEST_F(CliTest, ATokenThatBeginsOrEndsWithASpaceIsRefusedNamingTheVariable) {
  start();
  const std::string url = "http://127.0.0.1:" + std::to_string(daemon_->port());
  for (const std::string& token : {std::string(kToken) + " ", " " + std::string(kToken)}) {
    const CommandResult spaced = run_command(BACKHAUL_CLI_PATH, {"dlq", "stats", "--url", url},
                                             {"BACKHAUL_ADMIN_TOKEN=" + token}, dir_);
    EXPECT_EQ(spaced.exit_code, 1);
    EXPECT_NE(spaced.err.find("environment variable BACKHAUL_ADMIN_TOKEN (the admin token) begins "
                              "or ends with a space, which an HTTP header drops (it could never "
                              "match)"),
              std::string::npos)
        << spaced.err;
    EXPECT_EQ(spaced.err.find(kToken), std::string::npos) << spaced.err;
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
                             "payload_json is not valid JSON"),
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

// Usage errors are reported as such, before the token is looked at (no token is set here):
// `dlq retry 0` said "give a dead letter ID", `dlq retry 1 --limit 5` dropped the limit unsaid,
// and a --url that is not a URL failed as "UNREACHABLE: no answer from backhauld".
TEST_F(CliTest, IdsLimitsAndUrlsAreCheckedBeforeTheToken) {
  struct Case {
    std::vector<std::string> args;
    std::string env;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"dlq", "retry", "0"}, "", "id: a dead letter id is a positive integer, not '0'"},
      {{"dlq", "ignore", "-4"}, "", "id: a dead letter id is a positive integer, not '-4'"},
      {{"run", "status", "7x"}, "", "id: a run id is a positive integer, not '7x'"},
      {{"run", "cancel", "0"}, "", "id: a run id is a positive integer, not '0'"},
      {{"dlq", "retry", "1", "--limit", "5"}, "", "excludes --limit"},
      {{"dlq", "retry", "1", "--kind", "k"}, "", "--kind excludes id"},
      {{"dlq", "retry"},
       "",
       "dlq retry: give a dead letter ID, or --all (with filters and --limit)"},
      {{"dlq", "stats", "--url", "127.0.0.1:8470"},
       "",
       "--url (or BACKHAUL_URL): '127.0.0.1:8470' is not an http:// or https:// URL"},
      {{"run", "list", "--url", "http:/127.0.0.1"}, "", "'http:/127.0.0.1' names no host"},
      {{"run", "list"},
       "BACKHAUL_URL=http://admin:hunter2@127.0.0.1:8470/?x=1",
       "--url (or BACKHAUL_URL): 'http://[REDACTED]@127.0.0.1:8470/?x=1' has a query or "
       "fragment"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> env = {"BACKHAUL_ADMIN_TOKEN="};
    if (!c.env.empty()) env.push_back(c.env);
    const CommandResult result = run_command(BACKHAUL_CLI_PATH, c.args, env, dir_);
    const std::string what = c.args[0] + " " + c.args[1] + " " + c.says;
    EXPECT_NE(result.exit_code, 0) << what;
    EXPECT_NE(result.err.find(c.says), std::string::npos) << what << "\n" << result.err;
    EXPECT_EQ(result.err.find("BACKHAUL_ADMIN_TOKEN"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("hunter2"), std::string::npos) << result.err;
  }
  // Given, --url wins over BACKHAUL_URL, which is then not checked: the token is the next problem.
  const CommandResult given =
      run_command(BACKHAUL_CLI_PATH, {"run", "list", "--url", "http://127.0.0.1:1"},
                  {"BACKHAUL_ADMIN_TOKEN=", "BACKHAUL_URL=not a url"}, dir_);
  EXPECT_EQ(given.exit_code, 1);
  EXPECT_NE(
      given.err.find("environment variable BACKHAUL_ADMIN_TOKEN (the admin token) is not set"),
      std::string::npos)
      << given.err;
}

// A stand-in for backhauld at the HTTP level: it answers each request with the next of its
// answers (the last one repeats). An answer of status 0 closes the connection without a word, as a
// daemon going down does.
class ScriptedDaemon {
 public:
  using Answer = backhaul::testing::ScriptedHttpServer::Answer;

  explicit ScriptedDaemon(std::vector<Answer> answers)
      : answers_(std::move(answers)), server_([this](const std::string&) {
          return answers_[std::min(next_++, answers_.size() - 1)];
        }) {}

  uint16_t port() const { return server_.port(); }
  std::string url() const { return server_.url(); }
  std::vector<std::string> requests() const { return server_.requests(); }

  static Answer run(const std::string& status) {
    return {
        200,
        json{{"id", 7}, {"status", status}, {"unitsTotal", 2}, {"units", json::array()}}.dump()};
  }
  static Answer error(int status, const std::string& code) {
    return {status, json{{"error", {{"code", code}, {"message", "from the script"}}}}.dump()};
  }

 private:
  const std::vector<Answer> answers_;
  size_t next_ = 0;                               // the server calls one answer at a time
  backhaul::testing::ScriptedHttpServer server_;  // last: serves once the rest exists
};

// `run status --wait` polled once and gave up: a daemon restarting (no answer) or answering 503
// while the run went on ended the command with status 1, as if the run had failed.
TEST_F(CliTest, RunWaitPollsThroughADaemonThatRestartsOrCannotAnswer) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  ScriptedDaemon daemon({ScriptedDaemon::run("running"),
                         ScriptedDaemon::error(503, "UNAVAILABLE"),
                         {0, ""},
                         ScriptedDaemon::error(429, "RATE_LIMITED"),
                         ScriptedDaemon::run("succeeded")});
  const CommandResult waited = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "status", "7", "--wait", "--interval-ms", "50", "--url", daemon.url()}, env, dir_);
  EXPECT_EQ(waited.exit_code, 0) << waited.out << waited.err;
  EXPECT_EQ(daemon.requests().size(), 5u);
  // One line per new error (the output is not a terminal), each saying how long polls go on.
  std::vector<std::string> troubles;
  std::istringstream lines(waited.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("run 7: polling again for up to ", 0) == 0) {
      const size_t code = line.find(" after ") + 7;
      troubles.push_back(line.substr(code, line.find(':', code) - code));
    }
  }
  EXPECT_EQ(troubles, (std::vector<std::string>{"UNAVAILABLE", "UNREACHABLE", "RATE_LIMITED"}))
      << waited.out;
  EXPECT_NE(waited.out.find("run 7 succeeded"), std::string::npos) << waited.out;

  // Polls that keep failing end the wait after --lost-contact-ms with status 3 of its own.
  ScriptedDaemon gone(
      {ScriptedDaemon::run("running"), ScriptedDaemon::error(503, "STORAGE_ERROR")});
  const CommandResult lost = run_command(BACKHAUL_CLI_PATH,
                                         {"run", "status", "7", "--wait", "--interval-ms", "50",
                                          "--lost-contact-ms", "300", "--url", gone.url()},
                                         env, dir_);
  EXPECT_EQ(lost.exit_code, 3) << lost.out << lost.err;
  EXPECT_NE(lost.err.find("run 7: lost contact with backhauld for 0m00s (STORAGE_ERROR: from the "
                          "script); the run goes on without this command"),
            std::string::npos)
      << lost.err;
  EXPECT_GE(gone.requests().size(), 3u) << "polled through the failures";

  // A wrong token is not waited out; nor is anything before a first answer (a wrong --url).
  ScriptedDaemon refusing(
      {ScriptedDaemon::run("running"), ScriptedDaemon::error(401, "UNAUTHORIZED")});
  const CommandResult refused = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "status", "7", "--wait", "--interval-ms", "50", "--url", refusing.url()}, env, dir_);
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("UNAUTHORIZED: from the script"), std::string::npos) << refused.err;
  EXPECT_EQ(refusing.requests().size(), 2u);
  ScriptedDaemon never({{0, ""}, ScriptedDaemon::run("succeeded")});
  const CommandResult unreached = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "status", "7", "--wait", "--interval-ms", "50", "--url", never.url()}, env, dir_);
  EXPECT_EQ(unreached.exit_code, 1) << unreached.err;
  EXPECT_NE(unreached.err.find("UNREACHABLE"), std::string::npos) << unreached.err;
  EXPECT_EQ(never.requests().size(), 1u);
}

// Review: CLI11 read numbers as C does (strtoll base 0): `run cancel 010` cancelled run 8, `dlq
// retry 0x10` retried letter 16, `--older-than-days 030` purged 24 days, and an id too large
// became the largest int64. A number is now decimal digits, or the command is refused before any
// request.
TEST_F(CliTest, NumbersAreDecimalNotOctalHexOrSaturated) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  ScriptedDaemon daemon({ScriptedDaemon::run("running")});
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"run", "cancel", "010"}, "'010': a number has no leading zero"},
      {{"dlq", "retry", "0x10"}, "'0x10' is not a number"},
      {{"dlq", "purge", "--older-than-days", "030"}, "'030': a number has no leading zero"},
      {{"run", "status", "99999999999999999999"}, "'99999999999999999999' is too large"},
      {{"run", "list", "--limit", "+5"}, "'+5' is not a number"},
      {{"run", "status", "7", "--wait", "--interval-ms", "0100"}, "'0100': a number has no"},
      {{"fetch", "--plugin", "github", "--depth", "0x1E"}, "'0x1E' is not a number"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = args;
    argv.insert(argv.end(), {"--url", daemon.url()});
    const CommandResult r = run_command(BACKHAUL_CLI_PATH, argv, env, dir_);
    EXPECT_GE(r.exit_code, 100) << args[0] << " " << args[1] << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  EXPECT_TRUE(daemon.requests().empty()) << daemon.requests().front();
  // Plain decimal still works, 0 where an option takes it.
  const CommandResult listed =
      run_command(BACKHAUL_CLI_PATH, {"run", "status", "10", "--url", daemon.url()}, env, dir_);
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  ASSERT_EQ(daemon.requests().size(), 1u);
  EXPECT_NE(daemon.requests()[0].find("/v1/runs/10"), std::string::npos) << daemon.requests()[0];
}

// Review: options that mean something only with another were taken and ignored without it:
// --interval-ms and --lost-contact-ms without --wait, --no-proxy without --proxy, a resource with
// --all-resources. They are refused (exit >= 100) before anything is done.
TEST_F(CliTest, AnOptionThatNeedsAnotherIsRefusedWithoutIt) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  ScriptedDaemon daemon({ScriptedDaemon::run("running")});
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"run", "status", "7", "--interval-ms", "100", "--url", daemon.url()},
       "--interval-ms requires --wait"},
      {{"run", "status", "7", "--lost-contact-ms", "0", "--url", daemon.url()},
       "--lost-contact-ms requires --wait"},
      {{"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t", "--resource-id", "1", "--no-proxy",
        "a"},
       "--no-proxy requires --proxy"},
      {{"fetch", "--plugin", FAKE_PLUGIN_PATH, "--connection", "c", "--all-resources",
        "--resource-id", "1"},
       "--resource-id excludes --all-resources"},
  };
  for (const auto& [args, message] : cases) {
    const CommandResult r = run_command(BACKHAUL_CLI_PATH, args, env, dir_);
    EXPECT_GE(r.exit_code, 100) << args[0] << " " << args[1] << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  EXPECT_TRUE(daemon.requests().empty());
}

// Review: `run status` took any JSON for a run: another server's `{}` printed "run 0 ?" with status
// 0, and `--wait` polled it for ever. And an error whose "error" is no envelope (a proxy's
// {"error":"Bad Gateway"}) ended a wait as an unexpected answer, where that 502 is passed.
TEST_F(CliTest, AnAnswerThatIsNoRunEndsTheCommandAndAProxys502IsWaitedThrough) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  for (const char* answer : {"{}", "[]", "5"}) {
    ScriptedDaemon impostor({{200, answer}});
    for (const bool wait : {false, true}) {
      std::vector<std::string> argv = {"run", "status", "7", "--url", impostor.url()};
      if (wait) argv.insert(argv.end(), {"--wait", "--interval-ms", "50"});
      const CommandResult r = run_command(BACKHAUL_CLI_PATH, argv, env, dir_);
      EXPECT_EQ(r.exit_code, 1) << answer << ": " << r.out << r.err;
      EXPECT_NE(r.err.find("UNEXPECTED_ANSWER"), std::string::npos) << answer << ": " << r.err;
    }
    EXPECT_EQ(impostor.requests().size(), 2u) << answer << ": one poll each";
  }

  ScriptedDaemon proxied({ScriptedDaemon::run("running"),
                          {502, R"({"error":"Bad Gateway"})"},
                          {503, R"({"error":{"code":5,"message":["not text"]}})"},
                          ScriptedDaemon::run("succeeded")});
  const CommandResult waited = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "status", "7", "--wait", "--interval-ms", "50", "--json", "--url", proxied.url()},
      env, dir_);
  EXPECT_EQ(waited.exit_code, 0) << waited.out << waited.err;
  EXPECT_EQ(proxied.requests().size(), 4u);
  const json run = json::parse(waited.out, nullptr, false);
  ASSERT_TRUE(run.is_object()) << waited.out;
  EXPECT_EQ(run["status"], "succeeded");
}

// `run start --wait --json` printed only the finished run: a script could not tell a run it
// started from one already active. The run's JSON now carries the start's `created`.
TEST_F(CliTest, RunStartWaitJsonSaysWhetherItStartedTheRun) {
  ScriptedDaemon daemon({{202, R"({"runId": 7, "created": false, "status": "running"})"},
                         ScriptedDaemon::run("running"),
                         ScriptedDaemon::run("succeeded")});
  const CommandResult started =
      run_command(BACKHAUL_CLI_PATH,
                  {"run", "start", "--installation", "gh-inst-1", "--provider", "github", "--wait",
                   "--interval-ms", "50", "--json", "--url", daemon.url()},
                  {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_);
  ASSERT_EQ(started.exit_code, 0) << started.err;
  const json run = json::parse(started.out, nullptr, false);
  ASSERT_FALSE(run.is_discarded()) << started.out;
  EXPECT_EQ(run["created"], false) << started.out;
  EXPECT_EQ(run["status"], "succeeded") << started.out;
  EXPECT_NE(started.err.find("run 7 already active for gh-inst-1 (running)"), std::string::npos)
      << started.err;
  EXPECT_EQ(daemon.requests().front(), "POST /v1/runs HTTP/1.1");
}

// With --json, stdout holds one JSON document whatever happens: the answer, or an error in the
// API's envelope (the error went to stderr alone, and a script parsing stdout found nothing).
TEST_F(CliTest, WithJsonAnErrorIsAnEnvelopeOnStdout) {
  start();
  const CommandResult missing = cli({"dlq", "ignore", "999", "--json"});
  EXPECT_EQ(missing.exit_code, 1);
  const json not_found = json::parse(missing.out, nullptr, false);
  EXPECT_EQ(not_found["error"]["code"], "DEAD_LETTER_NOT_FOUND") << missing.out;
  EXPECT_EQ(not_found["error"]["status"], 404) << missing.out;
  EXPECT_TRUE(not_found["error"]["message"].is_string()) << missing.out;
  EXPECT_NE(missing.err.find("DEAD_LETTER_NOT_FOUND"), std::string::npos) << missing.err;

  const CommandResult empty = cli({"dlq", "list", "--kind", "", "--json"});
  EXPECT_EQ(empty.exit_code, 1);
  const json refused = json::parse(empty.out, nullptr, false);
  EXPECT_EQ(refused["error"]["status"], 400) << empty.out;
  EXPECT_EQ(refused["error"]["details"]["field"], "kind") << empty.out;

  ScriptedDaemon gone({{0, ""}});
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  const CommandResult unreached = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "cancel", "7", "--json", "--url", "http://127.0.0.1:" + std::to_string(gone.port())},
      env, dir_);
  EXPECT_EQ(unreached.exit_code, 1);
  const json no_answer = json::parse(unreached.out, nullptr, false);
  EXPECT_EQ(no_answer["error"]["code"], "UNREACHABLE") << unreached.out;
  EXPECT_FALSE(no_answer["error"].contains("status")) << "no HTTP answer";

  ScriptedDaemon failing(
      {ScriptedDaemon::run("running"), ScriptedDaemon::error(503, "UNAVAILABLE")});
  const CommandResult lost = run_command(BACKHAUL_CLI_PATH,
                                         {"run", "status", "7", "--wait", "--json", "--interval-ms",
                                          "50", "--lost-contact-ms", "100", "--url", failing.url()},
                                         env, dir_);
  EXPECT_EQ(lost.exit_code, 3) << lost.err;
  const json lost_contact = json::parse(lost.out, nullptr, false);
  EXPECT_EQ(lost_contact["error"]["code"], "LOST_CONTACT") << lost.out;
  EXPECT_EQ(lost_contact["error"]["details"]["runId"], 7) << lost.out;
  EXPECT_NE(
      lost_contact["error"]["message"].get<std::string>().find("UNAVAILABLE: from the script"),
      std::string::npos)
      << lost.out;

  // An answer that is not the API's is an envelope too; without --json, stdout stays empty.
  ScriptedDaemon impostor({{202, R"({"ok": true})"}});
  for (const bool json_output : {true, false}) {
    std::vector<std::string> args = {"run",        "start",  "--installation", "i",
                                     "--provider", "github", "--url",          impostor.url()};
    if (json_output) args.push_back("--json");
    const CommandResult odd = run_command(BACKHAUL_CLI_PATH, args, env, dir_);
    EXPECT_EQ(odd.exit_code, 1) << odd.err;
    EXPECT_NE(odd.err.find("UNEXPECTED_ANSWER"), std::string::npos) << odd.err;
    if (json_output) {
      EXPECT_EQ(json::parse(odd.out, nullptr, false)["error"]["code"], "UNEXPECTED_ANSWER")
          << odd.out;
    } else {
      EXPECT_EQ(odd.out, "");
    }
  }
}

// What `fetch` can refuse without a plugin is refused before one is loaded (whose init() may take
// long, or hang) and before the gateway is asked anything: here the plugin does not even exist,
// and each command names its own mistake, not the missing plugin.
TEST_F(CliTest, FetchRefusesItsUsageErrorsBeforeLoadingThePlugin) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--resource-id", "1", "--since", "soon"}, "--since 'soon' is not "},
      {{"--resource-id", "1", "--connection", "c"}, "--connection needs --gateway"},
      {{"--resource-id", "1", "--dispatch"}, "--dispatch needs --gateway and --connection"},
      {{"--all-resources"}, "--all-resources needs --connection"},
      {{}, "--resource-id is required (or --all-resources)"},
  };
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> args = {"fetch", "--plugin", "/nonexistent/plugin.so", "--token", "t"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = run_command(BACKHAUL_CLI_PATH, args, {}, dir_);
    EXPECT_EQ(r.exit_code, 1) << message << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("nonexistent"), std::string::npos) << r.err;
  }
}

// From a review of `fetch`: a plugin's message went out raw (a line of its own, terminal
// escapes); giving up on a long wait did not say why; --cursor was given to every unit, which
// then fetched its pages as their own; --since took "2024-1-1", "" and the year 292278994; a token
// with a line break failed each unit as an invalid header; a missing --ca-file was found at the
// first https request and retried as RETRYABLE.
TEST_F(CliTest, FetchNamesWhatItRefusesAndEscapesWhatPluginsSay) {
  const std::vector<std::string> base = {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--resource-id",
                                         "1"};
  const auto fetch = [&](std::vector<std::string> extra,
                         std::vector<std::string> env = {"BACKHAUL_TOKEN=t"}) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_command(BACKHAUL_CLI_PATH, args, env, dir_);
  };
  const CommandResult forged = fetch({"--config", R"({"fail": "forge_lines"})"});
  EXPECT_EQ(forged.exit_code, 2) << forged.err;
  EXPECT_NE(forged.err.find("failed: FATAL: gone\\nsummary: all units succeeded\\x1b[2K\\r\n"),
            std::string::npos)
      << forged.err;
  EXPECT_EQ(forged.err.find('\x1b'), std::string::npos);
  EXPECT_EQ(forged.err.find("\nsummary:"), std::string::npos) << forged.err;

  const CommandResult waited =
      fetch({"--config", R"({"fail": "rate_limited"})", "--max-wait-s", "1"});
  EXPECT_EQ(waited.exit_code, 2) << waited.err;
  EXPECT_NE(waited.err.find("failed: RATE_LIMITED: slow down; asked to wait 5 s, more than "
                            "--max-wait-s 1"),
            std::string::npos)
      << waited.err;

  const CommandResult cursor = fetch({"--cursor", "2", "-e", "item", "-e", "other"});
  EXPECT_EQ(cursor.exit_code, 1);
  EXPECT_NE(cursor.err.find("--cursor resumes one unit: give one resource and one --entity (this "
                            "is 1 resources x 2 entity types)"),
            std::string::npos)
      << cursor.err;
  EXPECT_EQ(fetch({"--cursor", "2", "-e", "item", "-q"}).exit_code, 0);

  for (const std::string since : {"2024-1-1", "2024-01-01Z", "", "253402300800000"}) {
    const CommandResult refused = fetch({"--since", since});
    EXPECT_EQ(refused.exit_code, 1) << since;
    EXPECT_NE(refused.err.find("--since"), std::string::npos) << since << ": " << refused.err;
  }
  EXPECT_EQ(fetch({"--since", "253402300799999", "-q"}).exit_code, 0);

  const CommandResult token = fetch({}, {"BACKHAUL_TOKEN=t\n"});
  EXPECT_EQ(token.exit_code, 1);
  EXPECT_NE(token.err.find("the token from environment variable BACKHAUL_TOKEN holds a control "
                           "character"),
            std::string::npos)
      << token.err;
  const CommandResult ca = fetch({"--ca-file", (dir_ / "no-such.pem").string()});
  EXPECT_EQ(ca.exit_code, 1);
  EXPECT_NE(ca.err.find("no-such.pem: No such file or directory"), std::string::npos) << ca.err;
}

// A connection string given as a URL (or as a bare password) was quoted back in the error, with
// its password; and `db migrate` added the store's tables to any SQLite file it was given.
TEST_F(CliTest, DbMigrateQuotesNoConnectionStringAndTakesNoOtherProgramsDatabase) {
  for (const std::string dsn : {"mysql://u:SuperSecret123@127.0.0.1:1/x",
                                "mysql://u:SuperSecret123@127.0.0.1/db?ssl-mode=REQUIRED"}) {
    const CommandResult url = run_command(
        BACKHAUL_CLI_PATH, {"db", "migrate", "--mysql-env", "DSN"}, {"DSN=" + dsn}, dir_);
    EXPECT_EQ(url.exit_code, 1);
    EXPECT_NE(url.err.find("item 1 (not shown: it may hold a password)"), std::string::npos)
        << url.err;
    EXPECT_EQ(url.err.find("SuperSecret123"), std::string::npos) << url.err;
  }

  const std::string other = (dir_ / "other.db").string();
  Poco::Data::SQLite::Connector::registerConnector();
  {
    Poco::Data::Session session("SQLite", other);
    session << "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)", Poco::Data::Keywords::now;
  }
  const CommandResult taken =
      run_command(BACKHAUL_CLI_PATH, {"db", "migrate", "--sqlite", other}, {}, dir_);
  EXPECT_EQ(taken.exit_code, 1);
  EXPECT_NE(
      taken.err.find(other + " is not a backhaul store: it holds tables of its own (notes) and no "
                             "schema_migrations"),
      std::string::npos)
      << taken.err;
  Poco::Data::Session session("SQLite", other);
  int tables = 0;
  session << "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'",
      Poco::Data::Keywords::into(tables), Poco::Data::Keywords::now;
  EXPECT_EQ(tables, 1) << "nothing added";
  std::string journal;
  session << "PRAGMA journal_mode", Poco::Data::Keywords::into(journal), Poco::Data::Keywords::now;
  EXPECT_EQ(journal, "delete") << "not switched to WAL either";
}

// A --plugin-dir that is not there (or is a file) was passed over: the id was then found beside
// the executable, a plugin other than the one asked for, and the command exited 0.
TEST_F(CliTest, APluginDirThatIsNotThereIsRefusedNotPassedOver) {
  for (const std::string& dir : {(dir_ / "no-such-dir").string(), std::string(FAKE_PLUGIN_PATH)}) {
    const CommandResult info =
        run_command(BACKHAUL_CLI_PATH, {"plugin", "info", "github", "--plugin-dir", dir}, {}, dir_);
    EXPECT_EQ(info.exit_code, 1) << dir << ": " << info.out;
    EXPECT_NE(info.err.find("--plugin-dir " + dir + ": "), std::string::npos) << info.err;
  }
  const CommandResult found =
      run_command(BACKHAUL_CLI_PATH,
                  {"plugin", "info", "fake", "--plugin-dir",
                   std::filesystem::path(FAKE_PLUGIN_PATH).parent_path().string()},
                  {}, dir_);
  EXPECT_EQ(found.exit_code, 0) << found.err;
}

// Review: `fetch --gateway` with a --token and no --connection refreshed an expired token from
// the gateway for the connection "" (GET /connections//token). There is none to refresh it from:
// the page fails AUTH_EXPIRED, and the gateway hears nothing of it.
TEST_F(CliTest, FetchWithAGivenTokenDoesNotRefreshItFromTheGateway) {
  ScriptedDaemon gateway({{200, R"({"accessToken":"new"})"}});
  const CommandResult r =
      run_command(BACKHAUL_CLI_PATH,
                  {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t", "--resource-id", "1",
                   "--config", R"({"fail": "auth"})", "--gateway", gateway.url()},
                  {}, dir_);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("token expired"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("refreshing"), std::string::npos) << r.err;
  EXPECT_TRUE(gateway.requests().empty()) << gateway.requests().front();
}

// Review: `plugin info --json` of a plugin whose path is not UTF-8 (a file name is bytes) ended
// in nlohmann's "invalid UTF-8 byte" with exit 1 and nothing on stdout; the text form worked.
TEST_F(CliTest, PluginInfoJsonOfAPathThatIsNotUtf8IsJson) {
  const std::filesystem::path odd = dir_ / "caf\xe9.so";
  std::filesystem::copy_file(FAKE_PLUGIN_PATH, odd);
  const CommandResult info =
      run_command(BACKHAUL_CLI_PATH, {"plugin", "info", odd.string(), "--json"}, {}, dir_);
  EXPECT_EQ(info.exit_code, 0) << info.err;
  const json j = json::parse(info.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << info.out;
  EXPECT_EQ(j["id"], "fake");
  EXPECT_NE(j["path"].get<std::string>().find("caf\xEF\xBF\xBD.so"), std::string::npos)
      << "the byte replaced, the rest kept";
}

// A SIGABRT sent by another process (kill -ABRT) while `fetch` was inside the plugin was reported
// as the plugin's crash. It is said to come from that process, and the command dies of it.
TEST_F(CliTest, ASignalSentByAnotherProcessIsNotBlamedOnThePlugin) {
  ChildProcess fetch(BACKHAUL_CLI_PATH,
                     {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t", "--resource-id", "1",
                      "--config", R"({"fail": "hang"})"},
                     {}, dir_ / "fetch.stderr");
  // Loaded once its sealed copy is mapped; the crash handler is in place before the load.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool loaded = false;
  while (!loaded && std::chrono::steady_clock::now() < deadline) {
    std::ifstream maps("/proc/" + std::to_string(fetch.pid()) + "/maps");
    for (std::string line; !loaded && std::getline(maps, line);) {
      loaded = line.find("fake.so") != std::string::npos;
    }
    if (!loaded) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(loaded) << fetch.stderr_text();
  ASSERT_TRUE(fetch.signal(SIGABRT));
  const int status = fetch.wait_exit(std::chrono::seconds(30));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) << status;
  EXPECT_NE(fetch.stderr_text().find("fetch: killed by SIGABRT (Aborted), sent by process " +
                                     std::to_string(::getpid()) + " (not a crash)"),
            std::string::npos)
      << fetch.stderr_text();
  EXPECT_EQ(fetch.stderr_text().find("crashed"), std::string::npos) << fetch.stderr_text();
}

// A plugin call that never returns held `fetch` for ever (`plugin info` had a watchdog, `fetch`
// none): past --call-timeout-ms it ends with status 1, naming the call.
TEST_F(CliTest, FetchEndsAPluginCallThatNeverReturns) {
  const CommandResult page =
      run_command(BACKHAUL_CLI_PATH,
                  {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t", "--resource-id", "1",
                   "--config", R"({"fail": "hang"})", "--call-timeout-ms", "300"},
                  {}, dir_);
  EXPECT_EQ(page.exit_code, 1) << page.err;
  EXPECT_NE(page.err.find(std::string("fetch: the plugin ") + FAKE_PLUGIN_PATH +
                          " did not return from fetch_page (1 item) within 300 ms "
                          "(--call-timeout-ms); ending"),
            std::string::npos)
      << page.err;
  const std::string waits = std::string(INIT_WAITS_PLUGIN_DIR) + "/init_waits.so";
  const CommandResult init = run_command(BACKHAUL_CLI_PATH,
                                         {"fetch", "--plugin", waits, "--token", "t",
                                          "--resource-id", "1", "--call-timeout-ms", "300"},
                                         {}, dir_);
  EXPECT_EQ(init.exit_code, 1) << init.err;
  EXPECT_NE(init.err.find("did not return from its init() (loading) within 300 ms"),
            std::string::npos)
      << init.err;
}

// A stop signal cuts a retry's wait short (it held the stop for up to --max-wait-s), and a second
// one, of the other kind, ends `fetch` at once (SA_RESETHAND reset only the first's).
TEST_F(CliTest, FetchStopsOutOfAWaitAndASecondSignalOfAnyKindEndsIt) {
  const auto wait_for = [](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done();
  };
  // Every page answers RATE_LIMITED, wait 5 s: 30 retries are 150 s of waiting.
  ChildProcess waiting(
      BACKHAUL_CLI_PATH,
      {"fetch", "--plugin", FAKE_PLUGIN_PATH, "--token", "t", "--resource-id", "1", "--config",
       R"({"fail": "rate_limited"})", "--retries", "30", "--max-wait-s", "86400"},
      {}, dir_ / "waiting.stderr", dir_ / "waiting.stdout");
  ASSERT_TRUE(wait_for([&] {
    return waiting.stderr_text().find("retry 1/30") != std::string::npos;
  })) << waiting.stderr_text();
  ASSERT_TRUE(waiting.signal(SIGINT));
  const int stopped = waiting.wait_exit(std::chrono::seconds(30));
  EXPECT_TRUE(WIFSIGNALED(stopped) && WTERMSIG(stopped) == SIGINT) << stopped;
  EXPECT_NE(waiting.stdout_text().find("1 item: stopped by signal 2 after 0 pages"),
            std::string::npos)
      << waiting.stdout_text();
  EXPECT_NE(waiting.stdout_text().find("stopped_by_signal=2"), std::string::npos)
      << waiting.stdout_text();

  // Inside a plugin call that never returns, the first signal is only noted; the second ends it.
  // The call is the plugin's init(), which creates the marker once it is under way. (The fake's
  // hanging fetch_page would not do: a signal while the plugin is loaded, before its first page,
  // stops the units before they begin, rightly.)
  const std::filesystem::path marker = dir_ / "in-init";
  ChildProcess hanging(BACKHAUL_CLI_PATH,
                       {"fetch", "--plugin", std::string(INIT_WAITS_PLUGIN_DIR) + "/init_waits.so",
                        "--token", "t", "--resource-id", "1"},
                       {"MISBEHAVING_INIT_MARKER=" + marker.string()}, dir_ / "hanging.stderr");
  ASSERT_TRUE(wait_for([&] { return std::filesystem::exists(marker); })) << hanging.stderr_text();
  ASSERT_TRUE(hanging.signal(SIGINT));
  EXPECT_EQ(hanging.wait_exit(std::chrono::seconds(1)), -1) << "still in the plugin call";
  ASSERT_TRUE(hanging.signal(SIGTERM));
  const int ended = hanging.wait_exit(std::chrono::seconds(30));
  EXPECT_TRUE(WIFSIGNALED(ended) && WTERMSIG(ended) == SIGTERM) << ended;
}

// What a terminal shows of `backhaul` as a process: a pseudo-terminal of `columns` columns for
// its stdout and stderr. Returns what was written to it (the terminal's line discipline writes
// "\n" as "\r\n") and the exit status (-1: not a normal exit).
struct TerminalResult {
  int exit_code = -1;
  std::string text;
};
// Runs the CLI on a pseudo-terminal `columns` wide. With `interrupt_after`, types Ctrl-C once the
// terminal has shown that text (the terminal sends the CLI SIGINT, as a user's would).
TerminalResult run_on_terminal(const std::vector<std::string>& args,
                               const std::vector<std::string>& env, unsigned short columns,
                               const std::string& interrupt_after = "") {
  // Built before fork: the child of a threaded process may only exec.
  std::vector<std::string> argv_text = {BACKHAUL_CLI_PATH};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text = env;
  for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  winsize size{};
  size.ws_row = 24;
  size.ws_col = columns;
  int terminal = -1;
  const pid_t pid = ::forkpty(&terminal, nullptr, nullptr, &size);
  if (pid == 0) {
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  TerminalResult result;
  if (pid < 0) return result;
  char chunk[4096];
  // Read until the child's side closes (EIO on Linux); the child exits by itself.
  bool interrupted = interrupt_after.empty();
  // At most 60 s: a CLI that never ends (a Ctrl-C lost) is killed, and the test fails.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd readable{terminal, POLLIN, 0};
    if (::poll(&readable, 1, 100) == 0) continue;
    const ssize_t n = ::read(terminal, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child's side closed (EIO on Linux)
    result.text.append(chunk, static_cast<size_t>(n));
    if (!interrupted && result.text.find(interrupt_after) != std::string::npos) {
      interrupted = ::write(terminal, "\x03", 1) == 1;
    }
  }
  ::kill(pid, SIGKILL);  // gone by now, unless it hung
  ::close(terminal);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // As a shell shows it: 128 + the signal for one that ended by a signal.
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

// Review: an answer nested deeper than any the API gives (a body of 100 000 '[') was parsed, then
// copied (an error's details) or dumped (--json), recursively: the CLI died of a stack overflow
// (SIGSEGV). It is an answer not the API's, refused before parsing, naming the limit.
TEST_F(CliTest, ADeeplyNestedAnswerIsAnUnexpectedAnswerNotACrash) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  ScriptedDaemon page({{200, deep}});
  ScriptedDaemon error(
      {{500, R"({"error": {"code": "X", "message": "m", "details": {"a": )" + deep + "}}}"}});
  for (const ScriptedDaemon* daemon : {&page, &error}) {
    for (const char* what : {"run", "dlq"}) {
      const CommandResult r = run_command(
          BACKHAUL_CLI_PATH, {what, "list", "--json", "--url", daemon->url()}, env, dir_);
      EXPECT_EQ(r.exit_code, 1) << what << ": " << r.err;
      EXPECT_NE(r.err.find("UNEXPECTED_ANSWER: the answer (HTTP "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("levels deep, more than 256 (the depth limit of answers)"),
                std::string::npos)
          << r.err;
      const json envelope = json::parse(r.out, nullptr, false);
      ASSERT_TRUE(envelope.is_object()) << r.out;
      EXPECT_EQ(envelope["error"]["code"], "UNEXPECTED_ANSWER");
      // The daemon answered: its status is there (no status says it did not).
      EXPECT_EQ(envelope["error"]["status"], daemon == &page ? 200 : 500) << r.out;
    }
  }
}

// Review: the daemon's text (a run's status, a unit's or a letter's error, which may quote a
// plugin or a provider, an error envelope's message) reached the terminal as it came: escape
// sequences included, which can retitle the window, clear the screen or forge lines. It is
// escaped (escape_controls) in text output, kept as it came in --json. Also: an envelope without a
// code or message said "UNKNOWN: no message" without the HTTP status; a letter's error was cut
// inside a UTF-8 character; the next-page hint dropped the filters of the list.
TEST_F(CliTest, TheDaemonsTextIsEscapedOnTheTerminal) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  const std::string evil = "\x1b]0;owned\x07\x1b[2J\nforged line";
  const json item = {{"id", 3},
                     {"jobId", 4},
                     {"kind", "kind" + evil},
                     {"concurrencyKey", "key" + evil},
                     {"status", "failed" + evil},
                     {"retries", 1},
                     {"error", std::string(56, 'x') + "\xc3\xa9" + std::string(10, 'y')},
                     {"count", 1},
                     {"request", {{"installationId", "inst" + evil}, {"provider", "gh" + evil}}},
                     {"unitsDone", 1},
                     {"unitsTotal", 2},
                     {"pages", 1},
                     {"eventsDispatched", 1}};
  json answer = item;
  answer["id"] = 7;
  answer["status"] = "failed";  // a status --wait knows as an end
  answer["error"] = "boom" + evil;
  answer["items"] = json::array({item});
  answer["total"] = 1;
  answer["nextBefore"] = 3;
  answer["outcome"] = "cancelled" + evil;
  answer["units"] = json::array({{{"jobId", 4},
                                  {"resourceId", "r" + evil},
                                  {"entityType", "e" + evil},
                                  {"status", "failed" + evil},
                                  {"pages", 1},
                                  {"eventsDispatched", 1},
                                  {"error", "unit" + evil}}});
  ScriptedDaemon daemon({{200, answer.dump()}});
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"run", "status", "7"},
        std::vector<std::string>{"run", "status", "7", "--wait"},
        std::vector<std::string>{"run", "list"}, std::vector<std::string>{"run", "cancel", "7"},
        std::vector<std::string>{"dlq", "list"}, std::vector<std::string>{"dlq", "stats"}}) {
    std::vector<std::string> argv = args;
    argv.insert(argv.end(), {"--url", daemon.url()});
    const CommandResult r = run_command(BACKHAUL_CLI_PATH, argv, env, dir_);
    const std::string what = args[0] + " " + args[1] + (args.size() > 3 ? " --wait" : "");
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << what << ": " << r.out;
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << what << ": " << r.err;
    EXPECT_EQ(r.out.find("\nforged"), std::string::npos) << what << ": " << r.out;
    EXPECT_EQ(r.err.find("\nforged"), std::string::npos) << what << ": " << r.err;
    EXPECT_NE((r.out + r.err).find("\\x1b[2J\\nforged line"), std::string::npos)
        << what << ": " << r.out << r.err;
  }
  const CommandResult letters = run_command(
      BACKHAUL_CLI_PATH, {"dlq", "list", "--kind", "a b", "--limit", "1", "--url", daemon.url()},
      env, dir_);
  EXPECT_TRUE(is_utf8(letters.out)) << letters.out;
  EXPECT_NE(letters.out.find(std::string(56, 'x') + "..."), std::string::npos) << letters.out;
  EXPECT_NE(letters.out.find("more: --kind 'a b' --limit 1 --before 3\n"), std::string::npos)
      << letters.out;
  const CommandResult runs = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "list", "--status", "failed", "--limit", "1", "--url", daemon.url()}, env, dir_);
  EXPECT_NE(runs.out.find("more: --status failed --limit 1 --before 3\n"), std::string::npos)
      << runs.out;
  // In --json, the text as it came (JSON-escaped).
  const CommandResult as_json = run_command(
      BACKHAUL_CLI_PATH, {"run", "status", "7", "--json", "--url", daemon.url()}, env, dir_);
  EXPECT_EQ(json::parse(as_json.out)["error"], "boom" + evil);

  ScriptedDaemon refusing(
      {{404, json{{"error", {{"code", "NOT_FOUND"}, {"message", "gone" + evil}}}}.dump()}});
  const CommandResult refused =
      run_command(BACKHAUL_CLI_PATH, {"run", "cancel", "7", "--url", refusing.url()}, env, dir_);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("error: NOT_FOUND: gone\\x1b]0;owned\\x07\\x1b[2J\\nforged line\n"),
            std::string::npos)
      << refused.err;
  ScriptedDaemon wordless({{500, R"({"error": {"code": 5, "message": null}})"}});
  const CommandResult unknown =
      run_command(BACKHAUL_CLI_PATH, {"run", "cancel", "7", "--url", wordless.url()}, env, dir_);
  EXPECT_NE(unknown.err.find("error: UNKNOWN: no message (HTTP 500)"), std::string::npos)
      << unknown.err;
  // In --json the message is as it came; the status has its own field.
  ScriptedDaemon codeless({{500, R"({"error": {"message": "plain"}})"}});
  const CommandResult codeless_json = run_command(
      BACKHAUL_CLI_PATH, {"run", "cancel", "7", "--json", "--url", codeless.url()}, env, dir_);
  const json envelope = json::parse(codeless_json.out, nullptr, false);
  EXPECT_EQ(envelope["error"]["message"], "plain") << codeless_json.out;
  EXPECT_EQ(envelope["error"]["status"], 500) << codeless_json.out;
  EXPECT_NE(codeless_json.err.find("UNKNOWN: plain (HTTP 500)"), std::string::npos)
      << codeless_json.err;
}

// Review: `dlq retry --all` retries at most --limit (50) letters, and said nothing when it
// reached it: more pending letters stayed behind unsaid. It says so, and still exits 0.
TEST_F(CliTest, RetryAllSaysWhenItReachedTheLimit) {
  start();
  for (const char* key : {"inst-1", "inst-2", "inst-3"})
    make_dead_letter("kind.a", key, "FATAL: x");
  const CommandResult limited = cli({"dlq", "retry", "--all", "--limit", "2"});
  ASSERT_EQ(limited.exit_code, 0) << limited.err;
  EXPECT_NE(limited.out.find("retried 2 dead letters\nthe limit of 2 was reached: more dead "
                             "letters may match; run again, or give a larger --limit\n"),
            std::string::npos)
      << limited.out;
  const CommandResult rest = cli({"dlq", "retry", "--all", "--limit", "2", "--json"});
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_EQ(json::parse(rest.out)["retried"], 1);
  EXPECT_EQ(rest.err.find("limit"), std::string::npos) << rest.err;
}

// Review: output that could not be written (a full disk: /dev/full) was dropped without a word,
// and the command exited 0, as if a script had got an empty list.
TEST_F(CliTest, OutputThatCannotBeWrittenFailsTheCommand) {
  start();
  const std::string url = "http://127.0.0.1:" + std::to_string(daemon_->port());
  const std::vector<std::vector<std::string>> commands = {
      {"run", "list", "--json", "--url", url},
      {"run", "list", "--url", url},
      {"dlq", "stats", "--url", url},
      {"db", "migrate", "--sqlite", (dir_ / "full.db").string()},
      {"plugin", "info", FAKE_PLUGIN_PATH},
      {"run", "list", "--help"},
      // A command that failed (run 999 is not found), whose --json envelope was not written.
      {"run", "status", "999", "--json", "--url", url}};
  for (const std::vector<std::string>& args : commands) {
    ChildProcess full(BACKHAUL_CLI_PATH, args, {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken},
                      dir_ / "full.stderr", "/dev/full");
    const int status = full.wait_exit(std::chrono::seconds(60));
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 1) << args[0] << " " << args[1] << ": " << full.stderr_text();
    EXPECT_NE(full.stderr_text().find("error: writing the output: No space left on device"),
              std::string::npos)
        << full.stderr_text();
  }
}

// Review: on a terminal, --wait's progress line (redrawn in place) was not ended when the wait
// ended with an error after it was drawn: "…, ETA --error: UNAUTHORIZED: …" on one line. And a
// line wider than the terminal wrapped, so that each redraw left another line behind.
TEST_F(CliTest, RunWaitOnATerminalEndsItsLineAndFitsTheWidth) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  ScriptedDaemon refusing(
      {ScriptedDaemon::run("running"), ScriptedDaemon::error(401, "UNAUTHORIZED")});
  const TerminalResult r = run_on_terminal(
      {"run", "status", "7", "--wait", "--interval-ms", "50", "--url", refusing.url()}, env, 40);
  EXPECT_EQ(r.exit_code, 1) << r.text;
  EXPECT_NE(r.text.find("\r\nerror: UNAUTHORIZED: from the script"), std::string::npos) << r.text;
  // Every redraw fits in 39 columns (one short of the last, where some terminals wrap).
  size_t drawn = 0;
  for (size_t at = r.text.find("\r\x1b[K"); at != std::string::npos;
       at = r.text.find("\r\x1b[K", at + 1)) {
    const size_t from = at + 4;
    const size_t to = r.text.find_first_of("\r\n", from);
    EXPECT_LE(r.text.substr(from, to - from).size(), 39u) << r.text.substr(from, to - from);
    ++drawn;
  }
  EXPECT_GE(drawn, 1u) << r.text;
}

// Ctrl-C during --wait killed the command mid-line: the shell's prompt came after the progress,
// and nothing said the run goes on. It ends the line, says how to take the wait up again, and
// then ends by SIGINT, as a command ended by Ctrl-C does (130 in a shell).
TEST_F(CliTest, CtrlCDuringRunWaitEndsTheLineAndSaysTheRunGoesOn) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  ScriptedDaemon running({ScriptedDaemon::run("running")});
  const TerminalResult r = run_on_terminal(
      {"run", "status", "7", "--wait", "--interval-ms", "50", "--url", running.url()}, env, 200,
      "run 7 running");
  EXPECT_EQ(r.exit_code, 130) << r.text;
  EXPECT_NE(r.text.find("\r\nrun 7: interrupted (Ctrl-C); the run goes on without this command: "
                        "`backhaul run status 7 --wait` takes it up again"),
            std::string::npos)
      << r.text;
  // The same with --json: an envelope on stdout, for a script that reads it.
  const TerminalResult j = run_on_terminal(
      {"run", "status", "7", "--wait", "--json", "--interval-ms", "50", "--url", running.url()},
      env, 200, "run 7 running");
  EXPECT_EQ(j.exit_code, 130) << j.text;
  EXPECT_NE(j.text.find("\"code\": \"INTERRUPTED\""), std::string::npos) << j.text;
  EXPECT_NE(j.text.find("\"runId\": 7"), std::string::npos) << j.text;
}

// Review: --wait passed through every 5xx, also one whose envelope says `"retryable": false` (a
// store refusing the request itself), which then answered every poll alike until
// --lost-contact-ms (5 minutes). It ends the wait at once.
TEST_F(CliTest, RunWaitEndsAtA5xxMarkedNotRetryable) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  ScriptedDaemon daemon(
      {ScriptedDaemon::run("running"),
       {500,
        json{{"error", {{"code", "STORAGE_ERROR"}, {"message", "refused"}, {"retryable", false}}}}
            .dump()},
       ScriptedDaemon::run("succeeded")});
  const CommandResult r = run_command(
      BACKHAUL_CLI_PATH,
      {"run", "status", "7", "--wait", "--interval-ms", "50", "--url", daemon.url()}, env, dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("error: STORAGE_ERROR: refused"), std::string::npos) << r.err;
  EXPECT_EQ(daemon.requests().size(), 2u);
}

// Review: `dlq retry` with neither an id nor --all (or with --limit alone) exited 1, as an error
// of the daemon does; it is a usage error, with the parser's status as the others (105).
TEST_F(CliTest, RetryWithoutAnIdOrAllIsAUsageError) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"dlq", "retry"},
        std::vector<std::string>{"dlq", "retry", "--limit", "5"}}) {
    const CommandResult r = run_command(BACKHAUL_CLI_PATH, args, {"BACKHAUL_ADMIN_TOKEN="}, dir_);
    EXPECT_EQ(r.exit_code, 105) << r.err;
    EXPECT_NE(r.err.find("dlq retry: give a dead letter ID, or --all (with filters and --limit)"),
              std::string::npos)
        << r.err;
  }
  // So is an empty --token-env, which named an empty variable as not set.
  const CommandResult empty =
      run_command(BACKHAUL_CLI_PATH,
                  {"dlq", "stats", "--token-env", "", "--url", "http://127.0.0.1:1"}, {}, dir_);
  EXPECT_GE(empty.exit_code, 100) << empty.err;
  EXPECT_NE(empty.err.find("--token-env"), std::string::npos) << empty.err;
}

// Review: counts read as int (value()'s type is its default's, `0`): 5000000000 units showed as
// 705032704; and a client clock behind the daemon's showed a negative ETA.
TEST_F(CliTest, LargeCountsAreShownAsTheyAreAndTheEtaIsNotNegative) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  const json run = {
      {"id", 7},
      {"status", "running"},
      {"unitsTotal", 5'000'000'000LL},
      {"unitsDone", 4'000'000'000LL},
      {"unitsFailed", 3'000'000'000LL},
      {"startedMs", 4'102'444'800'000LL},  // 2100: the daemon's clock ahead of this one
      {"retries", 3'000'000'000LL},
      {"items", json::array({{{"id", 7},
                              {"jobId", 8},
                              {"kind", "k"},
                              {"concurrencyKey", "c"},
                              {"status", "running"},
                              {"retries", 3'000'000'000LL},
                              {"request", {{"installationId", "i"}, {"provider", "p"}}},
                              {"unitsDone", 4'000'000'000LL},
                              {"unitsTotal", 5'000'000'000LL},
                              {"pages", 1},
                              {"eventsDispatched", 1}}})},
      {"retried", 5'000'000'000LL}};
  ScriptedDaemon daemon({{200, run.dump()}});
  const auto command = [&](std::vector<std::string> args) {
    args.insert(args.end(), {"--url", daemon.url()});
    return run_command(BACKHAUL_CLI_PATH, args, env, dir_);
  };
  const CommandResult status = command({"run", "status", "7"});
  EXPECT_NE(status.out.find("units 4000000000/5000000000 (3000000000 failed)"), std::string::npos)
      << status.out;
  EXPECT_NE(status.out.find("ETA 0m00s"), std::string::npos) << status.out;
  const CommandResult list = command({"run", "list"});
  EXPECT_NE(list.out.find("4000000000/5000000000"), std::string::npos) << list.out;
  const CommandResult letters = command({"dlq", "list"});
  EXPECT_NE(letters.out.find(" 3000000000 "), std::string::npos) << letters.out;
  const CommandResult retried = command({"dlq", "retry", "--all"});
  EXPECT_NE(retried.out.find("retried 5000000000 dead letters"), std::string::npos)
      << retried.out << retried.err;
}

// Review: BACKHAUL_URL's password was printed by --help (as --url's default), and a URL ending in
// a bare '?' or '#' was taken (Poco drops them), the '?' then sent in every request's path. Both
// are refused, naming the problem, the password not repeated.
TEST_F(CliTest, AUrlWithUserInfoOrABareQueryOrFragmentIsRefused) {
  const std::string secret_url = "BACKHAUL_URL=http://admin:hunter2@127.0.0.1:1";
  const CommandResult help =
      run_command(BACKHAUL_CLI_PATH, {"run", "list", "--help"}, {secret_url}, dir_);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--url"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("hunter2"), std::string::npos) << help.out;
  const CommandResult used =
      run_command(BACKHAUL_CLI_PATH, {"run", "list"},
                  {secret_url, std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_);
  EXPECT_EQ(used.exit_code, 1);
  EXPECT_NE(used.err.find("--url (or BACKHAUL_URL): 'http://[REDACTED]@127.0.0.1:1' holds user "
                          "info (user:password@), which the admin API does not read"),
            std::string::npos)
      << used.err;
  EXPECT_EQ(used.err.find("hunter2"), std::string::npos) << used.err;
  for (const std::string url : {"http://127.0.0.1:1/?", "http://127.0.0.1:1#", "http://h/a?#"}) {
    const CommandResult bare = run_command(BACKHAUL_CLI_PATH, {"run", "list", "--url", url},
                                           {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_);
    EXPECT_EQ(bare.exit_code, 1) << url;
    EXPECT_NE(bare.err.find("'" + url + "' has a query or fragment ('?' or '#')"),
              std::string::npos)
        << bare.err;
  }
}

// Review: a --sqlite path mistyped made a new, empty store, and the command printed the same line
// as for an upgrade (the version). It says what it did: created, migrated or found current.
TEST_F(CliTest, DbMigrateSqliteSaysWhetherItCreatedTheStore) {
  const std::string db = (dir_ / "migrated.db").string();
  CommandResult migrate =
      run_command(BACKHAUL_CLI_PATH, {"db", "migrate", "--sqlite", db}, {}, dir_);
  ASSERT_EQ(migrate.exit_code, 0) << migrate.err;
  const int version = jobs::open_sqlite_store(db)->migrate();
  EXPECT_GE(version, 1);
  const std::string v = std::to_string(version);
  EXPECT_EQ(migrate.out,
            "sqlite store " + db + ": created a new store at schema version " + v + "\n");
  const CommandResult again =
      run_command(BACKHAUL_CLI_PATH, {"db", "migrate", "--sqlite", db}, {}, dir_);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "sqlite store " + db + ": already at schema version " + v + "\n");
  CommandResult neither = run_command(BACKHAUL_CLI_PATH, {"db", "migrate"}, {}, dir_);
  EXPECT_NE(neither.exit_code, 0);
}

}  // namespace
}  // namespace backhaul::daemon::testing
