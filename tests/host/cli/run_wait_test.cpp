// `--wait`'s polling (host/cli/run_wait.h) with a fake clock: which errors it passes through, for
// how long, and what ends it. The pause moves the clock instead of sleeping.
#include "host/cli/run_wait.h"

#include <csignal>
#include <deque>
#include <variant>

#include <gtest/gtest.h>

#include "core/common/clock.h"

namespace backhaul::cli {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

json run_in(const std::string& status) { return {{"id", 7}, {"status", status}}; }
AdminApiError no_answer() {
  return AdminApiError(0, "UNREACHABLE", "no answer from backhauld at http://127.0.0.1:1");
}
AdminApiError answer(int status, const std::string& code) {
  return AdminApiError(status, code, "from the test");
}

// Answers the polls from a script (its last entry repeats); every poll takes `poll_ms` of the
// fake clock, and every pause the time asked.
class Script {
 public:
  using Step = std::variant<json, AdminApiError>;

  Script(std::deque<Step> steps, int64_t poll_ms = 0)
      : steps_(std::move(steps)), poll_ms_(poll_ms) {}

  WaitEnd wait(const WaitSettings& settings, bool in_contact = true) {
    WaitHooks hooks;
    if (interrupt_at_poll > 0) {
      hooks.interrupted = [this] { return polls >= interrupt_at_poll ? SIGINT : 0; };
    }
    hooks.poll = [this] {
      ++polls;
      clock.advance_ms(poll_ms_);
      const Step step = steps_.front();
      if (steps_.size() > 1) steps_.pop_front();
      if (const auto* error = std::get_if<AdminApiError>(&step)) throw *error;
      return std::get<json>(step);
    };
    hooks.pause = [this](milliseconds ms) {
      pauses.push_back(ms.count());
      clock.advance_ms(ms.count());
    };
    hooks.on_run = [this](const json& run) { runs.push_back(run.at("status")); };
    hooks.on_trouble = [this](const AdminApiError& e, int64_t left_ms) {
      troubles.push_back(e.code());
      lefts.push_back(left_ms);
    };
    return poll_until_finished(hooks, settings, clock, in_contact);
  }

  FakeClock clock;
  int interrupt_at_poll = 0;  // > 0: a signal comes during that poll
  int polls = 0;
  std::vector<int64_t> pauses;
  std::vector<std::string> runs;
  std::vector<std::string> troubles;
  std::vector<int64_t> lefts;

 private:
  std::deque<Step> steps_;
  int64_t poll_ms_;
};

TEST(RunWaitTest, NoAnswerA503AndA429ArePassedThroughUntilTheRunFinishes) {
  Script script({run_in("running"), no_answer(), answer(503, "UNAVAILABLE"),
                 answer(429, "RATE_LIMITED"), run_in("running"), run_in("succeeded")});
  const WaitEnd end = script.wait({milliseconds(1000), milliseconds(10'000)});
  EXPECT_FALSE(end.lost_contact);
  EXPECT_EQ(end.run.at("status"), "succeeded");
  EXPECT_EQ(script.polls, 6);
  EXPECT_EQ(script.runs, (std::vector<std::string>{"running", "running", "succeeded"}));
  EXPECT_EQ(script.troubles,
            (std::vector<std::string>{"UNREACHABLE", "UNAVAILABLE", "RATE_LIMITED"}));
  // The limit counts from the first failure of the streak.
  EXPECT_EQ(script.lefts, (std::vector<int64_t>{10'000, 9'000, 8'000}));
  EXPECT_EQ(script.pauses, (std::vector<int64_t>{1000, 1000, 1000, 1000, 1000}));
}

// A signal (Ctrl-C) ends the wait before the next poll, with the last answer, whether polls were
// answered or failing.
TEST(RunWaitTest, ASignalEndsTheWaitBeforeTheNextPoll) {
  Script answered({run_in("running")});
  answered.interrupt_at_poll = 3;
  WaitEnd end = answered.wait({milliseconds(1000), milliseconds(10'000)});
  EXPECT_EQ(end.interrupted, SIGINT);
  EXPECT_FALSE(end.lost_contact);
  EXPECT_EQ(end.run.at("status"), "running");
  EXPECT_EQ(answered.polls, 3);

  Script failing({run_in("running"), no_answer()});
  failing.interrupt_at_poll = 2;
  end = failing.wait({milliseconds(1000), milliseconds(10'000)});
  EXPECT_EQ(end.interrupted, SIGINT);
  EXPECT_FALSE(end.lost_contact);
  EXPECT_EQ(failing.polls, 2);
  EXPECT_EQ(failing.troubles, std::vector<std::string>{"UNREACHABLE"});
}

TEST(RunWaitTest, PollsFailingForTheWholeLimitEndInLostContactWithTheLastError) {
  Script script({run_in("running"), answer(502, "BAD_GATEWAY"), no_answer()});
  const WaitEnd end = script.wait({milliseconds(1000), milliseconds(5'500)});
  ASSERT_TRUE(end.lost_contact);
  EXPECT_EQ(end.run.at("status"), "running") << "the last answer";
  EXPECT_EQ(end.error, "UNREACHABLE: no answer from backhauld at http://127.0.0.1:1");
  EXPECT_EQ(end.trouble_ms, 5'500);
  // Failures at 0, 1, 2, 3, 4 and 5 s of the streak, a last pause of 0.5 s, a last poll at 5.5 s.
  EXPECT_EQ(script.polls, 1 + 7);
  EXPECT_EQ(script.lefts, (std::vector<int64_t>{5'500, 4'500, 3'500, 2'500, 1'500, 500}));
  EXPECT_EQ(script.pauses.back(), 500);
}

TEST(RunWaitTest, AnAnswerStartsTheLimitAgain) {
  // 4 s of failures, an answer, 4 s of failures, an answer: under a limit of 5 s each time.
  std::deque<Script::Step> steps = {run_in("running")};
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 5; ++i) steps.push_back(answer(503, "STORAGE_ERROR"));
    steps.push_back(run_in(round == 0 ? "running" : "failed"));
  }
  Script script(steps);
  const WaitEnd end = script.wait({milliseconds(1000), milliseconds(5'000)});
  EXPECT_FALSE(end.lost_contact);
  EXPECT_EQ(end.run.at("status"), "failed");
  EXPECT_EQ(script.lefts, (std::vector<int64_t>{5'000, 4'000, 3'000, 2'000, 1'000, 5'000, 4'000,
                                                3'000, 2'000, 1'000}));
}

TEST(RunWaitTest, SlowFailingPollsCountTowardsTheLimitFromWhenTheFirstBegan) {
  // Each poll runs into its 30 s request timeout: the streak began when the first poll did.
  // Counted from its failure, the command gave up a whole timeout late (92 s for a limit of 60).
  Script script({no_answer()}, /*poll_ms=*/30'000);
  const WaitEnd end = script.wait({milliseconds(1000), milliseconds(60'000)});
  ASSERT_TRUE(end.lost_contact);
  EXPECT_EQ(script.polls, 2);
  EXPECT_EQ(end.trouble_ms, 61'000);
  EXPECT_EQ(script.lefts, (std::vector<int64_t>{30'000}));
}

TEST(RunWaitTest, AZeroLimitGivesUpAtTheFirstFailure) {
  Script script({run_in("queued"), no_answer()});
  const WaitEnd end = script.wait({milliseconds(1000), milliseconds(0)});
  EXPECT_TRUE(end.lost_contact);
  EXPECT_EQ(script.polls, 2);
  EXPECT_TRUE(script.troubles.empty());
}

TEST(RunWaitTest, AWrongTokenAMissingRunOrAnAnswerNotTheApisEndsTheWaitAtOnce) {
  for (const AdminApiError& fatal :
       {answer(401, "UNAUTHORIZED"), answer(404, "RUN_NOT_FOUND"), answer(400, "VALIDATION_ERROR"),
        AdminApiError(0, "UNEXPECTED_ANSWER", "status not found")}) {
    Script script({run_in("running"), fatal});
    try {
      script.wait({milliseconds(1000), milliseconds(300'000)});
      ADD_FAILURE() << fatal.what() << " was passed through";
    } catch (const AdminApiError& e) {
      EXPECT_EQ(e.code(), fatal.code());
    }
    EXPECT_EQ(script.polls, 2) << fatal.what();
    EXPECT_TRUE(script.troubles.empty()) << fatal.what();
  }
}

// Before a first answer nothing shows that --url is a daemon: a wrong URL must not keep the
// command polling for minutes.
TEST(RunWaitTest, BeforeAFirstAnswerEveryErrorEndsTheWait) {
  for (const AdminApiError& first : {no_answer(), answer(503, "UNAVAILABLE")}) {
    Script script({first, run_in("succeeded")});
    EXPECT_THROW(script.wait({milliseconds(1000), milliseconds(300'000)}, /*in_contact=*/false),
                 AdminApiError)
        << first.what();
    EXPECT_EQ(script.polls, 1);
  }
  Script answered({run_in("running"), no_answer(), run_in("cancelled")});
  const WaitEnd end = answered.wait({milliseconds(1000), milliseconds(300'000)}, false);
  EXPECT_EQ(end.run.at("status"), "cancelled");
  EXPECT_EQ(answered.troubles, (std::vector<std::string>{"UNREACHABLE"}));
}

TEST(RunWaitTest, OnlyNoAnswer429And5xxArePassing) {
  EXPECT_TRUE(passing_trouble(no_answer()));
  EXPECT_TRUE(passing_trouble(answer(429, "RATE_LIMITED")));
  EXPECT_TRUE(passing_trouble(answer(500, "INTERNAL")));
  EXPECT_TRUE(passing_trouble(answer(599, "X")));
  EXPECT_FALSE(passing_trouble(answer(600, "X")));
  EXPECT_FALSE(passing_trouble(answer(499, "X")));
  EXPECT_FALSE(passing_trouble(answer(403, "FORBIDDEN")));
  EXPECT_FALSE(passing_trouble(AdminApiError(0, "UNEXPECTED_ANSWER", "x")));
}

// Review: a 5xx whose envelope says `"retryable": false` (a store refusing the request itself)
// was passed through like the others, until --lost-contact-ms. Only the envelope's false ends the
// wait: true, or no envelope (a proxy's 502), passes; a 429 passes whatever it says.
TEST(RunWaitTest, A5xxMarkedNotRetryableIsNotPassing) {
  EXPECT_FALSE(passing_trouble(AdminApiError(500, "STORAGE_ERROR", "x", nullptr, false)));
  EXPECT_FALSE(passing_trouble(AdminApiError(503, "UNAVAILABLE", "x", nullptr, false)));
  EXPECT_TRUE(passing_trouble(AdminApiError(503, "STORAGE_ERROR", "x", nullptr, true)));
  EXPECT_TRUE(passing_trouble(AdminApiError(502, "UNKNOWN", "x")));
  EXPECT_TRUE(passing_trouble(AdminApiError(429, "RATE_LIMITED", "x", nullptr, false)));
  Script script({run_in("running"), AdminApiError(500, "STORAGE_ERROR", "x", nullptr, false),
                 run_in("succeeded")});
  EXPECT_THROW(script.wait({milliseconds(10), milliseconds(60'000)}), AdminApiError);
  EXPECT_EQ(script.polls, 2);
}

}  // namespace
}  // namespace backhaul::cli
