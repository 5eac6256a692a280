// Isolation mode (SPEC B4): a connector whose calls run in worker processes, so that a plugin that
// crashes, exits or hangs in fetch_page() or validate_scopes() ends a worker, never the daemon.
// The call fails RETRYABLE (an attempt of the job, and in the end a dead letter), and the next
// call starts a new worker. A plugin loaded with load_isolated() (plugin_loader.h) runs no code in
// the daemon at all: its checks, init() and validate_config() run in worker processes too.
//
// A worker is the backhaul-plugin-worker executable: it loads the same plugin file (refusing one
// whose SHA-256 is not the daemon's), creates one instance from the connector's config, and
// answers one call at a time over a UNIX socket on its descriptor 3 (kWorkerSocketFd). Each message
// is a frame: a 4-byte little-endian length, then the body (worker_wire in isolation.cpp); each
// answer ends with the HTTP tally of its call (http::HttpTally). The daemon passes the version of
// this wire (kWorkerWire), and a worker of another version refuses to start, naming both: after
// an upgrade that replaced the worker executable, restart the daemon.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backhaul/backhaul.h"

#include "core/common/unique_fd.h"
#include "core/plugins/plugin.h"
#include <sys/types.h>

namespace backhaul::http {
class HttpMetrics;  // core/http/http_metrics.h
}  // namespace backhaul::http

namespace backhaul::plugins {

struct HostServices;
struct WorkerLost;  // isolation.cpp: a worker that has to go, and how it ended

// A worker's descriptors: its socket, and the sealed copies of the plugin's files from this one on
// (in the order of its --sealed options).
// The version of the daemon-worker wire; a change to it changes this.
constexpr int kWorkerWire = 2;
constexpr int kWorkerSocketFd = 3;
constexpr int kWorkerFirstSealedFd = 4;

struct IsolationOptions {
  std::filesystem::path worker_path;  // the backhaul-plugin-worker executable
  size_t max_workers = 4;             // processes per connector, started as calls need them
  // A call that has not answered by then: its worker is killed (SIGKILL, by process group) and the
  // call fails RETRYABLE.
  std::chrono::milliseconds call_timeout{120'000};
  // How long making a connector with FirstWorkerCrash::kDefer waits for its first worker: a plugin
  // whose init() or create() takes longer does not hold up the start of what makes it (a daemon).
  std::chrono::milliseconds start_wait{10'000};
  // A worker whose resident memory passes this during a call is killed (SIGKILL, by process group)
  // and the call fails RETRYABLE; 0: no limit. Watched from here, every few milliseconds of the
  // call, so a plugin that allocates fast may overshoot it by what it allocates in that time. An
  // idle worker found over it when a call would take it (the plugin's own threads grew it) is
  // replaced first.
  size_t memory_limit_mb = 0;
  std::chrono::milliseconds http_timeout{30'000};  // the worker's default for plugin HTTP calls
  std::string ca_file;                             // passed on to the worker's HTTP transport
  // Where the plugin's HTTP exchanges, counted in its workers and sent back at the end of each
  // answer, are added (as "plugin:<id>"); null: nowhere. Must outlive the plugin.
  http::HttpMetrics* http_metrics = nullptr;
  // The worker's HTTP proxy (http://host:port, no credentials; empty: none), the hosts it does not
  // serve, and the variable with its user:password, which the worker reads: it needs them to send
  // the plugin's requests, so the variable must not be one of hidden_env.
  std::string proxy_url;
  std::vector<std::string> no_proxy;
  std::string proxy_credentials_env;
  std::string log_level = "info";  // the worker logs to the daemon's stderr,
  bool log_json = false;           // as text or JSON lines
  // Environment variables a worker does not inherit: the daemon's secrets (the store's connection
  // string, the gateway key, the admin token), which the plugins' code has no business reading.
  std::vector<std::string> hidden_env;
  // For tests: called with each pool worker's PID as soon as it is spawned, before its call can
  // be interrupted (WorkerPool::interrupt).
  std::function<void(pid_t)> on_spawn;
};

// A file of a plugin (the library, or one it brings along) copied into a sealed in-memory file.
struct SealedFile {
  std::filesystem::path path;  // loaded from
  UniqueFd fd;
  std::string sha256;  // of the bytes (lower-case hex)
};
using SealedFiles = std::vector<SealedFile>;

// A plugin that load_isolated() loaded in a worker process: what the worker found, the options its
// instances and its validate_config() run with, and the sealed copies of its files that this load
// checked. Every later worker loads those copies instead of the files, so each runs what was
// checked, and a file replaced since (an upgrade in place) reaches none of them before a restart.
struct IsolatedPlugin {
  PluginInfo info;
  IsolationOptions options;
  std::shared_ptr<const SealedFiles> sealed;
};

// The plugin's validate_config() in a worker process of its own, which then exits. Throws
// ConnectorFailure with the plugin's message on a bad config, and PluginCrashed when the worker
// ends (or hangs past the call timeout) instead of answering.
void validate_config_in_worker(const IsolatedPlugin& plugin, std::string_view config_json);

// A page that came from a worker: the answer's bytes and the C page pointing into them.
struct OwnedPage {
  std::string body;
  std::vector<backhaul_event_t> events;
  backhaul_page_t page{};
};

// The worker processes of one connector. [thread-safe]: calls from many threads each take an idle
// worker, or start one while fewer than max_workers live, or wait for one.
class WorkerPool {
 public:
  // Starts the first worker and creates the instance in it. Throws ConnectorFailure with the
  // plugin's message on a bad config, FATAL when the worker cannot be started or cannot load the
  // plugin, and PluginCrashed when it dies while starting (as a later start does in a call), unless
  // `on_crash` defers that: then it is logged and counted, and the pool starts with no worker.
  // Deferred, the first worker starts on a thread of its own, waited for up to options.start_wait;
  // a start that takes longer is logged and goes on (what it ends in is logged then), and its
  // worker serves once started. With `sealed`, its workers load those copies of the plugin's files
  // (IsolatedPlugin).
  WorkerPool(PluginInfo info, std::string config_json, IsolationOptions options,
             std::shared_ptr<const SealedFiles> sealed = nullptr,
             FirstWorkerCrash on_crash = FirstWorkerCrash::kThrow);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  // A first worker still starting is killed (SIGKILL, by process group). Idle workers get
  // end-of-file and exit; one that has not after a second is killed.
  ~WorkerPool();

  const PluginInfo& info() const noexcept { return info_; }
  std::shared_ptr<OwnedPage> fetch_page(const FetchParams& params);
  void validate_scopes(const Unit& unit);

  // Kills (SIGKILL, by process group) the workers that are running a call or starting for one:
  // each such call fails at once with PluginCrashed saying the daemon stopped it, and so does each
  // call then waiting for a worker. For a stop that cannot wait for a plugin any longer. Returns
  // how many workers were killed.
  size_t interrupt();
  WorkerStats stats() const;
  // Live worker processes, the PIDs of the idle ones, and the calls waiting for a worker (for
  // tests).
  size_t live() const;
  std::vector<pid_t> idle_pids() const;
  size_t waiting() const;

 private:
  // A worker process: its PID, the daemon's end of its socket, and a descriptor that reads
  // ready once the process has ended (a pidfd; -1 when the kernel has none). The socket alone
  // would not say so while a process the plugin forked still holds the worker's end.
  struct Worker {
    pid_t pid = -1;
    UniqueFd socket;
    UniqueFd ended;
  };

  // Starts a worker counted in live_ when interrupts_ was `interrupts`: an interrupt() since, which
  // could not see it, kills it as soon as it is spawned.
  std::unique_ptr<Worker> start(uint64_t interrupts);
  // start() for a worker already counted in live_, uncounted again when the start fails.
  std::unique_ptr<Worker> start_counted(uint64_t interrupts);
  // The deferred first start (FirstWorkerCrash::kDefer), on first_start_.
  void start_first();
  std::unique_ptr<Worker> acquire();
  void give_back(std::unique_ptr<Worker> worker);
  // Takes `pid` out of the busy set once its call has ended; true when interrupt() killed it.
  bool settle(pid_t pid);
  // Kills the busy workers' process groups and marks them interrupted. [mutex_ held]
  size_t kill_busy();
  void count_loss(WorkerLoss reason);
  // One call on an idle worker; `decode` turns the answer's body into the result. A lost worker is
  // reaped and the call throws ConnectorFailure (RETRYABLE) saying how it ended.
  template <class Decode>
  auto run(const std::string& request, const char* what, Decode&& decode);
  [[noreturn]] void lost(std::unique_ptr<Worker> worker, const WorkerLost& e, const char* what);

  const PluginInfo info_;
  const std::string config_json_;
  const IsolationOptions options_;
  const std::shared_ptr<const SealedFiles> sealed_;
  mutable std::mutex mutex_;
  std::condition_variable idle_changed_;
  std::vector<std::unique_ptr<Worker>> idle_;
  size_t live_ = 0;
  std::array<uint64_t, kWorkerLossCount> lost_{};  // workers lost, by WorkerLoss
  std::set<pid_t> busy_;         // starting, or running a call: what interrupt() kills
  std::set<pid_t> interrupted_;  // killed by interrupt(), not yet reaped
  bool closing_ = false;         // the destructor kills any worker that starts from then on
  uint64_t interrupts_ = 0;      // interrupt()s so far: a call waiting across one fails
  size_t waiting_ = 0;           // calls waiting for a worker
  // The deferred first start: whether it has ended, whether the constructor still waits for it,
  // and what it threw that the constructor rethrows (a refused config, say).
  std::thread first_start_;
  std::condition_variable first_started_;
  bool first_done_ = false;
  bool first_waited_ = true;
  std::exception_ptr first_error_;
};

// The worker's side: loads `plugin` (refused unless the SHA-256 of the file and of each library it
// brings along is in `sha256`; an empty set refuses nothing; the bytes of the files that
// `sealed_sources` names come from its descriptors), then answers the frames on `fd` until
// the other end closes it. Returns the process's exit status. Should the other end close while the
// plugin is loading or in a call (the daemon is gone: killed, or its start-up abandoned), the
// plugin may never return: the worker's process group is killed there and then, so no worker
// outlives its daemon by more than the time it takes to notice.
int serve_plugin_worker(int fd, const std::filesystem::path& plugin,
                        const std::set<std::string>& sha256, const HostServices& services,
                        const std::map<std::filesystem::path, int>& sealed_sources = {});

}  // namespace backhaul::plugins
