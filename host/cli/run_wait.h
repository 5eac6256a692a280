// `run start|status --wait`: polling a run until it finishes, through a daemon that restarts or is
// briefly unable to answer. The loop reads time through a Clock and waits through a function it
// is given, so its limits are tested without sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "host/cli/admin_client.h"

namespace backhaul {
class Clock;
}

namespace backhaul::cli {

// The exit status of `--wait` when backhauld stopped answering for longer than --lost-contact-ms:
// the run's outcome is unknown, and it goes on without the command.
inline constexpr int kExitLostContact = 3;

struct WaitSettings {
  std::chrono::milliseconds interval{1000};         // between two polls
  std::chrono::milliseconds lost_contact{300'000};  // how long polls may fail in a row
};

// An error a poll may pass through: no answer (a daemon restarting), 429, or a 5xx (a daemon
// draining, or its store away) unless its envelope says `"retryable": false`. Anything else (a
// wrong token, a run not found, an answer that is not the API's, a store error the same request
// would meet again) ends the wait.
bool passing_trouble(const AdminApiError& error);

struct WaitEnd {
  bool lost_contact = false;  // else the run finished, or the wait was interrupted
  int interrupted = 0;        // the signal that interrupted the wait (SIGINT: Ctrl-C), or 0
  nlohmann::json run;         // the last answer (null if none)
  std::string error;          // with lost_contact: the last poll's error
  int64_t trouble_ms = 0;     // with lost_contact: how long polls failed in a row
};

struct WaitHooks {
  std::function<nlohmann::json()> poll;  // GET of the run; throws AdminApiError
  std::function<void(std::chrono::milliseconds)> pause;
  std::function<void(const nlohmann::json& run)> on_run;  // every answer
  // A poll that failed with passing trouble; `left_ms` is how long polls may still fail.
  std::function<void(const AdminApiError& error, int64_t left_ms)> on_trouble;
  // The signal that asked the wait to end (Ctrl-C), or 0; asked before every poll. May be empty.
  std::function<int()> interrupted;
};

// Polls until the run's status is succeeded, failed or cancelled, until polls have failed with
// passing trouble for settings.lost_contact, or until hooks.interrupted() says a signal came.
// Before a first answer (`in_contact` false: nothing has shown that --url is a daemon), every error
// ends the wait at once. Errors that end it are rethrown.
WaitEnd poll_until_finished(const WaitHooks& hooks, const WaitSettings& settings,
                            const Clock& clock, bool in_contact);

// True for the statuses a run ends in.
bool run_finished(const std::string& status);

}  // namespace backhaul::cli
