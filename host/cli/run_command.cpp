// `backhaul run start|status|list|cancel`: backfill runs through backhauld's admin API, with a
// live progress display for --wait (units done/total, pages, events, rate-limit waits, ETA).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/common/clock.h"
#include "core/common/utf8.h"
#include "host/cli/admin_client.h"
#include "host/cli/cli.h"
#include "host/cli/run_wait.h"
#include <sys/ioctl.h>
#include <unistd.h>

namespace backhaul::cli {
namespace {

using nlohmann::json;

struct RunOptions {
  AdminEndpoint endpoint;
  std::string installation;
  std::string provider;
  // Sent when given, even empty (the API then names what is wrong; nothing widens the request).
  std::optional<std::string> org;
  int depth = 30;
  std::vector<std::string> entity_types;
  int64_t id = 0;
  std::optional<std::string> status;
  std::optional<std::string> list_installation;  // run list's filter
  int64_t before = 0;
  int limit = 20;
  bool wait = false;
  int interval_ms = 1000;
  int lost_contact_ms = 300'000;
  bool json_output = false;
};

std::string duration_text(int64_t ms) {
  const int64_t s = ms / 1000;
  char buffer[32];
  if (s >= 3600) {
    std::snprintf(buffer, sizeof buffer, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else {
    std::snprintf(buffer, sizeof buffer, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buffer;
}

// "run 12 running: units 3/9 (0 failed), pages 45, events 4500, rate-limit waits 0, ETA 0m12s"
// Counts are read as int64_t: value()'s type is its default's, and an int read 5000000000 as
// 705032704.
std::string progress_line(const json& run, int64_t now_ms) {
  const int64_t total = run.value("unitsTotal", int64_t{0});
  const int64_t done = run.value("unitsDone", int64_t{0});
  const int64_t started = run.value("startedMs", int64_t{0});
  std::string eta = "--";
  if (run_finished(run.value("status", ""))) {
    const int64_t end = run.value("finishedMs", now_ms);
    eta = "done in " + duration_text(std::max<int64_t>(0, end - run.value("createdMs", end)));
  } else if (done > 0 && total > done && started > 0) {
    // In double: the product of two int64 counts may not fit one. Not below 0: a client clock
    // behind the daemon's puts now_ms before startedMs.
    const double left = static_cast<double>(now_ms - started) * static_cast<double>(total - done) /
                        static_cast<double>(done);
    eta = duration_text(left > 0 ? static_cast<int64_t>(std::min(left, 1e15)) : 0);
  }
  char buffer[256];
  std::snprintf(buffer, sizeof buffer,
                "run %lld %s: units %lld/%lld (%lld failed), pages %lld, events %lld, "
                "rate-limit waits %lld, ETA %s",
                static_cast<long long>(run.value("id", int64_t{0})),
                escape_controls(run.value("status", "?")).c_str(), static_cast<long long>(done),
                static_cast<long long>(total),
                static_cast<long long>(run.value("unitsFailed", int64_t{0})),
                static_cast<long long>(run.value("pages", int64_t{0})),
                static_cast<long long>(run.value("eventsDispatched", int64_t{0})),
                static_cast<long long>(run.value("rateLimitWaits", int64_t{0})), eta.c_str());
  return buffer;
}

// A run as the API answers it: an id and a status at least. Anything else (another server's
// `{}`) is no run, and ends the command as an answer not the API's (reading_answers), where it
// printed "run 0 ?" and a wait polled it for ever.
const json& checked_run(const json& run) {
  run.at("id").get<int64_t>();
  run.at("status").get<std::string>();
  return run;
}

void print_units(const json& run) {
  if (!run.contains("units")) return;
  std::printf("  %-8s %-28s %-14s %-10s %6s %8s %s\n", "JOB", "RESOURCE", "ENTITY", "STATUS",
              "PAGES", "EVENTS", "ERROR");
  for (const json& u : run.at("units")) {
    const std::string resource = u.value("resourceName", json()).is_string()
                                     ? shown(u.at("resourceName"))
                                     : shown(u.at("resourceId"));
    const std::string error = u.value("error", json()).is_string() ? shown(u.at("error")) : "";
    std::printf("  %-8lld %-28s %-14s %-10s %6lld %8lld %s\n",
                static_cast<long long>(u.at("jobId").get<int64_t>()), resource.c_str(),
                shown(u.at("entityType")).c_str(), shown(u.at("status")).c_str(),
                static_cast<long long>(u.at("pages").get<int64_t>()),
                static_cast<long long>(u.at("eventsDispatched").get<int64_t>()), error.c_str());
  }
}

// The columns of the terminal `fd` is, 80 when it does not say.
size_t terminal_width(int fd) {
  winsize size{};
  if (::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// What --wait shows of its progress: on a terminal, one line redrawn in place, cut short of the
// terminal's width (a line that wraps is not redrawn in place, and each poll left another);
// else a line per change. Its destructor ends a line it drew, so that whatever ends the wait (an
// error thrown while it polled included) is said on a line of its own.
class ProgressLine {
 public:
  explicit ProgressLine(std::FILE* out) : out_(out), tty_(isatty(fileno(out)) != 0) {}
  ~ProgressLine() { end(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool tty() const { return tty_; }

  void show(const std::string& line) {
    if (line == last_) return;
    last_ = line;
    if (tty_) {
      // One column short: a line filling the last column wraps on some terminals.
      const std::string cut = cut_utf8(line, terminal_width(fileno(out_)) - 1);
      std::fprintf(out_, "\r\033[K%s", cut.c_str());
      drawn_ = true;
    } else {
      std::fprintf(out_, "%s\n", line.c_str());
    }
    std::fflush(out_);
  }

  void end() {
    if (!drawn_) return;
    std::fputc('\n', out_);
    std::fflush(out_);
    drawn_ = false;
  }

 private:
  std::FILE* out_;
  bool tty_;
  bool drawn_ = false;  // a line without its line break is on the terminal
  std::string last_;
};

// The signal (SIGINT, SIGTERM) that asked --wait to end, or 0. [written by the handler]
volatile std::sig_atomic_t g_wait_signal = 0;

extern "C" void on_wait_signal(int number) { g_wait_signal = number; }

// While it lives, Ctrl-C (SIGINT) and SIGTERM end --wait's polling rather than the process at
// once: the progress line is ended, the command says that the run goes on without it, and then
// ends by the signal (so that a shell loop running it stops too). A signal the command was
// started with ignored (nohup, a background job) stays ignored.
class WaitSignals {
 public:
  WaitSignals() {
    g_wait_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_wait_signal;
    sigemptyset(&action.sa_mask);
    // A second Ctrl-C ends the command at once (a poll of a daemon that does not answer lasts
    // until the request's timeout): the handler is reset by the first.
    action.sa_flags = SA_RESETHAND;
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      ::sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &action, nullptr);
    }
  }
  ~WaitSignals() {
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  WaitSignals(const WaitSignals&) = delete;
  WaitSignals& operator=(const WaitSignals&) = delete;

  static int caught() { return g_wait_signal; }

  // Sleeps `ms`, or less when a signal comes.
  static void pause(std::chrono::milliseconds ms) {
    const auto until = std::chrono::steady_clock::now() + ms;
    for (auto now = std::chrono::steady_clock::now(); caught() == 0 && now < until;
         now = std::chrono::steady_clock::now()) {
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          until - now, std::chrono::milliseconds(50)));
    }
  }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM};
  struct sigaction old_[std::size(kSignals)]{};
};

// Polls the run until it finishes, redrawing one progress line (a new line per change when the
// stream is not a terminal). With --json the progress goes to stderr and stdout gets the run's
// JSON alone, for a pipe to parse, with `extra` merged in. Polls that find backhauld restarting or
// unable to answer are passed through for --lost-contact-ms. Throws CLI::RuntimeError: 1 unless
// the run succeeded, kExitLostContact when contact was lost; ends by the signal when Ctrl-C (or
// SIGTERM) ended the wait.
void wait_for(AdminClient& client, const RunOptions& o, int64_t id, bool in_contact,
              const json& extra = json::object()) {
  ProgressLine progress(o.json_output ? stderr : stdout);
  const WaitSignals signals;
  const std::string target = "/v1/runs/" + std::to_string(id);
  WaitHooks hooks;
  hooks.poll = [&] { return checked_run(client.get(target)); };
  hooks.pause = &WaitSignals::pause;
  hooks.interrupted = &WaitSignals::caught;
  std::string trouble;  // the error of the failing polls, while they fail
  hooks.on_run = [&](const json& run) {
    trouble.clear();
    progress.show(progress_line(run, SystemClock::instance().now_ms()));
  };
  hooks.on_trouble = [&](const AdminApiError& e, int64_t left_ms) {
    // A terminal counts down; a log gets a line per new error, not per poll.
    if (!progress.tty() && trouble == e.what()) return;
    trouble = e.what();
    progress.show("run " + std::to_string(id) + ": polling again for up to " +
                  duration_text(left_ms) + " after " + e.what());
  };
  const WaitEnd end = poll_until_finished(
      hooks,
      {std::chrono::milliseconds(o.interval_ms), std::chrono::milliseconds(o.lost_contact_ms)},
      SystemClock::instance(), in_contact);
  progress.end();
  const std::string take_up = "the run goes on without this command: `backhaul run status " +
                              std::to_string(id) + " --wait` takes it up again";
  if (end.interrupted != 0) {
    const std::string message = std::string("interrupted (") +
                                (end.interrupted == SIGINT ? "Ctrl-C" : "SIGTERM") + "); " +
                                take_up;
    if (o.json_output) {
      std::cout << AdminApiError(0, "INTERRUPTED", message, {{"runId", id}}).envelope().dump(2)
                << "\n";
    }
    std::fprintf(stderr, "run %lld: %s\n", static_cast<long long>(id), message.c_str());
    std::fflush(nullptr);
    std::signal(end.interrupted, SIG_DFL);
    ::raise(end.interrupted);
    throw CLI::RuntimeError(128 + end.interrupted);  // not reached
  }
  if (end.lost_contact) {
    const std::string message = "lost contact with backhauld for " + duration_text(end.trouble_ms) +
                                " (" + end.error + "); " + take_up;
    if (o.json_output) {
      std::cout << AdminApiError(0, "LOST_CONTACT", message, {{"runId", id}}).envelope().dump(2)
                << "\n";
    }
    std::fprintf(stderr, "run %lld: %s\n", static_cast<long long>(id), message.c_str());
    throw CLI::RuntimeError(kExitLostContact);
  }
  const json& run = end.run;
  if (o.json_output) {
    json out = run;
    out.update(extra);
    std::cout << out.dump(2) << "\n";
  }
  if (run.at("status") != "succeeded") {
    if (!o.json_output) print_units(run);  // the JSON has the units
    if (run.value("error", json()).is_string()) {
      std::fprintf(stderr, "run %lld: %s\n", static_cast<long long>(id),
                   shown(run.at("error")).c_str());
    }
    throw CLI::RuntimeError(1);
  }
}

void start(const RunOptions& o) {
  AdminClient client(o.endpoint);
  json body = {{"installationId", o.installation}, {"provider", o.provider}, {"depth", o.depth}};
  if (o.org) body["orgId"] = *o.org;
  if (!o.entity_types.empty()) body["entityTypes"] = o.entity_types;
  const json started = client.post("/v1/runs", body);
  const int64_t id = started.at("runId");
  const bool created = started.at("created").get<bool>();
  if (o.json_output && !o.wait) {
    std::cout << started.dump(2) << "\n";
  } else {
    // With --wait --json, this line goes with the progress (stderr), and `created` into the JSON.
    const std::string what =
        created ? std::string("started") : "already active for " + o.installation;
    std::fprintf(o.json_output ? stderr : stdout, "run %lld %s (%s)\n", static_cast<long long>(id),
                 what.c_str(), shown(started.at("status")).c_str());
  }
  if (o.wait) wait_for(client, o, id, /*in_contact=*/true, {{"created", created}});
}

void status(const RunOptions& o) {
  AdminClient client(o.endpoint);
  if (o.wait) return wait_for(client, o, o.id, /*in_contact=*/false);
  const json run = checked_run(client.get("/v1/runs/" + std::to_string(o.id)));
  if (o.json_output) {
    std::cout << run.dump(2) << "\n";
    return;
  }
  std::printf("%s\n", progress_line(run, SystemClock::instance().now_ms()).c_str());
  print_units(run);
}

void list(const RunOptions& o) {
  std::string query;
  if (o.status) append_query(&query, "status", *o.status);
  if (o.list_installation) append_query(&query, "installationId", *o.list_installation);
  if (o.before > 0) append_query(&query, "before", std::to_string(o.before));
  append_query(&query, "limit", std::to_string(o.limit));
  const json page = AdminClient(o.endpoint).get("/v1/runs" + query);
  if (o.json_output) {
    std::cout << page.dump(2) << "\n";
    return;
  }
  std::printf("%-8s %-20s %-8s %-10s %-7s %8s %10s\n", "ID", "INSTALLATION", "PROVIDER", "STATUS",
              "UNITS", "PAGES", "EVENTS");
  for (const json& r : page.at("items")) {
    const std::string units = std::to_string(r.at("unitsDone").get<int64_t>()) + "/" +
                              std::to_string(r.at("unitsTotal").get<int64_t>());
    std::printf("%-8lld %-20s %-8s %-10s %-7s %8lld %10lld\n",
                static_cast<long long>(r.at("id").get<int64_t>()),
                shown(r.at("request").at("installationId")).c_str(),
                shown(r.at("request").at("provider")).c_str(), shown(r.at("status")).c_str(),
                units.c_str(), static_cast<long long>(r.at("pages").get<int64_t>()),
                static_cast<long long>(r.at("eventsDispatched").get<int64_t>()));
  }
  if (page.value("nextBefore", json()).is_number()) {
    std::vector<std::pair<std::string, std::string>> options;
    if (o.status) options.emplace_back("--status", *o.status);
    if (o.list_installation) options.emplace_back("--installation", *o.list_installation);
    options.emplace_back("--limit", std::to_string(o.limit));
    std::printf("%s\n", next_page_hint(options, page.at("nextBefore").get<int64_t>()).c_str());
  }
}

void cancel(const RunOptions& o) {
  const json result = AdminClient(o.endpoint).post("/v1/runs/" + std::to_string(o.id) + "/cancel");
  if (o.json_output) {
    std::cout << result.dump(2) << "\n";
    return;
  }
  std::printf("run %lld: %s (status %s)\n", static_cast<long long>(o.id),
              shown(result.at("outcome")).c_str(), shown(result.at("status")).c_str());
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand("run",
                                     "backfill runs on backhauld (start, status, list, "
                                     "cancel)");
  run->require_subcommand(1);
  auto common = [&](CLI::App* command) {
    add_endpoint_options(*command, options->endpoint);
    command->add_flag("--json", options->json_output, "print the API's JSON answer");
  };
  // --interval-ms and --lost-contact-ms mean something only with --wait: without it they are
  // refused, not taken and ignored.
  auto waiting = [&](CLI::App* command) {
    CLI::Option* wait = command->add_flag(
        "--wait", options->wait,
        "show live progress until the run finishes; exit 0 only if it succeeded, 3 if contact "
        "with backhauld was lost");
    command
        ->add_option("--interval-ms", options->interval_ms, "with --wait: progress poll interval")
        ->capture_default_str()
        ->check(CLI::Range(50, 60'000))
        ->needs(wait);
    command
        ->add_option("--lost-contact-ms", options->lost_contact_ms,
                     "with --wait: how long backhauld may not answer (restarting, or 429/5xx) "
                     "before the command gives up with status 3; the run goes on")
        ->capture_default_str()
        ->check(CLI::Range(0, 86'400'000))
        ->needs(wait);
  };

  CLI::App* start_cmd =
      run->add_subcommand("start", "start a backfill run (or show the active one)");
  common(start_cmd);
  waiting(start_cmd);
  start_cmd->add_option("--installation", options->installation, "gateway connection id")
      ->required();
  start_cmd->add_option("--provider", options->provider, "connector id: github, vercel, ...")
      ->required();
  start_cmd->add_option("--depth", options->depth, "days of history: 7, 30 or 90")
      ->capture_default_str()
      ->check(CLI::IsMember({7, 30, 90}));
  start_cmd->add_option("--org", options->org, "organisation id (default: the connection's)");
  start_cmd->add_option("--entity-type", options->entity_types,
                        "entity types (repeatable; default: the connector's)");
  start_cmd->callback(
      [options] { reading_answers([&] { start(*options); }, options->json_output); });

  CLI::App* status_cmd = run->add_subcommand("status", "a run with per-unit progress");
  common(status_cmd);
  waiting(status_cmd);
  add_id_argument(*status_cmd, options->id, "run")->required();
  status_cmd->callback(
      [options] { reading_answers([&] { status(*options); }, options->json_output); });

  CLI::App* list_cmd = run->add_subcommand("list", "runs, newest first");
  common(list_cmd);
  list_cmd->add_option("--status", options->status,
                       "queued, running, succeeded, failed, cancelled");
  list_cmd->add_option("--installation", options->list_installation, "only this installation");
  list_cmd->add_option("--before", options->before, "paging: only ids below this")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  list_cmd->add_option("--limit", options->limit, "at most this many")->capture_default_str();
  list_cmd->callback([options] { reading_answers([&] { list(*options); }, options->json_output); });

  CLI::App* cancel_cmd = run->add_subcommand("cancel", "cancel a run and its units");
  common(cancel_cmd);
  add_id_argument(*cancel_cmd, options->id, "run")->required();
  cancel_cmd->callback(
      [options] { reading_answers([&] { cancel(*options); }, options->json_output); });
}

}  // namespace backhaul::cli
