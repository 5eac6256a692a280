#include "host/cli/run_wait.h"

#include "core/common/clock.h"

namespace backhaul::cli {

bool run_finished(const std::string& status) {
  return status == "succeeded" || status == "failed" || status == "cancelled";
}

bool passing_trouble(const AdminApiError& error) {
  if (error.code() == "UNREACHABLE" || error.status() == 429) return true;
  // A 5xx the daemon marked not retryable (a store refusing the request itself) would answer
  // every poll alike; one without the mark (a proxy's 502, no envelope) may pass.
  return error.status() >= 500 && error.status() < 600 && error.retryable().value_or(true);
}

WaitEnd poll_until_finished(const WaitHooks& hooks, const WaitSettings& settings,
                            const Clock& clock, bool in_contact) {
  WaitEnd end;
  int64_t trouble_since = -1;
  while (true) {
    if (hooks.interrupted) {
      if (const int signal = hooks.interrupted(); signal != 0) {
        end.interrupted = signal;
        return end;
      }
    }
    // A streak of failures counts from when its first poll began: a poll that runs into its
    // request timeout has been without contact all that time.
    const int64_t asked = clock.now_ms();
    try {
      end.run = hooks.poll();
    } catch (const AdminApiError& e) {
      if (!in_contact || !passing_trouble(e)) throw;
      const int64_t now = clock.now_ms();
      if (trouble_since < 0) trouble_since = asked;
      const int64_t left = settings.lost_contact.count() - (now - trouble_since);
      if (left <= 0) {
        end.lost_contact = true;
        end.error = e.what();
        end.trouble_ms = now - trouble_since;
        return end;
      }
      hooks.on_trouble(e, left);
      hooks.pause(std::min(settings.interval, std::chrono::milliseconds(left)));
      continue;
    }
    in_contact = true;
    trouble_since = -1;
    hooks.on_run(end.run);
    if (run_finished(end.run.value("status", ""))) return end;
    hooks.pause(settings.interval);
  }
}

}  // namespace backhaul::cli
