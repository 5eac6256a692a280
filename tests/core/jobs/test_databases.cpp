#include "tests/core/jobs/test_databases.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include <Poco/Data/MySQL/Connector.h>
#include <Poco/Data/Session.h>
#include <Poco/Exception.h>

#include <unistd.h>

#ifndef BACKHAUL_MARIADB_DIR
#define BACKHAUL_MARIADB_DIR "mariadb"
#endif

namespace backhaul::jobs::testing {
namespace {

namespace fs = std::filesystem;

// "<pid>-<n>-<random>": unique across the test processes ctest runs in parallel.
std::string unique_suffix() {
  static std::atomic<int> counter{0};
  static const uint32_t salt = std::random_device{}();
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%d_%d_%08x", static_cast<int>(::getpid()),
                counter.fetch_add(1), salt);
  return buffer;
}

class SqliteDatabase : public TestDatabase {
 public:
  explicit SqliteDatabase(const std::string& purpose)
      : dir_(fs::temp_directory_path() / ("backhaul-" + purpose + "-" + unique_suffix())) {
    fs::create_directories(dir_);
  }
  ~SqliteDatabase() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::unique_ptr<JobStore> open() override { return open_sqlite_store(location()); }
  std::string location() const override { return (dir_ / "jobs.db").string(); }
  std::string store_spec() const override { return "sqlite:" + location(); }

 private:
  fs::path dir_;
};

// --- MySQL ---------------------------------------------------------------------------------

fs::path mariadb_dir() {
  if (const char* dir = std::getenv("BACKHAUL_TEST_MARIADB_DIR"); dir != nullptr && *dir != 0) {
    return dir;
  }
  return BACKHAUL_MARIADB_DIR;
}

std::string read_connection_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(
        "the MySQL job-store tests need a running MariaDB, but " + path.string() +
        " does not exist. Run these tests through ctest, whose fixture 'mariadb' (test "
        "mariadb_start) starts a server and writes that file, or point BACKHAUL_TEST_MARIADB_DIR "
        "at a directory with connection.txt and root_connection.txt.");
  }
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) {
    line.pop_back();
  }
  if (line.empty()) throw std::runtime_error(path.string() + " is empty");
  return line;
}

// Poco connection strings are "key=value;key=value".
using Options = std::vector<std::pair<std::string, std::string>>;

Options parse_options(const std::string& text) {
  Options options;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    if (!item.empty()) {
      size_t eq = item.find('=');
      options.emplace_back(item.substr(0, eq), eq == std::string::npos ? "" : item.substr(eq + 1));
    }
    start = end + 1;
  }
  return options;
}

std::string option(const Options& options, const std::string& key) {
  for (const auto& [k, v] : options) {
    if (k == key) return v;
  }
  return "";
}

std::string with_option(Options options, const std::string& key, const std::string& value) {
  bool replaced = false;
  for (auto& [k, v] : options) {
    if (k == key) {
      v = value;
      replaced = true;
    }
  }
  if (!replaced) options.emplace_back(key, value);
  std::string text;
  for (const auto& [k, v] : options) {
    if (!text.empty()) text += ';';
    text += k + "=" + v;
  }
  return text;
}

std::string sql_literal(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'' || c == '\\') out += c;
    out += c;
  }
  return out + "'";
}

void register_mysql_once() {
  static std::once_flag once;
  std::call_once(once, [] { Poco::Data::MySQL::Connector::registerConnector(); });
}

class MysqlDatabase : public TestDatabase {
 public:
  explicit MysqlDatabase(const std::string& purpose) {
    const fs::path dir = mariadb_dir();
    const std::string app = read_connection_file(dir / "connection.txt");
    root_ = read_connection_file(dir / "root_connection.txt");
    register_mysql_once();
    name_ = "backhaul_" + purpose + "_" + unique_suffix();  // covered by the `backhaul\_%` grant
    const Options app_options = parse_options(app);
    try {
      Poco::Data::Session root("MySQL", root_);
      // The same character set and collation as the fixture's own database, so key comparisons
      // behave as they do in production.
      std::string charset = "utf8mb4";
      std::string collation = "utf8mb4_unicode_ci";
      if (std::string db = option(app_options, "db"); !db.empty()) {
        std::vector<std::string> cs;
        std::vector<std::string> co;
        root << "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME FROM "
                "information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
            Poco::Data::Keywords::bind(db), Poco::Data::Keywords::into(cs),
            Poco::Data::Keywords::into(co), Poco::Data::Keywords::now;
        if (!cs.empty()) {
          charset = cs.front();
          collation = co.front();
        }
      }
      root << "CREATE DATABASE `" + name_ + "` CHARACTER SET " + charset + " COLLATE " + collation,
          Poco::Data::Keywords::now;
      created_ = true;
      // Let the application user (not root) own it, as in production.
      if (std::string user = option(app_options, "user"); !user.empty() && user != "root") {
        std::vector<std::string> hosts;
        root << "SELECT Host FROM mysql.user WHERE User = ?", Poco::Data::Keywords::bind(user),
            Poco::Data::Keywords::into(hosts), Poco::Data::Keywords::now;
        for (const auto& host : hosts) {
          root << "GRANT ALL PRIVILEGES ON `" + name_ + "`.* TO " + sql_literal(user) + "@" +
                      sql_literal(host),
              Poco::Data::Keywords::now;
        }
      }
    } catch (const Poco::Exception& e) {
      drop();
      throw std::runtime_error("cannot create the test database " + name_ + " with " +
                               (dir / "root_connection.txt").string() + ": " + e.displayText());
    }
    connection_ = with_option(app_options, "db", name_);
  }
  ~MysqlDatabase() override { drop(); }

  std::unique_ptr<JobStore> open() override { return open_mysql_store(connection_, 8); }
  std::string location() const override { return "mysql database " + name_; }
  std::string store_spec() const override { return "mysql:" + connection_; }

 private:
  void drop() noexcept {
    if (!created_) return;
    try {
      Poco::Data::Session root("MySQL", root_);
      root << "DROP DATABASE IF EXISTS `" + name_ + "`", Poco::Data::Keywords::now;
      created_ = false;
    } catch (const Poco::Exception& e) {
      std::cerr << "warning: cannot drop test database " << name_ << ": " << e.displayText()
                << "\n";
    }
  }

  std::string root_;
  std::string name_;
  std::string connection_;
  bool created_ = false;
};

}  // namespace

std::string backend_name(Backend backend) {
  return backend == Backend::kSqlite ? "sqlite" : "mysql";
}

std::unique_ptr<TestDatabase> TestDatabase::create(Backend backend, const std::string& purpose) {
  if (backend == Backend::kSqlite) return std::make_unique<SqliteDatabase>(purpose);
  return std::make_unique<MysqlDatabase>(purpose);
}

}  // namespace backhaul::jobs::testing
