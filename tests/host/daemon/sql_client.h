// SQL on a daemon's SQLite file from the test process, as any other client of the file could.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include <Poco/Data/SQLite/Connector.h>
#include <Poco/Data/Session.h>
#include <gtest/gtest.h>

namespace backhaul::daemon::testing {

// Runs `sql` on the SQLite file at `path`; retries while the daemon holds the write lock
// (bounded).
inline void run_sql(const std::string& path, const std::string& sql) {
  Poco::Data::SQLite::Connector::registerConnector();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    try {
      Poco::Data::Session session("SQLite", path);
      session << sql, Poco::Data::Keywords::now;
      return;
    } catch (const Poco::Exception& e) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << sql << ": " << e.displayText();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace backhaul::daemon::testing
