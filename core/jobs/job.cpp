#include "core/jobs/job.h"

#include <array>
#include <utility>

#include "core/jobs/job_store.h"

namespace backhaul::jobs {
namespace {

constexpr std::array<std::pair<JobStatus, std::string_view>, 6> kJobStatuses = {{
    {JobStatus::kQueued, "queued"},
    {JobStatus::kRunning, "running"},
    {JobStatus::kWaiting, "waiting"},
    {JobStatus::kSucceeded, "succeeded"},
    {JobStatus::kDead, "dead"},
    {JobStatus::kCancelled, "cancelled"},
}};

constexpr std::array<std::pair<DeadLetterStatus, std::string_view>, 4> kLetterStatuses = {{
    {DeadLetterStatus::kPending, "pending"},
    {DeadLetterStatus::kRetrying, "retrying"},
    {DeadLetterStatus::kResolved, "resolved"},
    {DeadLetterStatus::kIgnored, "ignored"},
}};

}  // namespace

std::string_view to_string(JobStatus status) {
  for (const auto& [s, name] : kJobStatuses) {
    if (s == status) return name;
  }
  return "unknown";
}

std::optional<JobStatus> parse_job_status(std::string_view text) {
  for (const auto& [s, name] : kJobStatuses) {
    if (name == text) return s;
  }
  return std::nullopt;
}

std::string_view to_string(DeadLetterStatus status) {
  for (const auto& [s, name] : kLetterStatuses) {
    if (s == status) return name;
  }
  return "unknown";
}

std::optional<DeadLetterStatus> parse_dead_letter_status(std::string_view text) {
  for (const auto& [s, name] : kLetterStatuses) {
    if (name == text) return s;
  }
  return std::nullopt;
}

}  // namespace backhaul::jobs
