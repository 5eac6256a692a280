// Internal to core/validate: the check table and what checks share. A check runs in the parent;
// whenever it needs plugin code it asks its CheckContext for a child process.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/errors.h"
#include "core/validate/elf_inspect.h"
#include "core/validate/fault_transport.h"
#include "core/validate/fixtures.h"
#include "core/validate/isolation.h"
#include "core/validate/plugin_driver.h"
#include "core/validate/report.h"
#include "core/validate/validator.h"
#include <pthread.h>

namespace backhaul::validate {

// The fake host clock starts here in every child: a whole second, so that a rate-limit reset in
// epoch seconds converts to an exact wait, and years away from the real time, so that a plugin
// that reads the system clock instead of host->now_ms() gets visibly wrong waits.
inline constexpr int64_t kValidationEpochMs = 1'700'000'000'000;
// The access token every unit carries; no message may ever contain it.
inline constexpr const char* kAccessToken = "bhv_validate_token_4f9c2d7e1a8b6035";
inline constexpr const char* kDefaultInstallationId = "validate";
inline constexpr const char* kDefaultResourceId = "1296269";
inline constexpr const char* kDefaultResourceName = "backhaul-validate/example";
inline constexpr size_t kDefaultMaxPages = 100;

struct Verdict {
  CheckStatus status = CheckStatus::kPass;
  std::string reason;
};
inline Verdict pass(std::string note = {}) { return {CheckStatus::kPass, std::move(note)}; }
inline Verdict fail(std::string reason) { return {CheckStatus::kFail, std::move(reason)}; }
inline Verdict skip(std::string reason) { return {CheckStatus::kSkip, std::move(reason)}; }

// The stack of each of `threads` threads of the concurrency checks: what a thread gets by default
// (RLIMIT_STACK's, 8 MiB usually, or 2 MiB when unlimited: as the daemon's threads calling plugins
// have), unless that many would take more than a quarter of the address space this process may
// use (RLIMIT_AS: the validator's --memory-limit-mb in its child). Then each gets its share of that
// quarter, and at least kMinWorkerStackBytes (or the usual, if less): plugin code runs on them.
// --threads 256 on default stacks needed 2 GiB for stacks alone, all of the default limit, and the
// check failed for a thread it could not start.
inline constexpr size_t kMinWorkerStackBytes = size_t{1} << 20;
size_t worker_stack_bytes(int threads);

// A thread with a stack of `stack_bytes`, joined by join() or on destruction. Move-only.
class WorkerThread {
 public:
  // Starts `run`; throws std::system_error when the thread cannot be started.
  explicit WorkerThread(std::function<void()> run, size_t stack_bytes = kMinWorkerStackBytes);
  WorkerThread(WorkerThread&& other) noexcept;
  WorkerThread& operator=(WorkerThread&&) = delete;
  WorkerThread(const WorkerThread&) = delete;
  ~WorkerThread();
  void join();

 private:
  std::unique_ptr<std::function<void()>> run_;  // owned here: the thread reads it until it ends
  pthread_t thread_{};
  bool joinable_ = false;
};

// Runs `body(k)` for k in [0, threads) on that many threads at once and joins them all. Returns
// the first problem a thread reported (what `body` returned, or threw), "" if none; or, when the
// validator could not start them all (a thread limit, the address space its child runs in), says
// so, blaming the validator's options rather than the plugin: it never ends in std::terminate.
// `start` starts one thread (WorkerThread's constructor; a test's may throw as it would).
using ThreadStarter = std::function<WorkerThread(std::function<void()>)>;
std::string on_threads(int threads, const std::function<std::string(int)>& body,
                       const ThreadStarter& start = {});

// A child process did not return a result (crash, timeout, exit, an exception such as
// AbiViolation). The check fails with what().
class ChildFailure : public Error {
 public:
  using Error::Error;
};

// What the checks drive: flags, then validate.json, then the descriptor's defaults.
struct Target {
  std::filesystem::path plugin_path;
  UnitSpec unit;
  std::vector<std::string> entity_types;
  std::string config_json;
  int64_t since_unix_ms = 0;
  size_t max_pages = kDefaultMaxPages;

  FetchSpec first_page(const std::string& entity_type) const {
    return {unit, entity_type, since_unix_ms, std::nullopt};
  }
};

// --- a walk through every page of one entity type -------------------------------------------

enum class WalkEnd {
  kLastPage = 1,  // a page without next_cursor
  kPageLimit,     // max_pages pages and still a next cursor
  kStuckCursor,   // next_cursor equal to the cursor that was asked for
  kCursorCycle,   // next_cursor equal to an earlier one
  kError,         // a call did not return OK
};

struct WalkStep {
  std::optional<std::string> cursor;  // what was asked for (nullopt: the first page)
  PageFacts page;
};

struct Walk {
  std::string entity_type;
  std::vector<WalkStep> steps;
  WalkEnd end = WalkEnd::kLastPage;
  std::string error;  // kError: which page and what the plugin said
};

// Child side: fetches from the first page until one of the WalkEnd conditions.
Walk walk_entity(const PluginDriver& driver, backhaul_instance_t* instance, const Target& target,
                 const std::string& entity_type);
Walk walk_entity(const PluginDriver& driver, backhaul_instance_t* instance, const Target& target,
                 const std::string& entity_type, const FixtureTransport& transport);
nlohmann::json walks_to_json(const std::vector<Walk>& walks);
std::vector<Walk> walks_from_json(const nlohmann::json& j);
nlohmann::json page_to_json(const PageFacts& page);
PageFacts page_from_json(const nlohmann::json& j);

// --- the context a check runs in ---------------------------------------------------------------

class CheckContext {
 public:
  using ChildBody = std::function<nlohmann::json()>;
  using FixtureBody = std::function<nlohmann::json(const PluginDriver&, FixtureTransport&)>;
  using FaultBody = std::function<nlohmann::json(const PluginDriver&, FaultTransport&)>;

  CheckContext(const ValidateOptions& options, std::optional<Fixtures> fixtures);

  const ValidateOptions& options() const { return options_; }
  const Fixtures* fixtures() const { return fixtures_ ? &*fixtures_ : nullptr; }
  ChildLimits limits() const { return {options_.timeout, options_.memory_limit_bytes}; }

  // Runs `body` in a forked child and returns what it returned. Throws ChildFailure saying how
  // the child ended otherwise.
  nlohmann::json in_child(const ChildBody& body) const;
  // The same, with the plugin loaded over the fixtures (requires fixtures()), and what it logs
  // watched for kAccessToken (PluginDriver::logged_secret()).
  nlohmann::json with_fixtures(const FixtureBody& body) const;
  // The same, with the plugin loaded over a FaultTransport answering `fault`.
  nlohmann::json with_fault(Fault fault, const FaultBody& body) const;

  // Computes `compute` once per key; later calls return the same JSON or rethrow the same
  // ChildFailure. Lets several checks judge one child's observations.
  const nlohmann::json& shared(const std::string& key,
                               const std::function<nlohmann::json()>& compute);

  // Memoized observations.
  const ElfFacts& elf();
  const nlohmann::json& entry_facts();  // read in a child without calling init(); may throw
  const Target& target();               // resolved on first use (needs plugin_info())
  const std::vector<Walk>& baseline();  // every target entity type over the fixtures
  // The first line the plugin logged in the baseline's child that holds kAccessToken.
  const std::optional<std::string>& baseline_logged_token() {
    baseline();
    return baseline_logged_token_;
  }

  // Set by the loader check: the PluginInfo the host loader produced, or nullopt if it refused.
  void set_plugin_info(std::optional<nlohmann::json> info) { plugin_info_ = std::move(info); }
  const std::optional<nlohmann::json>& plugin_info() const { return plugin_info_; }
  bool plugin_loaded() const { return plugin_info_.has_value(); }

 private:
  const ValidateOptions& options_;
  std::optional<Fixtures> fixtures_;
  std::optional<ElfFacts> elf_;
  std::optional<Target> target_;
  std::optional<std::vector<Walk>> baseline_;
  std::optional<std::string> baseline_logged_token_;
  std::optional<nlohmann::json> plugin_info_;
  std::map<std::string, nlohmann::json> shared_;
  std::map<std::string, std::string> shared_failures_;
};

enum class Needs {
  kNothing = 1,   // the file only
  kLoadedPlugin,  // the host loader accepted the plugin
  kFixtures,      // ... and fixtures were given
};

struct Check {
  const char* name;
  const char* group;
  int level;
  Needs needs;
  const char* description;
  Verdict (*run)(CheckContext&);
};

std::vector<Check> static_checks();
std::vector<Check> lifecycle_checks();
std::vector<Check> conformance_checks();
std::vector<Check> fault_checks();

// Shared wording helpers.
std::string quote_text(std::string_view text, size_t max = 120);

}  // namespace backhaul::validate
