// backhaul-sandbox: a fake GitHub API, Vercel API and ingest gateway in one HTTP server on
// 127.0.0.1, serving deterministic generated data with injectable faults, and reporting what the
// gateway received against what a complete backfill must deliver. A test double for the demo,
// integration tests and benchmarks; see docs/sandbox.md for endpoints and formats.
//
//   Sandbox sandbox({.installations = 2, .items = 50});
//   sandbox.start();
//   ... point connectors at sandbox.base_url() + "/github", "/vercel", "/gateway" ...
//   EXPECT_TRUE(sandbox.report().complete());
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/sandbox/options.h"
#include "host/sandbox/report.h"

namespace backhaul::sandbox {

class Sandbox {
 public:
  // Builds the data set. Throws std::invalid_argument for invalid options. [any thread]
  explicit Sandbox(SandboxOptions options);
  ~Sandbox();  // stops the server
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Binds 127.0.0.1:options.port (0 = ephemeral) and starts serving. Throws Poco::Exception if
  // the port cannot be bound, std::logic_error if already started. [owner thread]
  void start();
  // Stops accepting, aborts open connections and waits for handler threads. Idempotent.
  // [owner thread]
  void stop();

  // The bound port; 0 before start(). [thread-safe]
  uint16_t port() const;
  // "http://127.0.0.1:PORT". Provider bases are base_url() + "/github" and "/vercel", the
  // gateway's base_url() + "/gateway". [thread-safe]
  std::string base_url() const;

  // `installation` ("inst-1") restricts the report; throws std::invalid_argument for an id
  // outside the data set. [thread-safe]
  Report report(const std::optional<std::string>& installation = std::nullopt) const;
  // Every delivery id a complete backfill produces, for one installation or all. [thread-safe]
  std::vector<std::string> expected_delivery_ids(
      const std::optional<std::string>& installation = std::nullopt) const;

  // Replaces the fault knobs; takes effect for the next request. Throws std::invalid_argument.
  // [thread-safe]
  void set_faults(const Faults& faults);
  Faults faults() const;  // [thread-safe]

  // Forgets received webhooks and zeroes counters and rate-limit windows; tokens stay valid.
  // [thread-safe]
  void reset();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace backhaul::sandbox
