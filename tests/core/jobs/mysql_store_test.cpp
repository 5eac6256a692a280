// MySQL/MariaDB specifics of the job store (the shared behaviour is job_store_conformance_test):
// concurrent migrations, claims from two store instances ("hosts") under contention, caps held
// across them, a provoked deadlock that the store re-runs, a lost connection it reconnects
// after, utf8mb4 and MEDIUMTEXT round trips, and batch ids.
//
// The server comes from the `mariadb` CTest fixture (packaging/scripts/mariadb.sh), which writes
// connection.txt and root_connection.txt into BACKHAUL_MARIADB_DIR; the environment variables
// BACKHAUL_TEST_MYSQL / BACKHAUL_TEST_MYSQL_ROOT (connection strings) or
// BACKHAUL_TEST_MARIADB_DIR override it. Without a server every test FAILS with the reason; none
// is skipped. Each test works in a database of its own, dropped afterwards.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/jobs/job_store.h"
#include "core/jobs/migrations.h"
#include "core/jobs/mysql_db.h"
#include "core/jobs/scheduler.h"
#include "tests/support/open_sockets.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef BACKHAUL_MARIADB_DIR
#define BACKHAUL_MARIADB_DIR "mariadb"
#endif

namespace backhaul::jobs {
namespace {

using namespace std::chrono_literals;

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(
        "the MySQL tests need a running MariaDB, but " + path +
        " does not exist. Run them through ctest, whose fixture `mariadb` (test mariadb_start) "
        "starts one, or set BACKHAUL_TEST_MYSQL and BACKHAUL_TEST_MYSQL_ROOT.");
  }
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string mariadb_dir() {
  const char* dir = std::getenv("BACKHAUL_TEST_MARIADB_DIR");
  return dir && *dir ? dir : BACKHAUL_MARIADB_DIR;
}

std::string setting(const char* env, const char* file) {
  if (const char* value = std::getenv(env); value && *value) return value;
  return read_first_line(mariadb_dir() + "/" + file);
}

// A database of its own on the fixture's server, created and dropped with the root login.
class TestDatabase {
 public:
  TestDatabase() {
    static std::atomic<int> counter{0};
    name_ = "backhaul_mst_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    root_ = setting("BACKHAUL_TEST_MYSQL_ROOT", "root_connection.txt");
    app_ = mysql::with_database(setting("BACKHAUL_TEST_MYSQL", "connection.txt"), name_);
    root_session()->one("CREATE DATABASE `" + name_ +
                        "` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci");
  }
  ~TestDatabase() {
    try {
      root_session()->one("DROP DATABASE IF EXISTS `" + name_ + "`");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "cannot drop " << name_ << ": " << e.what();
    }
  }

  const std::string& name() const { return name_; }
  const std::string& connection() const { return app_; }
  std::unique_ptr<JobStore> open(size_t pool = 8) const { return open_mysql_store(app_, pool); }
  // A session of the application user on this database, outside any store.
  std::unique_ptr<mysql::Connection> app_session() const {
    return std::make_unique<mysql::Connection>(mysql::parse_config(app_));
  }
  // The administrator (PROCESS, KILL, global status), on this database.
  std::unique_ptr<mysql::Connection> root_session() const {
    return std::make_unique<mysql::Connection>(mysql::parse_config(root_));
  }
  std::unique_ptr<mysql::Connection> root_session_in_db() const {
    return std::make_unique<mysql::Connection>(
        mysql::parse_config(mysql::with_database(root_, name_)));
  }

 private:
  std::string name_;
  std::string root_;
  std::string app_;
};

// A session of `db` holding job `id`'s row (FOR UPDATE, in a transaction) until it rolls back.
std::unique_ptr<mysql::Connection> holding_row(const TestDatabase& db, JobId id) {
  auto holder = db.app_session();
  holder->one("START TRANSACTION");
  holder->one("SELECT id FROM jobs WHERE id = " + std::to_string(id) + " FOR UPDATE");
  return holder;
}

JobSpec spec(const std::string& kind, const std::string& key = "", std::string payload = "{}") {
  JobSpec s;
  s.kind = kind;
  s.concurrency_key = key;
  s.payload = std::move(payload);
  return s;
}

int64_t scalar(mysql::Connection& c, const std::string& sql) {
  mysql::Result r = c.one(sql);
  if (r.rows.empty() || r.rows[0].empty()) throw std::runtime_error("no row: " + sql);
  return mysql::to_i64(r.rows[0][0]);
}

// --- connection strings --------------------------------------------------------------------

TEST(MysqlConfig, ParsesPocoKeysAndRejectsTypos) {
  mysql::Config c = mysql::parse_config(
      "host=127.0.0.1;port=3307;db=q;user=u;password=p=w;compress=true;auto-reconnect=true;"
      "character-set=utf8mb4");
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, 3307u);
  EXPECT_EQ(c.db, "q");
  EXPECT_EQ(c.user, "u");
  EXPECT_EQ(c.password, "p=w");
  EXPECT_TRUE(c.compress);
  EXPECT_EQ(c.lock_wait_timeout_s, 0u);
  EXPECT_EQ(mysql::parse_config("host=h;db=q;lock-wait-timeout=7").lock_wait_timeout_s, 7u);
  EXPECT_EQ(c.idle_transaction_timeout_s, 60u);
  EXPECT_EQ(
      mysql::parse_config("host=h;db=q;idle-transaction-timeout=7").idle_transaction_timeout_s, 7u);
  // Poco silently ignores unknown keys (env-recipe.md section 4); a typo here is an error.
  EXPECT_THROW(mysql::parse_config("host=h;prot=1;db=q"), ConfigError);
  EXPECT_THROW(mysql::parse_config("host=h;db=q;character-set=latin1"), ConfigError);
  EXPECT_THROW(mysql::parse_config("host=h;port=x;db=q"), ConfigError);
  EXPECT_THROW(open_mysql_store("host=127.0.0.1;port=1;user=u"), ConfigError);  // no db
}

// Poco's MySQL connector strips the blanks around keys and values ("host = h ; port = 3307"):
// the format this layer says it keeps. Only the keys were trimmed here, so a string Poco accepts
// was refused ("port must be a number, not ' 3307'") or connected to database " q".
TEST(MysqlConfig, BlanksAroundValuesAreIgnoredAsPocoIgnoresThem) {
  try {
    mysql::Config c = mysql::parse_config(
        "host = 127.0.0.1 ; port = 3307 ; db = q ; user = u ; character-set = utf8mb4 ; "
        "compress = true");
    EXPECT_EQ(c.host, "127.0.0.1");
    EXPECT_EQ(c.port, 3307u);
    EXPECT_EQ(c.db, "q");
    EXPECT_EQ(c.user, "u");
    EXPECT_TRUE(c.compress);
  } catch (const ConfigError& e) {
    ADD_FAILURE() << "a Poco connection string was refused: " << e.what();
  }
}

// A port is 1..65535. 0 made the client library connect to its default port (3306) and 70000 to
// port 70000 mod 65536 = 4464, while errors spoke of port 70000: the value itself is refused,
// naming the key (Poco refuses both as well).
TEST(MysqlConfig, APortOutsideOneTo65535IsRefusedNamingTheKey) {
  for (const char* port : {"0", "65536", "70000", "4294967295"}) {
    try {
      mysql::parse_config(std::string("host=h;db=q;port=") + port);
      ADD_FAILURE() << "port=" << port << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("port"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(port), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(mysql::parse_config("host=h;db=q;port=65535").port, 65535u);
  EXPECT_EQ(mysql::parse_config("host=h;db=q;port=1").port, 1u);
}

// migrate-wait=S bounds how long opening the store waits for another host's migration (600 s by
// default; 0: not at all). The wait was a fixed 30 s, with no key.
TEST(MysqlConfig, MigrateWaitIsReadAndABadValueIsRefusedNamingTheKey) {
  try {
    EXPECT_EQ(mysql::parse_config("host=h;db=q").migrate_wait_s, 600u);
    EXPECT_EQ(mysql::parse_config("host=h;db=q;migrate-wait=2").migrate_wait_s, 2u);
    EXPECT_EQ(mysql::parse_config("host=h;db=q;migrate-wait = 0").migrate_wait_s, 0u);
  } catch (const ConfigError& e) {
    ADD_FAILURE() << e.what();
  }
  for (const char* wait : {"x", "-1", "2.5", "", "4294967296"}) {
    try {
      mysql::parse_config(std::string("host=h;db=q;migrate-wait=") + wait);
      ADD_FAILURE() << "migrate-wait=" << wait << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("migrate-wait must be a number, not '" +
                                           std::string(wait) + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

// A password holding ';' splits into items; the error about the item after it must not quote it
// (the daemon logs the error): it names the item by its place.
TEST(MysqlConfig, AnErrorAboutTheItemAfterAPasswordDoesNotQuoteIt) {
  for (const char* dsn :
       {"host=h;db=q;user=u;password=s3cr;XYZZY-part", "host=h;db=q;password=s3cr;XYZZY=part"}) {
    try {
      mysql::parse_config(dsn);
      ADD_FAILURE() << dsn << " was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("XYZZY"), std::string::npos) << what;
      EXPECT_NE(what.find("after password="), std::string::npos) << what;
    }
  }
  try {
    mysql::parse_config("host=h;db=q;dbname=x");
    ADD_FAILURE() << "dbname= was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'dbname'"), std::string::npos) << e.what();
  }
}

// Numbers cross the wire in the C locale's form, read whole (review: strtod read "3999.5x" as
// 3999.5, and under a locale with a decimal comma, such as de_DE, "3999.5" as 3999).
TEST(MysqlConfig, RealNumbersAreReadWholeAndWrittenToRoundTrip) {
  EXPECT_EQ(mysql::to_double(std::string("3999.5")), 3999.5);
  EXPECT_EQ(mysql::to_double(std::string("1e-13")), 1e-13);
  EXPECT_EQ(mysql::to_double(std::nullopt), 0);
  for (const char* bad : {"3999.5x", "", "abc", "3999,5", " 1"}) {
    EXPECT_THROW(mysql::to_double(std::string(bad)), StorageError) << bad;
  }
  for (double value : {3999.5, 0.1, 1.0 / 3, 1e-13, 4000.0}) {
    mysql::Sql sql;
    sql.real(value);
    EXPECT_EQ(mysql::to_double(sql.text()), value) << sql.text();
  }
}

TEST(MysqlConfig, QuotingIsCompleteForUtf8mb4) {
  EXPECT_EQ(mysql::quote(std::string_view("a'b\\c\"d\n\r\x1a", 10)), "'a\\'b\\\\c\\\"d\\n\\r\\Z'");
  EXPECT_EQ(mysql::quote(std::string("x\0y", 3)), "'x\\0y'");
  EXPECT_EQ(mysql::quote(std::optional<std::string>()), "NULL");
}

// --- sessions and migrations ----------------------------------------------------------------

TEST(MysqlStore, SessionsRunReadCommittedWithStrictMode) {
  TestDatabase db;
  auto c = db.app_session();
  mysql::Result r = c->one("SELECT @@tx_isolation, @@sql_mode, @@character_set_client");
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(mysql::to_str(r.rows[0][0]), "READ-COMMITTED");
  EXPECT_NE(mysql::to_str(r.rows[0][1]).find("STRICT_ALL_TABLES"), std::string::npos);
  EXPECT_EQ(mysql::to_str(r.rows[0][1]).find("NO_BACKSLASH_ESCAPES"), std::string::npos);
  EXPECT_EQ(mysql::to_str(r.rows[0][2]), "utf8mb4");
  // lock-wait-timeout=S sets the session's innodb_lock_wait_timeout; without it, the server's.
  const int64_t server_default = scalar(*c, "SELECT @@GLOBAL.innodb_lock_wait_timeout");
  EXPECT_EQ(scalar(*c, "SELECT @@SESSION.innodb_lock_wait_timeout"), server_default);
  mysql::Connection quick(mysql::parse_config(db.connection() + ";lock-wait-timeout=3"));
  EXPECT_EQ(scalar(quick, "SELECT @@SESSION.innodb_lock_wait_timeout"), 3);
}

// A session that goes quiet inside a transaction (its host lost power, or its network) is ended
// by MariaDB after idle-transaction-timeout (60 s by default), and its row locks are freed.
// Without it the server kept such a session, and its locks, until TCP keepalive or wait_timeout
// noticed (hours): a claim's lock on its kind's cap row would have held up every host's claims.
TEST(MysqlStore, ASessionQuietInsideATransactionIsEndedAndItsLocksFreed) {
  TestDatabase db;
  auto c = db.app_session();
  EXPECT_EQ(scalar(*c, "SELECT @@SESSION.idle_transaction_timeout"), 60);
  c->run(
      "CREATE TABLE quiet_lock (id INT PRIMARY KEY) ENGINE=InnoDB; "
      "INSERT INTO quiet_lock VALUES (1)");
  mysql::Connection quiet(mysql::parse_config(db.connection() + ";idle-transaction-timeout=1"));
  EXPECT_EQ(scalar(quiet, "SELECT @@SESSION.idle_transaction_timeout"), 1);
  quiet.run("BEGIN; SELECT id FROM quiet_lock WHERE id = 1 FOR UPDATE");
  mysql::Connection other(mysql::parse_config(db.connection()));
  EXPECT_THROW(other.run("SELECT id FROM quiet_lock WHERE id = 1 FOR UPDATE NOWAIT"), mysql::Error)
      << "the quiet session holds the row";
  bool freed = false;
  for (int i = 0; i < 150 && !freed; ++i) {  // up to 15 s for a 1-s timeout
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    try {
      other.run("SELECT id FROM quiet_lock WHERE id = 1 FOR UPDATE NOWAIT");
      freed = true;
    } catch (const mysql::Error&) {
    }
  }
  EXPECT_TRUE(freed) << "the quiet session's lock was never freed";
  try {
    quiet.run("COMMIT");
    ADD_FAILURE() << "the quiet session's transaction was committed after it was ended";
  } catch (const mysql::Error& e) {
    EXPECT_TRUE(e.connection_lost()) << e.what();
  }
}

TEST(MysqlStore, ThreeHostsMigrateAtOnce) {
  TestDatabase db;
  const int expected = mysql_migrations().back().version;
  std::vector<std::thread> threads;
  std::vector<int> versions(3, -1);
  std::vector<std::string> errors(3);
  std::atomic<bool> go{false};
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      try {
        auto store = db.open(2);  // opening migrates
        versions[i] = store->migrate();
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(errors[i], "") << "host " << i;
    EXPECT_EQ(versions[i], expected) << "host " << i;
  }
  auto c = db.app_session();
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(mysql_migrations().size()));
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '" +
                           db.name() + "' AND TABLE_NAME = 'jobs'"),
            1);
  // The text columns are MEDIUMTEXT: never LONGTEXT/JSON (env-recipe.md section 4).
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '" +
                           db.name() + "' AND DATA_TYPE IN ('longtext', 'longblob', 'json')"),
            0);
}

void apply_first_migrations(mysql::Connection& c, size_t count);  // with the upgrade tests below

// The named lock (GET_LOCK) that migrate() takes for `db`'s database.
std::string migration_lock(const TestDatabase& db) {
  return ("backhaul_migrate:" + db.name()).substr(0, 64);
}

// Polls the sessions on `db` (information_schema.PROCESSLIST, as the administrator) on a thread
// of its own until it is destroyed: how long the longest statement seen had run, and whether one
// waited for a named lock (GET_LOCK's state "User lock").
class SessionWatch {
 public:
  explicit SessionWatch(const TestDatabase& db)
      : root_(db.root_session()), db_(db.name()), thread_([this] { run(); }) {}
  ~SessionWatch() {
    done_ = true;
    thread_.join();
  }
  int64_t longest_s() const { return longest_s_; }
  bool saw_lock_wait() const { return lock_wait_; }

 private:
  void run() {
    try {
      while (!done_) {
        for (const mysql::Row& row :
             root_
                 ->one("SELECT TIME, STATE FROM information_schema.PROCESSLIST WHERE COMMAND = "
                       "'Query' AND DB = " +
                       mysql::quote(db_))
                 .rows) {
          longest_s_ = std::max<int64_t>(longest_s_, mysql::to_i64(row[0]));
          if (mysql::to_str(row[1]) == "User lock") lock_wait_ = true;
        }
        std::this_thread::sleep_for(20ms);
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "watching the sessions: " << e.what();
    }
  }

  std::unique_ptr<mysql::Connection> root_;
  std::string db_;
  std::atomic<bool> done_{false};
  std::atomic<int64_t> longest_s_{0};
  std::atomic<bool> lock_wait_{false};
  std::thread thread_;  // last: it reads the members above
};

// A migration statement may run longer than read-timeout: an ALTER copying a large jobs table.
// It ran on a pooled session, whose read timeout took it for a lost connection: migrate() ran
// again on a new session, which waited for the migration lock that the old one, its statement
// still running on the server, went on holding (and failed with "another process held the
// migration lock" once the statement outlasted that wait by 30 s). Here schema 0003 rewrites
// enough jobs for its UPDATE and its ALTER to run for seconds under read-timeout=1: the store
// waits for each statement on its one migration session. How many is found by doubling them until
// copying half of them took 1.5 s (at least 262,144; about 3.5 s each for the statements on the
// 2-vCPU machine of the project once, under 2 s on another day): the statements then rewrite
// twice that many rows.
TEST(MysqlStore, AMigrationStatementLongerThanTheReadTimeoutIsWaitedForNotTakenForALostConnection) {
  TestDatabase db;
  {
    auto c = db.app_session();
    apply_first_migrations(*c, 2);
    c->one(
        "INSERT INTO jobs (kind, status, max_attempts, run_after_ms, created_ms, updated_ms, "
        "payload) VALUES ('k', 'queued', 5, 1, 1, 1, '{}')");
    for (int doubling = 1; doubling <= 22; ++doubling) {  // at most 4,194,304 jobs
      const auto start = std::chrono::steady_clock::now();
      c->one(
          "INSERT INTO jobs (kind, status, max_attempts, run_after_ms, created_ms, updated_ms, "
          "payload) SELECT kind, status, max_attempts, run_after_ms, created_ms, updated_ms, "
          "payload FROM jobs");
      if (doubling >= 18 && std::chrono::steady_clock::now() - start >= 1500ms) break;
    }
  }
  SessionWatch watch(db);
  int version = 0;
  try {
    version = open_mysql_store(db.connection() + ";read-timeout=1", 2)->migrate();
  } catch (const StorageError& e) {
    ADD_FAILURE() << e.what();
  }
  EXPECT_EQ(version, mysql_migrations().back().version);
  EXPECT_FALSE(watch.saw_lock_wait())
      << "a new session of the store waited for the migration lock that its abandoned one held";
  EXPECT_GE(watch.longest_s(), 2)
      << "no migration statement ran for twice the read timeout: this machine needs more rows";
}

// A host that starts while another migrates waits for it, within migrate-wait, and then finds the
// work done. The wait was a fixed 30 s: hosts started together with one migrating a large
// database failed, although nothing was wrong.
TEST(MysqlStore, AHostWaitsWhileAnotherMigratesAndFindsTheWorkDone) {
  TestDatabase db;
  auto other = db.app_session();  // the other host
  const std::string lock = mysql::quote(migration_lock(db));
  ASSERT_EQ(scalar(*other, "SELECT GET_LOCK(" + lock + ", 0)"), 1);
  int version = 0;
  std::string error;
  std::atomic<bool> done{false};
  std::thread host([&] {
    try {
      version = open_mysql_store(db.connection() + ";migrate-wait=60", 2)->migrate();
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  {
    SessionWatch watch(db);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!watch.saw_lock_wait() && !done && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_TRUE(watch.saw_lock_wait()) << "the host did not wait for the migration lock";
  }
  apply_first_migrations(*other, mysql_migrations().size());
  other->one("SELECT RELEASE_LOCK(" + lock + ")");
  host.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(version, mysql_migrations().back().version);
  EXPECT_EQ(scalar(*other, "SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(mysql_migrations().size()));
}

// A host gives up after migrate-wait seconds (0: at once), with an error that says how long it
// waited and which session held the lock, doing what. The old error, after a fixed 30 s, named
// neither ("another process held the migration lock ... for 30 s").
TEST(MysqlStore, AHostGivesUpOnTheMigrationLockAfterMigrateWaitNamingItsHolder) {
  TestDatabase db;
  auto other = db.app_session();
  const int64_t other_id = scalar(*other, "SELECT CONNECTION_ID()");
  const std::string lock = mysql::quote(migration_lock(db));
  std::thread migrating([&] {
    try {
      other->one("SELECT GET_LOCK(" + lock + ", 0), SLEEP(60) AS a_long_migration");
    } catch (const std::exception&) {  // ended by the KILL QUERY below
    }
  });
  auto root = db.root_session();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (scalar(*root, "SELECT COALESCE(IS_USED_LOCK(" + lock + "), 0)") != other_id &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  for (int wait : {2, 0}) {
    const auto start = std::chrono::steady_clock::now();
    try {
      open_mysql_store(db.connection() + ";migrate-wait=" + std::to_string(wait), 1);
      ADD_FAILURE() << "opened while another session held the migration lock";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const size_t waited = what.find("waited ");
      EXPECT_NE(waited, std::string::npos) << what;
      if (waited != std::string::npos) {
        EXPECT_GE(std::atoi(what.c_str() + waited + 7), wait) << what;
      }
      EXPECT_NE(what.find(" s for the migration lock"), std::string::npos) << what;
      EXPECT_NE(what.find("held by connection " + std::to_string(other_id) + " ("),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("SLEEP(60) AS a_long_migration"), std::string::npos) << what;
      EXPECT_NE(what.find("migrate-wait="), std::string::npos) << what;
    }
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, std::chrono::seconds(wait));
    EXPECT_LT(took, std::chrono::seconds(wait + 5));
  }
  root->one("KILL QUERY " + std::to_string(other_id));
  migrating.join();
}

// What opening `db` throws once `edit` ran on it, migrated, or "" when it opens.
std::string refusal_after(const TestDatabase& db, const std::string& edit) {
  db.open(2).reset();
  db.app_session()->one(edit);
  try {
    db.open(2);
    return "";
  } catch (const StorageError& e) {
    return e.what();
  }
}

// A database a newer build migrated is refused, naming its version: this build would misread it.
TEST(MysqlStore, ADatabaseFromANewerBuildIsRefusedWithItsVersion) {
  TestDatabase db;
  const std::string error = refusal_after(
      db, "INSERT INTO schema_migrations (version, name, applied_ms) VALUES (999, 'future', 1)");
  EXPECT_NE(error.find("schema version 999, newer than this build's " +
                       std::to_string(mysql_migrations().back().version)),
            std::string::npos)
      << error;
}

// A database whose recorded history this build cannot stand behind is refused before any
// migration runs, naming the migration: here one recorded under another name (another build's
// migration 2), which this build would take for its own.
TEST(MysqlStore, ADatabaseWithAMigrationRecordedUnderAnotherNameIsRefusedNamingIt) {
  TestDatabase db;
  const std::string error =
      refusal_after(db, "UPDATE schema_migrations SET name = '0002_elsewhere' WHERE version = 2");
  EXPECT_NE(error.find("mysql: the database records schema migration 2 as '0002_elsewhere', but "
                       "this build's is '" +
                       std::string(mysql_migrations().at(1).name) + "'"),
            std::string::npos)
      << error;
  EXPECT_EQ(scalar(*db.app_session(), "SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(mysql_migrations().size()));
}

// --- claiming ------------------------------------------------------------------------------

// Brings a new database to the schema of an older build: its first `count` migrations, recorded
// as the runner records them.
void apply_first_migrations(mysql::Connection& c, size_t count) {
  c.one(
      "CREATE TABLE schema_migrations (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT "
      "NULL, applied_ms BIGINT NOT NULL) ENGINE = InnoDB");
  for (size_t m = 0; m < count; ++m) {
    const Migration& migration = mysql_migrations().at(m);
    for (const std::string& statement : split_sql_statements(migration.sql)) c.one(statement);
    c.one("INSERT INTO schema_migrations VALUES (" + std::to_string(migration.version) + ", '" +
          std::string(migration.name) + "', 1)");
  }
}

// Schema 0002 writes an attempt's row when it ends. A job running across the upgrade had its row
// opened by a schema-0001 claim: the migration moves it into the job row, so the job still shows
// one row per attempt, before and after its end. The migration also runs again after a crash
// that came between its ADD COLUMN and its record.
TEST(MysqlStore, AJobRunningAcrossTheAttemptRowUpgradeKeepsOneRowPerAttempt) {
  const auto& migrations = mysql_migrations();
  ASSERT_GE(migrations.size(), 2u);
  ASSERT_EQ(migrations[1].version, 2);
  TestDatabase db;
  {
    auto c = db.app_session();
    apply_first_migrations(*c, 1);
    // Attempt 1 failed; attempt 2 runs under token "tok".
    c->one(
        "INSERT INTO jobs (id, kind, concurrency_key, status, attempts, max_attempts, "
        "run_after_ms, lease_owner, lease_token, lease_expires_ms, created_ms, started_ms, "
        "updated_ms, payload) VALUES (1, 'entity', 'inst-1', 'running', 2, 5, 1000, 'old-host', "
        "'tok', 31000, 900, 1000, 1000, '{}')");
    c->one(
        "INSERT INTO job_attempts (job_id, attempt, owner, lease_token, started_ms, finished_ms, "
        "outcome, error) VALUES (1, 1, 'old-host', 'tok-1', 900, 950, 'failed', 'boom'), "
        "(1, 2, 'old-host', 'tok', 1000, 0, 'running', NULL)");
    c->one("INSERT INTO running_counts VALUES ('entity', 'inst-1', 1, 1)");
    c->one("INSERT INTO running_totals VALUES ('entity', 1, 1)");
    c->one("ALTER TABLE jobs ADD COLUMN attempt_no INT NOT NULL DEFAULT 0");  // then a crash
  }
  auto store = db.open(2);
  EXPECT_EQ(store->migrate(), migrations.back().version);

  auto history = store->attempts(1);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].outcome, "failed");
  EXPECT_EQ(history[1].attempt, 2);
  EXPECT_EQ(history[1].outcome, "running");
  EXPECT_EQ(history[1].owner, "old-host");

  store->complete(1, "tok", "{}", 2000);
  history = store->attempts(1);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[1].attempt, 2);
  EXPECT_EQ(history[1].outcome, "succeeded");
  EXPECT_EQ(history[1].started_ms, 1000);
  EXPECT_EQ(history[1].finished_ms, 2000);
  EXPECT_EQ(store->running("entity", "inst-1"), 0);

  // A job claimed after the upgrade: no row while it runs, one when it ends.
  JobId id = store->enqueue(spec("entity", "inst-1"), 3000).id;
  ClaimRequest r;
  r.owner = "new-host";
  r.limit = 1;
  r.now_ms = 3000;
  r.lease_ms = 30000;
  auto claimed = store->claim(r);
  ASSERT_EQ(claimed.size(), 1u);
  auto c = db.app_session();
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM job_attempts WHERE job_id = " + std::to_string(id)),
            0);
  history = store->attempts(id);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].outcome, "running");
  EXPECT_EQ(history[0].owner, "new-host");
  store->complete(id, claimed[0].lease_token, "{}", 4000);
  history = store->attempts(id);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].attempt, 1);
  EXPECT_EQ(history[0].outcome, "succeeded");
  EXPECT_EQ(history[0].finished_ms, 4000);
}

// Schemas 0003 and 0004 let claims and completions rewrite the job row in place: the columns they
// change are fixed-size, owner names move to lease_owners, and a completion's result goes into
// its attempt's row. Jobs from before keep what they were: a running job its owner and token (its
// worker can still heartbeat and complete it), a finished one its result and no lease. 0003 also
// runs again after a crash that came between its ADD COLUMN and its record.
TEST(MysqlStore, JobsFromBeforeTheInPlaceUpgradesKeepTheirLeasesAndResults) {
  const auto& migrations = mysql_migrations();
  ASSERT_GE(migrations.size(), 3u);
  ASSERT_EQ(migrations[2].version, 3);
  TestDatabase db;
  {
    auto c = db.app_session();
    apply_first_migrations(*c, 2);
    c->one(
        "INSERT INTO jobs (id, kind, status, attempts, attempt_no, max_attempts, run_after_ms, "
        "lease_owner, lease_token, lease_expires_ms, created_ms, started_ms, updated_ms, payload) "
        "VALUES (1, 'entity', 'running', 1, 1, 5, 1000, 'old-host', 'tok', 31000, 900, 1000, "
        "1000, '{}'), (2, 'entity', 'queued', 0, 0, 5, 1000, NULL, NULL, 0, 900, 0, 900, '{}'), "
        "(3, 'entity', 'succeeded', 1, 1, 5, 1000, NULL, NULL, 0, 900, 950, 990, '{}')");
    c->one("UPDATE jobs SET result = '{\"old\":3}' WHERE id = 3");
    c->one("INSERT INTO running_counts VALUES ('entity', '', 1, 1)");
    c->one("INSERT INTO running_totals VALUES ('entity', 1, 1)");
    c->one("ALTER TABLE jobs ADD COLUMN owner_id INT NOT NULL DEFAULT 0");  // then a crash
  }
  auto store = db.open(2);
  EXPECT_EQ(store->migrate(), migrations.back().version);
  auto c = db.app_session();
  EXPECT_EQ(scalar(*c,
                   "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                   "DATABASE() AND TABLE_NAME = 'jobs' AND DATA_TYPE = 'char' AND "
                   "((COLUMN_NAME = 'status' AND CHARACTER_MAXIMUM_LENGTH = 9) OR (COLUMN_NAME = "
                   "'lease_token' AND CHARACTER_MAXIMUM_LENGTH = 52 AND IS_NULLABLE = 'NO'))"),
            2);
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM jobs WHERE lease_owner IS NOT NULL"), 0);

  std::optional<Job> running = store->get(1);
  ASSERT_TRUE(running);
  EXPECT_EQ(running->status, JobStatus::kRunning);
  EXPECT_EQ(running->lease_owner, std::optional<std::string>("old-host"));
  EXPECT_EQ(running->lease_token, std::optional<std::string>("tok"));
  std::optional<Job> done = store->get(3);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, JobStatus::kSucceeded);
  EXPECT_FALSE(done->lease_owner);
  EXPECT_FALSE(done->lease_token);
  EXPECT_EQ(done->result, std::optional<std::string>("{\"old\":3}"));

  EXPECT_EQ(store->heartbeat(1, "tok", 2000, 30000, std::nullopt).lease_expires_ms, 32000);
  EXPECT_THROW(store->complete(1, "", "{}", 2500), LeaseLost);
  store->complete(1, "tok", "{\"new\":1}", 3000);
  EXPECT_EQ(store->get(1)->result, std::optional<std::string>("{\"new\":1}"));
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM jobs WHERE id = 1 AND result IS NULL"), 1);
  auto history = store->attempts(1);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].owner, "old-host");
  EXPECT_EQ(history[0].outcome, "succeeded");
  EXPECT_FALSE(store->get(1)->lease_token);

  // The same owner name claims again: one row of lease_owners serves it.
  ClaimRequest r;
  r.owner = "old-host";
  r.limit = 5;
  r.now_ms = 4000;
  auto claimed = store->claim(r);
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_EQ(claimed[0].job.id, 2);
  EXPECT_EQ(store->get(2)->lease_owner, std::optional<std::string>("old-host"));
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM lease_owners WHERE name = 'old-host'"), 1);
  store->complete(2, claimed[0].lease_token, "{}", 5000);
  EXPECT_EQ(store->running("entity", ""), 0);
}

TEST(MysqlStore, TwoStoresClaimDisjointJobsUnderContention) {
  TestDatabase db;
  auto a = db.open(8);
  auto b = db.open(8);
  constexpr int kJobs = 2000;
  std::vector<JobSpec> specs;
  for (int i = 0; i < kJobs; ++i) {
    specs.push_back(
        spec("bench", "k" + std::to_string(i % 10), "{\"i\":" + std::to_string(i) + "}"));
  }
  for (size_t i = 0; i < specs.size(); i += 500) {
    a->enqueue_batch({specs.begin() + static_cast<std::ptrdiff_t>(i),
                      specs.begin() + static_cast<std::ptrdiff_t>(i + 500)},
                     1000);
  }
  std::mutex mutex;
  std::multiset<JobId> claimed;
  std::atomic<int> done{0};
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    JobStore* store = t % 2 ? b.get() : a.get();
    threads.emplace_back([&, store, t] {
      try {
        int idle = 0;
        while (done < kJobs && idle < 200) {
          ClaimRequest r;
          r.owner = "host" + std::to_string(t % 2) + "-w" + std::to_string(t);
          r.limit = static_cast<size_t>(1 + (t + done) % 8);
          r.now_ms = 2000;
          std::vector<Claimed> got = store->claim(r);
          if (got.empty()) {
            ++idle;
            std::this_thread::sleep_for(5ms);
            continue;
          }
          idle = 0;
          {
            std::lock_guard<std::mutex> lock(mutex);
            for (const Claimed& c : got) claimed.insert(c.job.id);
          }
          for (const Claimed& c : got) {
            store->complete(c.job.id, c.lease_token, "{}", 2001);
            ++done;
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(claimed.size(), static_cast<size_t>(kJobs));
  std::set<JobId> unique(claimed.begin(), claimed.end());
  EXPECT_EQ(unique.size(), static_cast<size_t>(kJobs)) << "a job was claimed twice";
  auto counts = a->counts();
  EXPECT_EQ((counts[{"bench", JobStatus::kSucceeded}]), kJobs);
  auto c = db.app_session();
  EXPECT_EQ(scalar(*c, "SELECT COUNT(*) FROM job_attempts WHERE outcome = 'succeeded'"), kJobs);
  EXPECT_EQ(scalar(*c, "SELECT COUNT(DISTINCT job_id) FROM job_attempts"), kJobs);
}

// Caps per key and per kind hold across two hosts: the high-water marks recorded at claim time
// never exceed them, and neither does what the workers observe. "entity" is capped per key (2;
// three keys), "run" globally (3); workers claim any kind, three at a time.
TEST(MysqlStore, CapsHoldAcrossTwoStores) {
  TestDatabase db;
  auto a = db.open(8);
  auto b = db.open(8);
  constexpr int kPerKey = 2;
  constexpr int kGlobal = 3;
  constexpr int kJobs = 240;
  a->set_caps("entity", Caps{kPerKey, 0});
  b->set_caps("run", Caps{0, kGlobal});
  std::vector<JobSpec> specs;
  for (int i = 0; i < kJobs; ++i) {
    specs.push_back(i % 2 ? spec("entity", "inst" + std::to_string(i % 3))
                          : spec("run", "inst" + std::to_string(i % 5)));
  }
  a->enqueue_batch(specs, 1000);

  std::mutex mutex;
  // What the workers observe: claimed and not yet completed. Never above the truth, since a job
  // is counted after its claim committed and uncounted before its completion starts.
  std::map<std::string, int> running;
  std::map<std::string, int> max_seen;
  std::atomic<int> done{0};
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    JobStore* store = t % 2 ? b.get() : a.get();
    threads.emplace_back([&, store, t] {
      try {
        int idle = 0;
        while (done < kJobs && idle < 400) {
          ClaimRequest r;
          r.owner = "w" + std::to_string(t);
          r.limit = 3;
          r.now_ms = 2000;
          std::vector<Claimed> got = store->claim(r);
          if (got.empty()) {
            ++idle;
            std::this_thread::sleep_for(2ms);
            continue;
          }
          idle = 0;
          {
            std::lock_guard<std::mutex> lock(mutex);
            for (const Claimed& c : got) {
              for (const std::string& name :
                   {c.job.kind + "/" + c.job.concurrency_key, c.job.kind + "/*"}) {
                max_seen[name] = std::max(max_seen[name], ++running[name]);
              }
            }
          }
          std::this_thread::sleep_for(3ms);  // hold the slots for a while
          for (const Claimed& c : got) {
            {
              std::lock_guard<std::mutex> lock(mutex);
              --running[c.job.kind + "/" + c.job.concurrency_key];
              --running[c.job.kind + "/*"];
            }
            store->complete(c.job.id, c.lease_token, "{}", 2001);
            ++done;
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(done.load(), kJobs);
  int reached = 0;
  for (int i = 0; i < 3; ++i) {
    std::string key = "inst" + std::to_string(i);
    EXPECT_LE(max_seen["entity/" + key], kPerKey) << key;
    int recorded = b->max_running_seen("entity", key);
    EXPECT_LE(recorded, kPerKey) << key;
    EXPECT_GE(recorded, max_seen["entity/" + key]) << key;
    if (recorded == kPerKey) ++reached;
  }
  EXPECT_GT(reached, 0) << "no key ever reached its cap: the test exercised nothing";
  EXPECT_LE(a->max_running_seen("entity", ""), 3 * kPerKey);
  EXPECT_LE(max_seen["run/*"], kGlobal);
  int recorded_total = a->max_running_seen("run", "");
  EXPECT_LE(recorded_total, kGlobal);
  EXPECT_GE(recorded_total, max_seen["run/*"]);
  EXPECT_EQ(recorded_total, kGlobal) << "the global cap was never reached";
  EXPECT_EQ(a->running("entity", ""), 0);
  EXPECT_EQ(a->running("run", ""), 0);
}

// Every job of one tenant is ahead in claim order, but the tenant is at its cap: the claim goes
// past its backlog to the other tenant's job instead of coming back empty (SPEC D7).
TEST(MysqlStore, SaturatedKeyDoesNotStarveOthers) {
  TestDatabase db;
  auto store = db.open();
  store->set_caps("entity", Caps{1, 0});
  std::vector<JobSpec> specs;
  for (int i = 0; i < 50; ++i) specs.push_back(spec("entity", "big"));
  specs.push_back(spec("entity", "small"));
  store->enqueue_batch(specs, 1000);
  ClaimRequest r;
  r.owner = "w";
  r.limit = 10;
  r.now_ms = 2000;
  std::vector<Claimed> first = store->claim(r);
  ASSERT_EQ(first.size(), 2u);  // one per key: the cap is 1
  std::set<std::string> keys;
  for (const Claimed& c : first) keys.insert(c.job.concurrency_key);
  EXPECT_EQ(keys, (std::set<std::string>{"big", "small"}));
  EXPECT_TRUE(store->claim(r).empty());
  EXPECT_EQ(store->max_running_seen("entity", "big"), 1);
  EXPECT_EQ(store->max_running_seen("entity", ""), 2);
}

// Ten queued jobs of kind "k", and a session of its own that holds some of their rows (FOR
// UPDATE, by primary key only) until release().
class HeldRows {
 public:
  explicit HeldRows(const TestDatabase& db,
                    const std::vector<JobSpec>& specs = std::vector<JobSpec>(10, spec("k")))
      : store_(db.open()), holder_(db.app_session()) {
    for (const EnqueueResult& e : store_->enqueue_batch(specs, 1000)) ids_.push_back(e.id);
  }
  JobStore& store() { return *store_; }
  const std::vector<JobId>& ids() const { return ids_; }
  void hold(const std::vector<size_t>& which) {
    std::string list;
    for (size_t i : which) list += (list.empty() ? "" : ", ") + std::to_string(ids_[i]);
    holder_->one("START TRANSACTION");
    holder_->one("SELECT id FROM jobs FORCE INDEX (PRIMARY) WHERE id IN (" + list + ") FOR UPDATE");
  }
  void release() { holder_->one("ROLLBACK"); }
  std::vector<JobId> claim(size_t limit) {
    ClaimRequest r;
    r.owner = "w";
    r.limit = limit;
    r.now_ms = 2000;
    std::vector<JobId> taken;
    for (const Claimed& c : store_->claim(r)) {
      EXPECT_EQ(c.job.payload, "{}");
      taken.push_back(c.job.id);
    }
    return taken;
  }

 private:
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<mysql::Connection> holder_;
  std::vector<JobId> ids_;
};

// A claim reads its candidates without locks and then locks them by id; rows that another
// session holds are read as queued and skipped by the lock. The claim must still take the free
// jobs behind them, in claim order, and leave the held ones queued.
TEST(MysqlStore, AClaimTakesTheFreeJobsBehindRowsAnotherSessionHolds) {
  TestDatabase db;
  HeldRows jobs(db);
  const std::vector<JobId>& ids = jobs.ids();
  jobs.hold({0, 2, 3});
  EXPECT_EQ(jobs.claim(4), (std::vector<JobId>{ids[1], ids[4], ids[5], ids[6]}));
  // All the free ones: fewer than asked, none of the held ones.
  EXPECT_EQ(jobs.claim(10), (std::vector<JobId>{ids[7], ids[8], ids[9]}));
  jobs.release();
  EXPECT_EQ(jobs.claim(10), (std::vector<JobId>{ids[0], ids[2], ids[3]}));
  EXPECT_EQ(jobs.store().max_running_seen("k", ""), 10);
}

// Six held rows before the first free one, and a claim of one job: the reads past them grow (one
// candidate, then two, then four), and the lock takes only the first free one of the window.
TEST(MysqlStore, AOneJobClaimBehindManyHeldRowsStillFindsAFreeOne) {
  TestDatabase db;
  HeldRows jobs(db);
  jobs.hold({0, 1, 2, 3, 4, 5});
  EXPECT_EQ(jobs.claim(1), (std::vector<JobId>{jobs.ids()[6]}));
  EXPECT_EQ(jobs.claim(1), (std::vector<JobId>{jobs.ids()[7]}));  // ids[7] was not locked
  jobs.release();
}

// The jobs a claim takes past held rows are the first free ones in claim order (priority, then
// run_after, then id), not the lowest ids among them. Before, with the most urgent job held, a
// claim of one job read on and took the oldest, least urgent one, ahead of the second most urgent.
TEST(MysqlStore, AClaimPastAHeldRowTakesTheNextJobInClaimOrder) {
  TestDatabase db;
  std::vector<JobSpec> specs(3, spec("k"));
  for (int i : {0, 1, 2}) specs[static_cast<size_t>(i)].priority = std::vector{9, 0, 1}[i];
  HeldRows jobs(db, specs);
  const std::vector<JobId>& ids = jobs.ids();
  jobs.hold({1});
  EXPECT_EQ(jobs.claim(1), (std::vector<JobId>{ids[2]}));
  EXPECT_EQ(jobs.claim(1), (std::vector<JobId>{ids[0]}));
  jobs.release();
  EXPECT_EQ(jobs.claim(1), (std::vector<JobId>{ids[1]}));
}

// The same across kinds and priorities, with a kind of more priorities than are read one by one:
// each read past held rows starts after the last job read, in claim order, in every kind.
TEST(MysqlStore, AClaimPastHeldRowsOfSeveralKindsAndPrioritiesTakesTheNextInClaimOrder) {
  TestDatabase db;
  std::vector<JobSpec> specs;
  for (int p = 0; p < 10; ++p) {
    specs.push_back(spec("a"));
    specs.back().priority = p;
  }
  for (int p : {0, 1}) {
    specs.push_back(spec("b"));
    specs.back().priority = p;
  }
  HeldRows jobs(db, specs);
  const std::vector<JobId>& ids = jobs.ids();
  const auto a = [&](size_t p) { return ids[p]; };
  const auto b = [&](size_t p) { return ids[10 + p]; };
  jobs.hold({0, 10, 1, 11, 2, 3});  // the first six in claim order: a0 b0 a1 b1 a2 a3
  EXPECT_EQ(jobs.claim(2), (std::vector<JobId>{a(4), a(5)}));
  EXPECT_EQ(jobs.claim(10), (std::vector<JobId>{a(6), a(7), a(8), a(9)}));
  jobs.release();
  EXPECT_EQ(jobs.claim(10), (std::vector<JobId>{a(0), b(0), a(1), b(1), a(2), a(3)}));
}

// The same when capped jobs took places of the claim: the uncapped jobs read and passed over for
// them come before any read further on. Here a claim of 2 reads u1 and u2 and the capped c1, and
// chooses c1 and u1; u1 is held, and its place goes to u2, not to u3 beyond the first read.
TEST(MysqlStore, AClaimPastAHeldRowTakesTheUncappedJobsItPassedOverFirst) {
  TestDatabase db;
  std::vector<JobSpec> specs = {spec("u"), spec("u"), spec("u"), spec("c", "key")};
  for (int i : {0, 1, 2, 3}) specs[static_cast<size_t>(i)].priority = std::vector{5, 6, 7, 0}[i];
  {
    auto setup = db.open();
    Caps caps;
    caps.per_key = 1;
    setup->set_caps("c", caps);
  }
  HeldRows jobs(db, specs);
  const std::vector<JobId>& ids = jobs.ids();
  jobs.hold({0});
  std::vector<JobId> taken = jobs.claim(2);
  std::sort(taken.begin(), taken.end());
  EXPECT_EQ(taken, (std::vector<JobId>{ids[1], ids[3]}));
  jobs.release();
}

// A claim short of jobs because another session holds some reads on past its first window. The
// queue's head moves meanwhile (here: jobs enqueued ahead of everything, without pause), so the
// read on must start after the last job read, not at an OFFSET: at an OFFSET it read again jobs
// of the first window that it had locked already, and handed them out twice in one claim.
TEST(MysqlStore, AClaimReadingOnWhileJobsAreEnqueuedAheadHandsOutEachJobOnce) {
  TestDatabase db;
  auto store = db.open();
  auto producer = db.open(2);
  std::vector<JobSpec> specs(3000, spec("k"));
  for (JobSpec& s : specs) s.priority = 5;
  std::vector<JobId> ids;
  for (const EnqueueResult& e : store->enqueue_batch(specs, 1000)) ids.push_back(e.id);
  auto holder = db.app_session();
  holder->one("START TRANSACTION");
  holder->one("SELECT id FROM jobs FORCE INDEX (PRIMARY) WHERE id IN (" + std::to_string(ids[0]) +
              ", " + std::to_string(ids[1]) + ") FOR UPDATE");

  std::atomic<bool> stop{false};
  std::atomic<int> enqueued{0};
  std::string producer_error;
  std::thread ahead([&] {
    try {
      JobSpec first = spec("k");  // priority 0: ahead of every job above
      while (!stop) {
        producer->enqueue_batch({first}, 1000);
        ++enqueued;
      }
    } catch (const std::exception& e) {
      producer_error = e.what();
    }
  });
  std::set<JobId> handed_out;
  int twice = 0, claims = 0;
  ClaimRequest r;
  r.owner = "w";
  r.limit = 8;
  r.now_ms = 2000;
  while (claims < 300 && twice == 0) {
    ++claims;
    for (const Claimed& c : store->claim(r)) {
      if (!handed_out.insert(c.job.id).second) ++twice;
      EXPECT_NE(c.job.id, ids[0]);
      EXPECT_NE(c.job.id, ids[1]);
    }
  }
  stop = true;
  ahead.join();
  holder->one("ROLLBACK");
  EXPECT_EQ(producer_error, "");
  EXPECT_GT(enqueued.load(), 0);
  EXPECT_EQ(twice, 0) << "a job was handed out twice, in claim " << claims;
  // What the claims took is exactly what the store shows running.
  auto counts = store->counts();
  EXPECT_EQ((counts[{"k", JobStatus::kRunning}]), static_cast<int64_t>(handed_out.size()));
}

// --- failure handling ------------------------------------------------------------------------

// A transaction that InnoDB picks as a deadlock victim (1213) is re-run by the store, which then
// succeeds. The deadlock is provoked with a second session locking the same two rows in the
// opposite order; that session's transaction is made heavier (more undo) so that InnoDB rolls back
// the store's transaction rather than it.
TEST(MysqlStore, DeadlockVictimIsRetried) {
  TestDatabase db;
  auto store = db.open(2);
  EnqueueResult parent = store->enqueue(spec("run"), 1000);
  JobSpec child_spec = spec("entity");
  child_spec.parent_id = parent.id;
  EnqueueResult child = store->enqueue(child_spec, 1000);

  auto root = db.root_session();
  int64_t deadlocks_before =
      scalar(*root,
             "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE "
             "VARIABLE_NAME = 'INNODB_DEADLOCKS'");

  auto other = db.app_session();
  const int64_t other_id = scalar(*other, "SELECT CONNECTION_ID()");
  other->one("CREATE TABLE ballast (id INT AUTO_INCREMENT PRIMARY KEY, pad VARCHAR(64))");
  other->one("START TRANSACTION");
  for (int i = 0; i < 4; ++i) {  // CTEs recurse at most 1000 times by default
    other->one(
        "INSERT INTO ballast (pad) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM "
        "s WHERE n < 900) SELECT REPEAT('x', 60) FROM s");
  }
  other->one("SELECT id FROM jobs WHERE id = " + std::to_string(child.id) + " FOR UPDATE");

  // cancel(parent) locks the parent, then its child (held by `other`): it waits.
  std::atomic<bool> finished{false};
  CancelOutcome outcome = CancelOutcome::kAlreadyFinished;
  std::string error;
  std::thread canceller([&] {
    try {
      outcome = store->cancel(parent.id, 5000);
    } catch (const std::exception& e) {
      error = e.what();
    }
    finished = true;
  });
  auto deadline = std::chrono::steady_clock::now() + 20s;
  // The store's session executing (so: waiting in) its locking read of the child. (A row lock
  // wait shows in PROCESSLIST; INNODB_TRX does not list the transaction on MariaDB 10.11.)
  // `other` ran the same statement: its session can still show it for a moment after the
  // result came back (the server clears INFO after sending), so it is left out by its id.
  const std::string waiting =
      "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '" + db.name() +
      "' AND ID <> " + std::to_string(other_id) +
      " AND INFO LIKE 'SELECT % FROM jobs WHERE id = " + std::to_string(child.id) + " FOR UPDATE'";
  // Whatever happens below, `other` lets go and the canceller is joined.
  struct Cleanup {
    mysql::Connection& other;
    std::thread& canceller;
    ~Cleanup() {
      try {
        other.one("ROLLBACK");
      } catch (...) {
      }
      if (canceller.joinable()) canceller.join();
    }
  } cleanup{*other, canceller};
  while (scalar(*root, waiting) == 0) {
    ASSERT_FALSE(finished) << "cancel did not wait for the child's lock: " << error;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string sessions;
      for (const mysql::Row& row :
           root->one("SELECT ID, DB, COMMAND, STATE, INFO FROM information_schema.PROCESSLIST")
               .rows) {
        sessions += mysql::to_str(row[0]) + " " + mysql::to_str(row[1]) + " " +
                    mysql::to_str(row[2]) + " " + mysql::to_str(row[3]) + " " +
                    mysql::to_str(row[4]) + "\n";
      }
      FAIL() << "cancel never waited for the lock; sessions:\n" << sessions;
    }
    std::this_thread::sleep_for(10ms);
  }
  // Now `other` asks for the parent, which the store holds: a cycle. InnoDB rolls back the
  // lighter transaction (the store's), so this lock is granted.
  ASSERT_NO_THROW(
      other->one("SELECT id FROM jobs WHERE id = " + std::to_string(parent.id) + " FOR UPDATE"));
  other->one("COMMIT");
  canceller.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(outcome, CancelOutcome::kCancelled);
  EXPECT_EQ(store->get(parent.id)->status, JobStatus::kCancelled);
  EXPECT_EQ(store->get(child.id)->status, JobStatus::kCancelled);
  EXPECT_EQ(store->get(parent.id)->pending_children, 0);
  int64_t deadlocks_after =
      scalar(*root,
             "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE "
             "VARIABLE_NAME = 'INNODB_DEADLOCKS'");
  EXPECT_GT(deadlocks_after, deadlocks_before);
}

// The server drops every session of the store (as after a restart or wait_timeout): the next
// operations reconnect and succeed ("server has gone away" is retried, not reported).
TEST(MysqlStore, ReconnectsAfterConnectionsAreKilled) {
  TestDatabase db;
  auto store = db.open(4);
  EnqueueResult first = store->enqueue(spec("k"), 1000);
  ASSERT_TRUE(store->get(first.id));
  auto root = db.root_session();
  mysql::Result sessions =
      root->one("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = '" + db.name() + "'");
  ASSERT_FALSE(sessions.rows.empty());
  for (const mysql::Row& row : sessions.rows) {
    root->one("KILL CONNECTION " + mysql::to_str(row[0]));
  }
  EnqueueResult second = store->enqueue(spec("k"), 1000);
  EXPECT_TRUE(second.created);
  ClaimRequest r;
  r.owner = "w";
  r.limit = 5;
  r.now_ms = 2000;
  EXPECT_EQ(store->claim(r).size(), 2u);
}

// --- data ----------------------------------------------------------------------------------

TEST(MysqlStore, Utf8mb4RoundTrips) {
  TestDatabase db;
  auto store = db.open();
  const std::string text = "{\"emoji\":\"🚀🎉\",\"cjk\":\"漢字\",\"quote\":\"it's \\\"x\\\" \\\\ \"}";
  const std::string nul = std::string("a\0b", 3);
  JobSpec s = spec("kind-🚀", "inst-é-🎉", text + nul);
  s.dedupe_key = "dedupe-💡";
  EnqueueResult e = store->enqueue(s, 1000);
  ClaimRequest r;
  r.owner = "host-ü";
  r.limit = 1;
  r.now_ms = 2000;
  std::vector<Claimed> got = store->claim(r);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job.payload, text + nul);
  EXPECT_EQ(got[0].job.kind, "kind-🚀");
  store->heartbeat(e.id, got[0].lease_token, 2001, 30000, std::string("{\"cursor\":\"☃\"}"));
  store->complete(e.id, got[0].lease_token, "{\"done\":\"✅\"}", 2002);
  std::optional<Job> job = store->get(e.id);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->payload, text + nul);
  EXPECT_EQ(job->concurrency_key, "inst-é-🎉");
  EXPECT_EQ(job->dedupe_key, std::optional<std::string>("dedupe-💡"));
  EXPECT_EQ(job->checkpoint, std::optional<std::string>("{\"cursor\":\"☃\"}"));
  EXPECT_EQ(job->result, std::optional<std::string>("{\"done\":\"✅\"}"));
  EXPECT_EQ(job->lease_owner, std::nullopt);
  // Keys compare exactly (utf8mb4_bin): a differently-cased key is another key.
  JobSpec other = s;
  other.dedupe_key = "DEDUPE-💡";
  EXPECT_TRUE(store->enqueue(other, 1000).created);
}

TEST(MysqlStore, MediumTextCheckpointOfOneMebibyte) {
  TestDatabase db;
  auto store = db.open();
  std::string big(1 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 997) big[i] = static_cast<char>('a' + i % 26);
  std::string payload = "{\"pad\":\"" + std::string(512 * 1024, 'p') + "\"}";
  EnqueueResult e = store->enqueue(spec("k", "", payload), 1000);
  ClaimRequest r;
  r.owner = "w";
  r.limit = 1;
  r.now_ms = 2000;
  std::vector<Claimed> got = store->claim(r);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job.payload, payload);
  store->heartbeat(e.id, got[0].lease_token, 2001, 30000, big);
  EXPECT_EQ(store->get(e.id)->checkpoint, std::optional<std::string>(big));
  store->release(e.id, got[0].lease_token, 2002);
  r.now_ms = 3000;
  got = store->claim(r);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job.checkpoint, std::optional<std::string>(big));  // resumes from it (D11)
}

// enqueue_batch computes ids from multi-row INSERTs: each must be the row of its spec, with
// dedupe hits (existing and within the batch) in place. The 2498 new rows go as 1000 + 1000 and
// then 256 + 128 + 64 + 32 + 16 + 2 (the prepared widths).
TEST(MysqlStore, BatchIdsMatchTheirRows) {
  TestDatabase db;
  auto store = db.open();
  JobSpec existing = spec("k", "", "existing");
  existing.dedupe_key = "d1";
  EnqueueResult old = store->enqueue(existing, 1000);
  std::vector<JobSpec> specs;
  for (int i = 0; i < 2500; ++i) {
    JobSpec s = spec(i % 3 ? "a" : "b", "", "p" + std::to_string(i));
    if (i == 10) s.dedupe_key = "d1", s.kind = "k";  // an active job has it
    if (i == 20 || i == 23) s.dedupe_key = "d2";     // twice in the batch (kind "a")
    specs.push_back(s);
  }
  std::vector<EnqueueResult> results = store->enqueue_batch(specs, 1000);
  ASSERT_EQ(results.size(), specs.size());
  EXPECT_EQ(results[10].id, old.id);
  EXPECT_FALSE(results[10].created);
  EXPECT_TRUE(results[20].created);
  EXPECT_FALSE(results[23].created);
  EXPECT_EQ(results[23].id, results[20].id);
  std::set<JobId> ids;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (i == 10 || i == 23) continue;
    EXPECT_TRUE(ids.insert(results[i].id).second);
    std::optional<Job> job = store->get(results[i].id);
    ASSERT_TRUE(job) << i;
    EXPECT_EQ(job->payload, specs[i].payload) << i;
    EXPECT_EQ(job->kind, specs[i].kind) << i;
  }
  EXPECT_EQ(store->get(results.back().id)->payload, specs.back().payload);
}

// Eight threads enqueue the same dedupe key at once: one job is created and everyone gets its id
// (a racing INSERT hits the unique index and re-runs its transaction).
TEST(MysqlStore, ConcurrentDedupeCreatesOneJob) {
  TestDatabase db;
  auto a = db.open(4);
  auto b = db.open(4);
  for (int round = 0; round < 5; ++round) {
    std::vector<EnqueueResult> results(8);
    std::vector<std::string> errors(8);
    std::vector<std::thread> threads;
    std::atomic<bool> go{false};
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        while (!go) std::this_thread::yield();
        JobSpec s = spec("run", "inst");
        s.dedupe_key = "inst-" + std::to_string(round);
        try {
          results[t] = (t % 2 ? a : b)->enqueue(s, 1000);
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    go = true;
    for (auto& t : threads) t.join();
    int created = 0;
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(errors[t], "");
      EXPECT_EQ(results[t].id, results[0].id);
      created += results[t].created ? 1 : 0;
    }
    EXPECT_EQ(created, 1) << "round " << round;
  }
}

// Errors are stored even when they are not UTF-8 (a utf8mb4 column would refuse them).
TEST(MysqlStore, ErrorsThatAreNotUtf8AreStored) {
  TestDatabase db;
  auto store = db.open();
  EnqueueResult e = store->enqueue(spec("k"), 1000);
  ClaimRequest r;
  r.owner = "w";
  r.limit = 1;
  r.now_ms = 2000;
  std::vector<Claimed> got = store->claim(r);
  ASSERT_EQ(got.size(), 1u);
  Failure failure;
  failure.error = "HTTP 502: \xff\xfe\xc3 body \xe2\x82";
  failure.fatal = true;
  EXPECT_EQ(store->fail(e.id, got[0].lease_token, failure, 2001), JobStatus::kDead);
  std::optional<Job> job = store->get(e.id);
  EXPECT_EQ(job->last_error,
            std::optional<std::string>("HTTP 502: \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD body "
                                       "\xEF\xBF\xBD\xEF\xBF\xBD"));
  DeadLetterPage letters = store->list_dead_letters({});
  ASSERT_EQ(letters.items.size(), 1u);
  EXPECT_EQ(letters.items[0].error, *job->last_error);
}

// Expired leases are recovered once when two hosts sweep at once (SKIP LOCKED), and the fan-in
// count of the parent drops exactly once per child.
TEST(MysqlStore, ConcurrentSweepsRecoverEachLeaseOnce) {
  TestDatabase db;
  auto a = db.open(4);
  auto b = db.open(4);
  EnqueueResult parent = a->enqueue(spec("run"), 1000);
  ClaimRequest r;
  r.owner = "p";
  r.limit = 1;
  r.now_ms = 1000;
  r.kinds = {"run"};
  std::vector<Claimed> p = a->claim(r);
  ASSERT_EQ(p.size(), 1u);
  std::vector<JobSpec> children;
  for (int i = 0; i < 300; ++i) {
    JobSpec s = spec("entity");
    s.parent_id = parent.id;
    s.max_attempts = 1;
    children.push_back(s);
  }
  a->enqueue_batch(children, 1000);
  a->wait_for_children(parent.id, p[0].lease_token, 10'000'000, std::nullopt, 1001);
  ASSERT_EQ(a->get(parent.id)->pending_children, 300);
  r.owner = "crashing";
  r.limit = 300;
  r.kinds = {"entity"};
  r.lease_ms = 1000;
  ASSERT_EQ(a->claim(r).size(), 300u);
  SweepResult sa;
  SweepResult sb;
  std::thread ta([&] { sa = a->sweep(10'000); });
  std::thread tb([&] { sb = b->sweep(10'000); });
  ta.join();
  tb.join();
  EXPECT_EQ(sa.dead + sb.dead, 300);
  EXPECT_EQ(sa.requeued + sb.requeued, 0);
  std::optional<Job> after = a->get(parent.id);
  EXPECT_EQ(after->pending_children, 0);
  EXPECT_EQ(after->status, JobStatus::kQueued);  // woken by its last child
  EXPECT_EQ((a->dead_letter_stats()[{"entity", DeadLetterStatus::kPending}]), 300);
}

// --- interleavings with another session ---------------------------------------------------------

// Runs `op` on a new thread: the message of an exception it throws goes to `error`, and `done` is
// set once it has returned.
std::thread running(std::function<void()> op, std::string& error, std::atomic<bool>& done) {
  return std::thread([op = std::move(op), &error, &done] {
    try {
      op();
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
}

// A claim of at most `limit` jobs (of `kinds`, or any) by `owner` at `now`, with the default lease.
ClaimRequest claim_of(const std::string& owner, size_t limit, int64_t now,
                      std::vector<std::string> kinds = {}) {
  ClaimRequest r;
  r.owner = owner;
  r.limit = limit;
  r.now_ms = now;
  r.kinds = std::move(kinds);
  return r;
}

// Schema 0006 swaps the claim index of kinds without a cap (jobs_claim_kind, by kind, for
// jobs_claim). Each of its two statements may have run before a crash that left the migration
// unrecorded: it runs again over either, and the jobs queued across it are claimed in order.
TEST(MysqlStore, TheClaimIndexMigrationRunsAgainAfterACrashHalfway) {
  const auto& migrations = mysql_migrations();
  ASSERT_GE(migrations.size(), 6u);
  ASSERT_EQ(migrations[5].version, 6);
  const std::vector<std::string> statements = split_sql_statements(migrations[5].sql);
  ASSERT_EQ(statements.size(), 2u);
  for (size_t ran : {1u, 2u}) {
    SCOPED_TRACE(std::to_string(ran) + " statement(s) ran before the crash");
    TestDatabase db;
    auto c = db.app_session();
    apply_first_migrations(*c, 5);
    for (int priority : {3, -2}) {
      c->one(
          "INSERT INTO jobs (kind, concurrency_key, status, priority, max_attempts, run_after_ms, "
          "created_ms, updated_ms, payload) VALUES ('k', '', 'queued', " +
          std::to_string(priority) + ", 5, 1000, 1000, 1000, '{}')");
    }
    for (size_t i = 0; i < ran; ++i) c->one(statements[i]);
    std::unique_ptr<JobStore> store;
    ASSERT_NO_THROW(store = db.open());
    EXPECT_EQ(store->migrate(), migrations.back().version);
    const auto index_columns = [&](const std::string& index) {
      return scalar(*c,
                    "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = '" +
                        db.name() + "' AND TABLE_NAME = 'jobs' AND INDEX_NAME = '" + index + "'");
    };
    EXPECT_EQ(index_columns("jobs_claim_kind"), 5);
    EXPECT_EQ(index_columns("jobs_claim"), 0);
    std::vector<Claimed> got = store->claim(claim_of("w", 5, 2000, {"k"}));
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].job.priority, -2);
    EXPECT_EQ(got[1].job.priority, 3);
  }
}

// Waits until a session of `db` other than `except_id` matches `condition` on PROCESSLIST (a
// statement waiting for a lock shows there) and returns its id. 0 after 20 s, or once `done` is
// set (the operation returned without waiting).
int64_t session_where(const TestDatabase& db, const std::string& condition, int64_t except_id,
                      const std::atomic<bool>& done) {
  auto root = db.root_session();
  const std::string sql = "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = '" + db.name() +
                          "' AND ID <> " + std::to_string(except_id) + " AND " + condition +
                          " LIMIT 1";
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (true) {
    mysql::Result r = root->one(sql);
    if (!r.rows.empty()) return mysql::to_i64(r.rows[0][0]);
    if (done || std::chrono::steady_clock::now() > deadline) return 0;
    std::this_thread::sleep_for(5ms);
  }
}

// Waits until a session of `db` other than `except_id` is executing a statement LIKE `pattern`
// (see session_where).
bool waits_in(const TestDatabase& db, const std::string& pattern, int64_t except_id,
              const std::atomic<bool>& done) {
  return session_where(db, "INFO LIKE " + mysql::quote(pattern), except_id, done) != 0;
}

// Kills a job of kind `kind` at once (FATAL): it is dead with a pending letter, which is returned.
int64_t kill_one(JobStore& store, const JobSpec& s, int64_t now) {
  EnqueueResult e = store.enqueue(s, now);
  ClaimRequest r = claim_of("w", 1, now, {s.kind});
  std::vector<Claimed> got = store.claim(r);
  if (got.size() != 1 || got[0].job.id != e.id) throw std::runtime_error("kill_one: no claim");
  Failure f;
  f.error = "boom";
  f.fatal = true;
  if (store.fail(e.id, got[0].lease_token, f, now) != JobStatus::kDead) {
    throw std::runtime_error("kill_one: not dead");
  }
  for (const DeadLetter& l : store.list_dead_letters({}).items) {
    if (l.job_id == e.id) return l.id;
  }
  throw std::runtime_error("kill_one: no letter");
}

// A job of the key that ends on another host while cancel_key runs is not counted as cancelled: the
// count is of the jobs it cancelled or asked to stop. Before, it read the key's active jobs without
// locks, and counted one that had ended by the time it locked it.
TEST(MysqlStore, CancelKeyDoesNotCountAJobThatEndedWhileItRan) {
  TestDatabase db;
  auto store = db.open();
  const JobId ending = store->enqueue(spec("k", "a"), 1000).id;
  ASSERT_EQ(store->claim(claim_of("w", 1, 1000, {"k"})).size(), 1u);
  const JobId queued = store->enqueue(spec("k", "a"), 1000).id;
  auto other = db.app_session();  // another host, ending the running job
  other->one("START TRANSACTION");
  other->one("SELECT id FROM jobs WHERE id = " + std::to_string(ending) + " FOR UPDATE");
  std::atomic<bool> done{false};
  std::string error;
  int cancelled = -1;
  std::thread cancelling =
      running([&] { cancelled = store->cancel_key("a", "", 2000); }, error, done);
  auto root = db.root_session();
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (scalar(*root,
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = "
                "'LOCK WAIT'") == 0 &&
         !done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  try {
    other->one(
        "UPDATE jobs SET status = 'succeeded', finished_ms = 1500, lease_token = '' "
        "WHERE id = " +
        std::to_string(ending));
    other->one("COMMIT");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the other host's ending failed: " << e.what();
  }
  cancelling.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(cancelled, 1) << "the job that ended counted";
  EXPECT_EQ(store->get(ending)->status, JobStatus::kSucceeded);
  EXPECT_EQ(store->get(queued)->status, JobStatus::kCancelled);
}

// A bulk retry checks each letter's dedupe key with a plain read, and sends that letter's UPDATE
// (which makes the key active again) with the next letter's reads. A job with the same key that
// another session inserted but had not committed at the check makes that UPDATE wait and then
// fail with a duplicate key (1062) once it commits. The store must re-run the transaction (the
// letter then stays pending, as its duplicate is active) -- not fail the whole bulk retry.
TEST(MysqlStore, ABulkRetryRacingAnEnqueueOfTheSameDedupeKeyIsRetriedNotFailed) {
  TestDatabase db;
  auto store = db.open(4);
  const int64_t plain = kill_one(*store, spec("k"), 1000);  // older letter: retried second
  JobSpec deduped = spec("k");
  deduped.dedupe_key = "d";
  const int64_t keyed = kill_one(*store, deduped, 1000);  // newest letter: retried first
  ASSERT_GT(keyed, plain);

  auto other = db.app_session();
  const int64_t other_id = scalar(*other, "SELECT CONNECTION_ID()");
  other->one("START TRANSACTION");
  other->one(
      "INSERT INTO jobs (kind, concurrency_key, dedupe_key, active_dedupe_key, status, "
      "max_attempts, run_after_ms, created_ms, updated_ms, payload) VALUES ('k', '', 'd', 'd', "
      "'queued', 5, 1000, 1000, 1000, '{}')");
  std::atomic<bool> done{false};
  int retried = -1;
  std::string error;
  std::thread bulk =
      running([&] { retried = store->retry_dead_letters({}, 10, 2000); }, error, done);
  // The keyed job's UPDATE waits for `other`'s uncommitted row with the same key.
  const bool waited =
      waits_in(db, "UPDATE jobs SET status = 'queued', attempts = 0%", other_id, done);
  other->one("COMMIT");
  bulk.join();
  ASSERT_TRUE(waited) << "the bulk retry never waited for the other session's row: " << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(retried, 1);
  EXPECT_EQ(store->get_dead_letter(keyed)->status, DeadLetterStatus::kPending);
  EXPECT_EQ(store->get_dead_letter(plain)->status, DeadLetterStatus::kRetrying);
}

// prune() reads its candidates plainly (a dead job only when its letter is resolved or ignored)
// and then locks them; a dead job whose ignored letter was retried, and which died again before
// the lock (its letter pending again), must not be deleted. Here prune waits for a row another
// session holds while the job is retried and dies again.
TEST(MysqlStore, PruneKeepsADeadJobWhoseLetterBecamePendingWhileItLocked) {
  TestDatabase db;
  auto store = db.open(4);
  auto operator_store = db.open(4);
  // First in prune's order (lower id, same finished_ms): the row the other session holds.
  EnqueueResult held = store->enqueue(spec("done"), 1000);
  {
    ClaimRequest r = claim_of("w", 1, 1000, {"done"});
    std::vector<Claimed> got = store->claim(r);
    ASSERT_EQ(got.size(), 1u);
    store->complete(held.id, got[0].lease_token, "{}", 1000);
  }
  JobSpec s = spec("k");
  s.max_attempts = 1;
  const int64_t letter = kill_one(*store, s, 1000);
  const JobId job = store->get_dead_letter(letter)->job_id;
  store->ignore_dead_letter(letter, 1000);

  auto other = holding_row(db, held.id);
  const int64_t other_id = scalar(*other, "SELECT CONNECTION_ID()");
  std::atomic<bool> done{false};
  int64_t pruned = -1;
  std::string error;
  std::thread pruner = running([&] { pruned = store->prune(10'000); }, error, done);
  const bool waited = waits_in(db, "SELECT id FROM jobs WHERE id IN (%FOR UPDATE", other_id, done);
  if (waited) {
    // The operator retries the letter; the job runs and dies again: its letter is pending.
    operator_store->retry_dead_letter(letter, 2000);
    ClaimRequest r = claim_of("w2", 1, 2000, {"k"});
    std::vector<Claimed> got = operator_store->claim(r);
    EXPECT_EQ(got.size(), 1u);
    Failure f;
    f.error = "boom again";
    f.fatal = true;
    if (!got.empty()) operator_store->fail(job, got[0].lease_token, f, 3000);
  }
  other->one("ROLLBACK");
  pruner.join();
  ASSERT_TRUE(waited) << "prune never waited for the held row: " << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(store->get_dead_letter(letter)->status, DeadLetterStatus::kPending);
  std::optional<Job> after = store->get(job);
  ASSERT_TRUE(after.has_value()) << "prune deleted a dead job whose letter is pending";
  EXPECT_EQ(after->status, JobStatus::kDead);
  EXPECT_EQ(pruned, 1);  // the held, succeeded job only
}

// A claim of a kind without caps locks no job_caps row. When the kind is capped while such a
// claim is in flight (its jobs locked, not committed: here its COMMIT waits for a running_counts
// row another session holds), a claim on another host would count the kind's running jobs
// without it and take the whole cap on top of them. set_caps must wait for the claim in flight
// (schema 0005's claim_gate); the claim after it then finds the only slot taken.
TEST(MysqlStore, ACapSetWhileAnUncappedClaimIsInFlightHolds) {
  TestDatabase db;
  auto a = db.open(4);
  auto b = db.open(4);
  a->enqueue(spec("x", "k1"), 1000);
  auto other = db.app_session();
  const int64_t other_id = scalar(*other, "SELECT CONNECTION_ID()");
  other->one(
      "INSERT INTO running_counts (kind, concurrency_key, running, max_running) VALUES ('x', "
      "'k1', 0, 0), ('x', 'k2', 0, 0)");
  other->one("START TRANSACTION");
  other->one(
      "SELECT running FROM running_counts WHERE kind = 'x' AND concurrency_key = 'k1' FOR UPDATE");
  std::atomic<bool> claimed{false};
  size_t a_got = 0;
  std::string error;
  std::thread claimer =
      running([&] { a_got = a->claim(claim_of("a", 1, 2000)).size(); }, error, claimed);
  const bool claim_waited = waits_in(db, "INSERT INTO running_counts%", other_id, claimed);
  std::atomic<bool> capped{false};
  std::thread capper = running([&] { b->set_caps("x", Caps{0, 1}); }, error, capped);
  // set_caps waits for the claim in flight (it holds the gate in share mode). Without that wait,
  // the cap is in force at once, and a claim now would run while the first has not committed.
  const bool cap_waited =
      claim_waited && waits_in(db, "SELECT id FROM claim_gate%FOR UPDATE", other_id, capped);
  if (!cap_waited) capper.join();
  JobSpec ahead = spec("x", "k2");
  ahead.priority = -1;
  size_t b_got = 0;
  auto claim_b = [&] {
    b->enqueue(ahead, 2000);
    ClaimRequest r = claim_of("b", 1, 2000);
    b_got = b->claim(r).size();
  };
  if (!cap_waited && claim_waited) claim_b();  // the race, as it was
  other->one("ROLLBACK");
  claimer.join();
  if (cap_waited) {
    capper.join();
    claim_b();
  }
  ASSERT_TRUE(claim_waited) << "the first claim never waited for the held counter: " << error;
  EXPECT_TRUE(cap_waited) << "set_caps did not wait for the claim in flight";
  EXPECT_EQ(error, "");
  EXPECT_EQ(a_got, 1u);
  EXPECT_EQ(b_got, 0u) << "claimed while the kind's only slot was taken";
  EXPECT_LE(a->running("x", ""), 1);
  EXPECT_LE(a->max_running_seen("x", ""), 1);
}

// --- failures: lock waits and connections lost during a commit -----------------------------

// A lock wait timeout (1205) means a row stayed held for innodb_lock_wait_timeout (50 s by
// default): re-running it like a deadlock (at once, up to 25 times) made one call wait about
// 20 minutes -- and with group commit, every completion of the process behind it.
TEST(MysqlStore, ARowHeldPastTheLockWaitTimeoutFailsTheCallAfterOneRetryNotTwentyFive) {
  TestDatabase db;
  // This store's sessions wait 1 s for a row lock (the server's other sessions are untouched).
  auto store = open_mysql_store(db.connection() + ";lock-wait-timeout=1", 2);
  EnqueueResult e = store->enqueue(spec("k"), 1000);
  std::vector<Claimed> got = store->claim(claim_of("w", 1, 1000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  auto other = holding_row(db, e.id);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(store->heartbeat(e.id, got[0].lease_token, 2000, 30'000, std::nullopt),
               StorageError);
  const auto waited = std::chrono::steady_clock::now() - start;
  other->one("ROLLBACK");
  EXPECT_LT(waited, 5s) << "a held row made heartbeat wait "
                        << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                        << " ms with a lock wait timeout of 1 s";
  EXPECT_EQ(store->heartbeat(e.id, got[0].lease_token, 3000, 30'000, std::nullopt).lease_expires_ms,
            33'000);
}

// A database already migrated opens with a user that may only read and write rows (an operator's
// least-privilege runtime account): opening it runs no DDL. It failed with "CREATE command
// denied" (CREATE TABLE IF NOT EXISTS is checked for the privilege even when the table exists).
TEST(MysqlStore, AMigratedDatabaseOpensWithAUserThatMayOnlyReadAndWriteRows) {
  TestDatabase db;
  db.open(1);                                        // migrates
  const std::string user = db.name().substr(0, 32);  // the server's limit for user names
  auto root = db.root_session();
  root->one("CREATE USER '" + user + "'@'127.0.0.1' IDENTIFIED BY 'rows-only'");
  struct DropUser {
    mysql::Connection& root;
    std::string user;
    ~DropUser() {
      try {
        root.one("DROP USER IF EXISTS '" + user + "'@'127.0.0.1'");
      } catch (const std::exception& e) {
        ADD_FAILURE() << "cannot drop user " << user << ": " << e.what();
      }
    }
  } drop{*root, user};
  root->one("GRANT SELECT, INSERT, UPDATE, DELETE ON `" + db.name() + "`.* TO '" + user +
            "'@'127.0.0.1'");
  mysql::Config config = mysql::parse_config(db.connection());
  std::string connection = "host=" + config.host + ";port=" + std::to_string(config.port) +
                           ";db=" + db.name() + ";user=" + user + ";password=rows-only";
  std::unique_ptr<JobStore> store;
  try {
    store = open_mysql_store(connection, 1);
  } catch (const std::exception& e) {
    FAIL() << "a migrated database did not open for a rows-only user: " << e.what();
  }
  const EnqueueResult e = store->enqueue(spec("k", "key"), 1000);
  std::vector<Claimed> got = store->claim(claim_of("w", 1, 1000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  store->complete(e.id, got[0].lease_token, "{}", 2000);
  EXPECT_EQ(store->get(e.id)->status, JobStatus::kSucceeded);
}

// A process a plugin starts must not inherit the store's sessions: holding one open, it would keep
// a transaction this side gave up on by closing its connection (and that transaction's locks)
// alive on the server.
TEST(MysqlStore, ItsSessionsAreClosedOnExec) {
  TestDatabase db;
  const uint16_t port = mysql::parse_config(db.connection()).port;
  ASSERT_NE(port, 0) << "the test server is reached over TCP";
  const testing::Connections before = testing::connections_to(port);  // the test's own
  std::unique_ptr<JobStore> store = open_mysql_store(db.connection(), 2);
  store->enqueue(spec("k", "key"), 1000);
  EXPECT_EQ(store->claim(claim_of("w", 1, 1000, {"k"})).size(), 1u);
  const testing::Connections now = testing::connections_to(port);
  EXPECT_GT(now.open, before.open) << "the store's sessions";
  EXPECT_EQ(now.inheritable, before.inheritable) << "of the store's " << now.open - before.open;
}

// A TCP relay on 127.0.0.1 between a store and the server. hold_replies() stops passing on the
// server's bytes of the connections open now (they wait in the socket buffers); cut() closes
// those connections. Together: the store loses its connection after the server did what it
// sent -- a COMMIT that applied, whose reply was never read. Later connections relay as usual.
class Relay {
 public:
  explicit Relay(unsigned server_port) : server_port_(server_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener_ < 0) throw std::runtime_error("relay: socket");
    sockaddr_in address = loopback(0);
    socklen_t length = sizeof address;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ::close(listener_);
      throw std::runtime_error("relay: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~Relay() {
    stop_ = true;
    acceptor_.join();
    for (std::thread& pump : pumps_) pump.join();
    for (int fd : kept_) ::close(fd);
    ::close(listener_);
  }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  unsigned port() const { return port_; }
  void hold_replies() { held_ = generation_.load(); }
  void cut() { ++generation_; }
  // Cuts the clients' side only: the store sees its connections lost, while the server's sessions
  // live on, the statement under way included (as after a client's read timeout on a slow COMMIT).
  void cut_clients_only() {
    abandoned_ = generation_.load();
    ++generation_;
  }
  // The server "stops": open connections are cut and new ones closed at once, until up().
  void down() {
    refusing_ = true;
    cut();
  }
  void up() { refusing_ = false; }
  int refused() const { return refused_; }

 private:
  static sockaddr_in loopback(unsigned port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    return address;
  }
  void accept_loop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      if (refusing_) {
        ++refused_;
        ::close(client);
        continue;
      }
      int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address = loopback(server_port_);
      if (server < 0 ||
          ::connect(server, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        ::close(client);
        if (server >= 0) ::close(server);
        continue;
      }
      const int on = 1;  // as the client and the server do: no Nagle delay on small packets
      ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      const int generation = generation_.load();
      pumps_.emplace_back([this, client, server, generation] { pump(client, server, generation); });
    }
  }
  void pump(int client, int server, int generation) {
    std::vector<char> buffer(1 << 16);
    while (!stop_ && generation_ == generation) {
      const bool held = held_ == generation;
      pollfd p[2] = {{client, POLLIN, 0}, {server, static_cast<short>(held ? 0 : POLLIN), 0}};
      int n = ::poll(p, 2, 10);
      if (n < 0) break;
      if (n == 0) continue;
      if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && !forward(client, server, buffer)) break;
      // Read again: hold_replies() may have come during the poll, before the reply it must hold
      // arrived (a reply forwarded then was seen by the store, whose call did not fail).
      if (!held && held_ != generation && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
          !forward(server, client, buffer)) {
        break;
      }
    }
    ::shutdown(client, SHUT_RDWR);
    ::close(client);
    if (abandoned_ == generation) {
      std::lock_guard lock(kept_mutex_);
      kept_.push_back(server);  // closed by the destructor
      return;
    }
    ::shutdown(server, SHUT_RDWR);
    ::close(server);
  }
  static bool forward(int from, int to, std::vector<char>& buffer) {
    ssize_t n = ::recv(from, buffer.data(), buffer.size(), 0);
    if (n <= 0) return false;
    for (ssize_t sent = 0; sent < n;) {
      ssize_t k = ::send(to, buffer.data() + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
      if (k <= 0) return false;
      sent += k;
    }
    return true;
  }

  unsigned server_port_;
  int listener_ = -1;
  unsigned port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> generation_{0};
  std::atomic<int> held_{-1};
  std::atomic<int> abandoned_{-1};
  std::mutex kept_mutex_;
  std::vector<int> kept_;  // server sides of abandoned connections
  std::atomic<bool> refusing_{false};
  std::atomic<int> refused_{0};
  std::thread acceptor_;
  std::list<std::thread> pumps_;  // only the acceptor adds, until it is joined
};

// The connection string with host= and port= pointing at 127.0.0.1:`port` (a later key wins).
std::string through(const std::string& connection, unsigned port) {
  return connection + ";host=127.0.0.1;port=" + std::to_string(port);
}

// A database with two stores on it: `store`, whose connections pass through `relay`, and
// `direct`, whose do not.
struct ThroughRelay {
  TestDatabase db;
  std::unique_ptr<JobStore> direct = db.open(2);
  Relay relay{mysql::parse_config(db.connection()).port};
  std::unique_ptr<JobStore> store = open_mysql_store(through(db.connection(), relay.port()), 2);
};

// Holds the row of running_counts that the COMMIT trip of a job's exit updates last, until
// the store waits for it; then lets it go with the relay holding the replies, waits until the
// transaction is visible as committed (`committed`, a COUNT that becomes 1), and cuts the
// relay: the store's COMMIT applied, but its connection died before it read the reply. With
// `stay_down`, the relay refuses connections from then on, until up().
// Returns false when the store never waited for the row.
template <class Running>
bool commit_then_lose_reply(const TestDatabase& db, Relay& relay, const std::string& kind,
                            const std::string& key, const std::string& committed,
                            std::atomic<bool>& done, Running&& start, bool stay_down = false) {
  auto other = db.app_session();
  const int64_t other_id = scalar(*other, "SELECT CONNECTION_ID()");
  other->one("START TRANSACTION");
  other->one("SELECT running FROM running_counts WHERE kind = " + mysql::quote(kind) +
             " AND concurrency_key = " + mysql::quote(key) + " FOR UPDATE");
  start();
  const bool waited = waits_in(db, "%running_counts%", other_id, done);
  if (waited) relay.hold_replies();
  other->one("ROLLBACK");
  if (waited) {
    auto check = db.app_session();
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (scalar(*check, committed) != 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
  }
  if (stay_down) {
    relay.down();
  } else {
    relay.cut();
  }
  return waited;
}

// finish() of two running jobs of kind "k" in one call, a completion and a failure, whose COMMIT
// applies and whose reply is lost (commit_then_lose_reply). With `read_back_fails`, the server
// cannot be reached either until the store's read-back of the outcome (5 sessions) has given up.
// Both items must be reported applied, with their outcomes.
void expect_a_finish_losing_its_reply_reported_applied(bool read_back_fails) {
  ThroughRelay t;
  EnqueueResult a = t.direct->enqueue(spec("k", "key"), 1000);
  EnqueueResult b = t.direct->enqueue(spec("k", "key"), 1000);
  std::map<JobId, std::string> token;
  for (const Claimed& c : t.direct->claim(claim_of("w", 2, 1000, {"k"}))) {
    token[c.job.id] = c.lease_token;
  }
  ASSERT_EQ(token.size(), 2u);
  std::vector<Finish> items(2);
  items[0].kind = Finish::Kind::kComplete;
  items[0].id = a.id;
  items[0].token = token[a.id];
  items[0].result_json = "{\"ok\":1}";
  items[1].kind = Finish::Kind::kFail;
  items[1].id = b.id;
  items[1].token = token[b.id];
  items[1].failure.error = "try again";
  std::atomic<bool> done{false};
  std::vector<FinishResult> results;
  std::string error;
  std::thread finisher;
  const bool waited = commit_then_lose_reply(
      t.db, t.relay, "k", "key",
      "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(a.id) + " AND status = 'succeeded'",
      done,
      [&] { finisher = running([&] { results = t.store->finish(items, 2000); }, error, done); },
      read_back_fails);
  if (read_back_fails) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (t.relay.refused() < 5 && !done && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_GE(t.relay.refused(), 5);
    t.relay.up();
  }
  finisher.join();
  ASSERT_TRUE(waited) << "finish never waited for the held counter: " << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(t.direct->get(a.id)->status, JobStatus::kSucceeded);
  EXPECT_EQ(t.direct->get(b.id)->status, JobStatus::kQueued);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[0].lease_lost) << "applied, reported lost: " << results[0].error;
  EXPECT_EQ(results[0].status, std::optional<JobStatus>(JobStatus::kSucceeded)) << results[0].error;
  EXPECT_FALSE(results[1].lease_lost) << "applied, reported lost: " << results[1].error;
  EXPECT_EQ(results[1].status, std::optional<JobStatus>(JobStatus::kQueued)) << results[1].error;
}

// finish() sends a completion and a failure in one transaction. Its COMMIT applies but the
// connection is lost before the reply: the outcome is unknown to the store, which must not
// report the items as not applied (lease_lost) when they were.
TEST(MysqlStore, AFinishWhoseCommitAppliedButWhoseReplyWasLostReportsItsItemsApplied) {
  expect_a_finish_losing_its_reply_reported_applied(/*read_back_fails=*/false);
}

// Runs `call` (a store call whose COMMIT trip updates the running_counts row ('k', 'key')) on a
// thread, so that its COMMIT applies and its reply is lost (see commit_then_lose_reply);
// `committed` is the COUNT that becomes 1 once it applied. Returns the call's error ("" if none).
std::string call_losing_reply(ThroughRelay& t, const std::string& committed,
                              std::function<void()> call, bool stay_down) {
  std::atomic<bool> done{false};
  std::string error;
  std::thread caller;
  const bool waited = commit_then_lose_reply(
      t.db, t.relay, "k", "key", committed, done,
      [&] { caller = running(std::move(call), error, done); }, stay_down);
  caller.join();
  EXPECT_TRUE(waited) << "the call never waited for the held counter: " << error;
  return error;
}

// A claim at 2000 of the one job of kind "k" whose COMMIT applies and whose reply is lost;
// returns what the claim returned and its error ("" if none).
std::vector<Claimed> claim_losing_reply(ThroughRelay& t, JobId job, std::string& error,
                                        bool stay_down = false) {
  t.db.app_session()->one(
      "INSERT INTO running_counts (kind, concurrency_key, running, max_running) VALUES ('k', "
      "'key', 0, 0)");  // the row the claim's COMMIT trip updates, for the holder to lock
  std::vector<Claimed> got;
  error = call_losing_reply(
      t, "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(job) + " AND status = 'running'",
      [&] { got = t.store->claim(claim_of("w", 1, 2000, {"k"})); }, stay_down);
  return got;
}

// The same when the server cannot be reached for the store's read-back of the outcome, and is
// back by the time the items would run again: they are settled first, by their attempts' rows, and
// reported applied. Before, they ran again, found their jobs ended, and reported their leases
// lost: the completion of a job that succeeded was logged as not recorded.
TEST(MysqlStore, AFinishWhoseOutcomeCouldNotBeReadIsSettledBeforeItsItemsRunAgain) {
  expect_a_finish_losing_its_reply_reported_applied(/*read_back_fails=*/true);
}

// A claim whose COMMIT applied but whose reply was lost returns its jobs: reported as failed,
// they would stay leased to nobody until the sweep took them back, counting an attempt that
// never ran (a job with one attempt would be dead without having run).
TEST(MysqlStore, AClaimWhoseCommitAppliedButWhoseReplyWasLostReturnsItsJobs) {
  ThroughRelay t;
  EnqueueResult a = t.direct->enqueue(spec("k", "key"), 1000);
  std::string error;
  std::vector<Claimed> got = claim_losing_reply(t, a.id, error);
  EXPECT_EQ(error, "") << "the claim applied";
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job.id, a.id);
  Job job = *t.direct->get(a.id);
  EXPECT_EQ(job.status, JobStatus::kRunning);
  EXPECT_EQ(job.lease_token, got[0].lease_token) << "the lease returned is the one in force";
  t.store->complete(a.id, got[0].lease_token, "{}", 3000);
  EXPECT_EQ(t.direct->get(a.id)->status, JobStatus::kSucceeded);
}

// The same, with the server unreachable from then on: the claim cannot tell whether it applied
// and fails. Its job, leased under a token nobody holds, is released (no attempt counted) by the
// store's next claim once the server is back, which takes it again; before, it waited for its
// lease to expire and the sweep counted an attempt that never ran.
TEST(MysqlStore, AClaimWhoseOutcomeCouldNotBeReadHasItsJobsReleasedByTheNextClaim) {
  ThroughRelay t;
  EnqueueResult a = t.direct->enqueue(spec("k", "key"), 1000);
  std::string error;
  EXPECT_TRUE(claim_losing_reply(t, a.id, error, true).empty());
  EXPECT_NE(error.find("outcome unknown"), std::string::npos) << error;
  const std::string lost_token = t.direct->get(a.id)->lease_token.value_or("");
  ASSERT_EQ(t.direct->get(a.id)->status, JobStatus::kRunning) << "the claim applied";
  t.relay.up();
  std::vector<Claimed> again = t.store->claim(claim_of("w", 1, 3000, {"k"}));
  ASSERT_EQ(again.size(), 1u) << "the job is still leased under the lost token";
  EXPECT_EQ(again[0].job.id, a.id);
  EXPECT_EQ(again[0].job.attempts, 1) << "the lost claim counted no attempt";
  EXPECT_NE(again[0].lease_token, lost_token);
  t.store->complete(a.id, again[0].lease_token, "{}", 4000);
  EXPECT_EQ(t.direct->get(a.id)->status, JobStatus::kSucceeded);
}

// complete() at 2000 of job `job` (claimed under `token`, kind "k") whose COMMIT applies and whose
// reply is lost; returns complete()'s error ("" if none).
std::string complete_losing_reply(ThroughRelay& t, JobId job, const std::string& token,
                                  bool stay_down = false) {
  return call_losing_reply(
      t,
      "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(job) + " AND status = 'succeeded'",
      [&] { t.store->complete(job, token, "{\"ok\":1}", 2000); }, stay_down);
}

// complete() alone: its COMMIT applied and the reply was lost. The store can find out (the
// attempt's row, written by that transaction, carries the lease token) instead of reporting an
// error whose retry by the caller ends in LeaseLost for a job that succeeded.
TEST(MysqlStore, ACompletionWhoseCommitAppliedButWhoseReplyWasLostSucceeds) {
  ThroughRelay t;
  EnqueueResult a = t.direct->enqueue(spec("k", "key"), 1000);
  std::vector<Claimed> got = t.direct->claim(claim_of("w", 1, 1000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  const std::string error = complete_losing_reply(t, a.id, got[0].lease_token);
  EXPECT_EQ(t.direct->get(a.id)->status, JobStatus::kSucceeded);
  EXPECT_EQ(error, "") << "the completion applied";
}

// The connection of a completion is lost while its COMMIT trip waits for a row another session
// holds: the dead letter of the job, which the completion of a job retried from it resolves ahead
// of writing its attempt's row. The store's read-back waits for that transaction (through the
// job's row, which it holds) and finds it applied. Before, it read the attempt's row alone, not
// there yet, took the completion for not applied, and ran it again, which found its job ended
// once the first had committed: "lease lost" for a completion that applied.
TEST(MysqlStore, ACompletionLostWhileItsCommitWaitsForARowIsFoundApplied) {
  ThroughRelay t;
  const int64_t letter = kill_one(*t.direct, spec("k", "key"), 1000);
  t.direct->retry_dead_letter(letter, 1100);
  std::vector<Claimed> got = t.direct->claim(claim_of("w", 1, 1200, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  auto holder = t.db.app_session();
  const int64_t holder_id = scalar(*holder, "SELECT CONNECTION_ID()");
  holder->one("START TRANSACTION");
  holder->one("SELECT id FROM dead_letters WHERE id = " + std::to_string(letter) + " FOR UPDATE");
  std::atomic<bool> done{false};
  std::string error;
  std::thread completing = running(
      [&] { t.store->complete(got[0].job.id, got[0].lease_token, "{}", 1300); }, error, done);
  const int64_t first = session_where(t.db, "INFO LIKE '%dead_letters%'", holder_id, done);
  if (first != 0) t.relay.cut_clients_only();
  // The store reads back, or runs the completion again: either locks the job's row, and waits.
  const int64_t next =
      first == 0 ? 0
                 : session_where(t.db,
                                 "ID <> " + std::to_string(first) +
                                     " AND INFO LIKE '%FROM jobs%' AND (INFO LIKE '%FOR UPDATE%' "
                                     "OR INFO LIKE '%SHARE MODE%')",
                                 holder_id, done);
  holder->one("ROLLBACK");
  completing.join();
  EXPECT_NE(first, 0) << "the completion never waited for the letter's row: " << error;
  EXPECT_NE(next, 0) << "the store neither read back nor completed again: " << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(t.direct->get(got[0].job.id)->status, JobStatus::kSucceeded);
}

// The same for the endings that take one transaction each (a parent waiting for its children,
// and a failure, a deferral or a release when finish() runs them one by one): an ending that
// applied is reported applied, not as an error whose retry would end in "lease lost".
TEST(MysqlStore, EndingsWhoseCommitAppliedButWhoseReplyWasLostSucceed) {
  ThroughRelay t;
  const EnqueueResult parent = t.direct->enqueue(spec("k", "key"), 1000);
  JobSpec child = spec("child", "key");
  child.parent_id = parent.id;
  t.direct->enqueue(child, 1000);
  std::vector<Claimed> got = t.direct->claim(claim_of("w", 1, 1000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  std::string error = call_losing_reply(
      t,
      "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(parent.id) +
          " AND status = 'waiting'",
      [&] {
        t.store->wait_for_children(parent.id, got[0].lease_token, 10'000, std::nullopt, 2000);
      },
      false);
  EXPECT_EQ(t.direct->get(parent.id)->status, JobStatus::kWaiting);
  EXPECT_EQ(error, "") << "the wait applied";

  const EnqueueResult failing = t.direct->enqueue(spec("k", "key"), 3000);
  got = t.direct->claim(claim_of("w", 1, 3000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].job.id, failing.id);
  Failure failure;
  failure.error = "try again";
  JobStatus status = JobStatus::kRunning;
  error = call_losing_reply(
      t,
      "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(failing.id) +
          " AND status = 'queued' AND last_error = 'try again'",
      [&] { status = t.store->fail(failing.id, got[0].lease_token, failure, 4000); }, false);
  EXPECT_EQ(error, "") << "the failure applied";
  EXPECT_EQ(status, JobStatus::kQueued);

  got = t.direct->claim(claim_of("w", 1, 5000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  error = call_losing_reply(
      t,
      "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(failing.id) +
          " AND status = 'queued' AND run_after_ms = 9000",
      [&] { t.store->defer(failing.id, got[0].lease_token, 9000, "rate limited", 6000); }, false);
  EXPECT_EQ(error, "") << "the deferral applied";
}

// The same, with the server gone right after the COMMIT: the store cannot read whether the
// completion applied, and reports an error (transient). Sent again once the server is back (as
// the scheduler's finisher does), the completion is reported applied -- it was -- instead of
// "lease lost"; the store settles it by the attempt row that carries its token. Only once: a
// later completion under that token is an ordinary stale one.
TEST(MysqlStore, ACompletionWhoseOutcomeCouldNotBeReadIsReportedAppliedWhenSentAgain) {
  ThroughRelay t;
  EnqueueResult a = t.direct->enqueue(spec("k", "key"), 1000);
  std::vector<Claimed> got = t.direct->claim(claim_of("w", 1, 1000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  const std::string error = complete_losing_reply(t, a.id, got[0].lease_token, true);
  ASSERT_EQ(t.direct->get(a.id)->status, JobStatus::kSucceeded) << "the completion applied";
  EXPECT_NE(error, "") << "the store could not have told";
  t.relay.up();
  std::vector<Finish> again(1);
  again[0].kind = Finish::Kind::kComplete;
  again[0].id = a.id;
  again[0].token = got[0].lease_token;
  again[0].result_json = "{\"ok\":1}";
  std::vector<FinishResult> results = t.store->finish(again, 3000);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, JobStatus::kSucceeded) << results[0].error;
  EXPECT_FALSE(results[0].lease_lost);
  EXPECT_EQ(t.direct->attempts(a.id).size(), 1u) << "applied once";
  EXPECT_THROW(t.store->complete(a.id, got[0].lease_token, "{}", 4000), LeaseLost);
}

// The same for the other endings: a parent's wait for its children, and a failure and a deferral
// sent through finish() as the scheduler's finisher sends them. Each, sent again once the server
// is back, is reported applied with the outcome it had, instead of "lease lost"; only once.
TEST(MysqlStore, AnEndingWhoseOutcomeCouldNotBeReadIsReportedAppliedWhenSentAgain) {
  ThroughRelay t;
  const EnqueueResult parent = t.direct->enqueue(spec("k", "key"), 1000);
  JobSpec child = spec("child", "key");
  child.parent_id = parent.id;
  t.direct->enqueue(child, 1000);
  std::vector<Claimed> got = t.direct->claim(claim_of("w", 1, 1000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  const std::string parent_token = got[0].lease_token;
  std::string error = call_losing_reply(
      t,
      "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(parent.id) +
          " AND status = 'waiting'",
      [&] { t.store->wait_for_children(parent.id, parent_token, 10'000, std::nullopt, 2000); },
      true);
  ASSERT_EQ(t.direct->get(parent.id)->status, JobStatus::kWaiting) << "the wait applied";
  EXPECT_NE(error, "") << "the store could not have told";
  t.relay.up();
  EXPECT_NO_THROW(t.store->wait_for_children(parent.id, parent_token, 10'000, std::nullopt, 3000));
  EXPECT_THROW(t.store->wait_for_children(parent.id, parent_token, 10'000, std::nullopt, 3000),
               LeaseLost)
      << "settled once";

  const EnqueueResult failing = t.direct->enqueue(spec("k", "key"), 3000);
  got = t.direct->claim(claim_of("w", 1, 3000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].job.id, failing.id);
  // `items` through finish() at `now`, its COMMIT applied (`committed` counts 1) and its reply
  // and then the server lost; the same sent again once the server is back.
  std::vector<Finish> items(1);
  auto finish_twice = [&](const std::string& committed, int64_t now) {
    const std::string lost = call_losing_reply(
        t, "SELECT COUNT(*) FROM jobs WHERE id = " + std::to_string(failing.id) + committed,
        [&] {
          const FinishResult r = t.store->finish(items, now).at(0);
          if (!r.status) throw std::runtime_error(r.error);
        },
        true);
    EXPECT_NE(lost, "") << "the store could not have told";
    t.relay.up();
    return t.store->finish(items, now + 1000).at(0);
  };
  items[0].kind = Finish::Kind::kFail;
  items[0].id = failing.id;
  items[0].token = got[0].lease_token;
  items[0].failure.error = "try again";
  FinishResult again = finish_twice(" AND status = 'queued' AND last_error = 'try again'", 4000);
  EXPECT_EQ(again.status, JobStatus::kQueued) << again.error;
  EXPECT_FALSE(again.lease_lost);

  got = t.direct->claim(claim_of("w", 1, 6000, {"k"}));
  ASSERT_EQ(got.size(), 1u);
  items[0].kind = Finish::Kind::kDefer;
  items[0].token = got[0].lease_token;
  items[0].until_ms = 9000;
  items[0].reason = "rate limited";
  again = finish_twice(" AND status = 'queued' AND run_after_ms = 9000", 7000);
  EXPECT_EQ(again.status, JobStatus::kQueued) << again.error;
  again = t.store->finish(items, 8000).at(0);
  EXPECT_TRUE(again.lease_lost) << "settled once";
  EXPECT_EQ(t.direct->attempts(failing.id).size(), 2u) << "each ending applied once";
}

// A scheduler (4 workers, claims of 4) running `jobs` jobs of kind "outage" on a store that
// reaches the server through the relay, so a test can cut it off. Each handler takes 10 ms, so an
// outage finds jobs running with their endings to come, and counts its calls per job.
struct OutageRun {
  OutageRun(int jobs, int max_attempts, int64_t sweep_interval_ms) {
    std::vector<JobSpec> specs(jobs, spec("outage", "key"));
    for (JobSpec& s : specs) s.max_attempts = max_attempts;
    t.direct->enqueue_batch(specs, 1000);
    options.owner = "outage-host";
    options.workers = 4;
    options.claim_batch = 4;
    options.idle_poll_ms = 20;
    options.sweep_interval_ms = sweep_interval_ms;
    scheduler = std::make_unique<Scheduler>(*t.store, clock, options);
    scheduler->register_handler("outage", [this](JobContext& c) {
      std::this_thread::sleep_for(10ms);
      std::lock_guard lock(mutex);
      ++calls[c.job().id];
      return Outcome::complete();
    });
    scheduler->start();
  }
  int64_t count(const std::string& status) {
    return scalar(*t.db.app_session(),
                  "SELECT COUNT(*) FROM jobs WHERE status = " + mysql::quote(status));
  }
  // Waits until `n` jobs have succeeded, or the deadline (60 s from the start) has passed.
  void wait_for_succeeded(int64_t n) {
    while (count("succeeded") < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
  }

  ThroughRelay t;
  FakeClock clock;
  SchedulerOptions options;
  std::mutex mutex;
  std::map<JobId, int> calls;
  const std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::now() + 60s;
  std::unique_ptr<Scheduler> scheduler;  // last: its handler uses the members above
};

// Bad input (issue 4): the store goes away mid-run. For 3 s the server cannot be reached -- every
// connection is cut, new ones are closed at once -- while a scheduler runs jobs on it. Claims and
// endings fail and are retried; once the server is back, every job has succeeded, each handler ran
// once and no attempt was counted for the outage (the jobs' clock stands still: no lease ran out).
TEST(MysqlStore, ASchedulerRunsEveryJobOnceAcrossAServerOutageShorterThanTheLease) {
  constexpr int kJobs = 300;
  OutageRun run(kJobs, JobSpec{}.max_attempts, SchedulerOptions{}.sweep_interval_ms);
  run.wait_for_succeeded(kJobs / 4);
  run.t.relay.down();
  std::this_thread::sleep_for(3s);
  const int64_t during = run.count("succeeded");
  run.t.relay.up();
  run.wait_for_succeeded(kJobs);
  run.scheduler->drain(1s);
  EXPECT_GT(run.t.relay.refused(), 0)
      << "the store never tried to reach the server while it was down";
  EXPECT_LT(during, kJobs) << "the outage came after the last job";
  EXPECT_EQ(run.count("succeeded"), kJobs);
  EXPECT_EQ(scalar(*run.t.db.app_session(), "SELECT COUNT(*) FROM jobs WHERE attempts <> 1"), 0)
      << "an attempt was counted for the outage";
  EXPECT_EQ(run.calls.size(), static_cast<size_t>(kJobs));
  for (const auto& [id, n] : run.calls) EXPECT_EQ(n, 1) << "job " << id << " ran " << n << " times";
}

// Bad input (issue 4): the store goes away from one host for longer than the leases, and another
// host's sweep takes back the jobs it held (the attempt counted). The endings it writes once the
// server is back find their leases lost, and those jobs run again. Every job succeeds, none is lost
// or dead, and no handler ran more often than its job was claimed: each run is counted once.
TEST(MysqlStore, ASchedulerLosesNoJobAcrossAServerOutageLongerThanTheLease) {
  constexpr int kJobs = 200;
  OutageRun run(kJobs, /*max_attempts=*/5, /*sweep_interval_ms=*/50);
  run.wait_for_succeeded(kJobs / 4);
  run.t.relay.down();
  std::this_thread::sleep_for(1s);
  run.clock.advance_ms(run.options.lease_ms + 1);  // every lease held when it went away runs out
  // Another host, which still reaches the server, sweeps first: this host's endings, written once
  // it reaches the server again, find their leases taken.
  const SweepResult swept = run.t.direct->sweep(run.clock.now_ms());
  EXPECT_GT(swept.requeued, 0) << "no lease was held when the server went away";
  EXPECT_EQ(swept.dead, 0);
  run.t.relay.up();
  run.wait_for_succeeded(kJobs);
  run.scheduler->drain(1s);
  EXPECT_GT(run.t.relay.refused(), 0)
      << "the store never tried to reach the server while it was down";
  EXPECT_EQ(run.count("succeeded"), kJobs);
  EXPECT_EQ(run.count("dead"), 0);
  mysql::Result rows = run.t.db.app_session()->one("SELECT id, attempts FROM jobs");
  ASSERT_EQ(rows.rows.size(), static_cast<size_t>(kJobs));
  int taken_back = 0;
  std::lock_guard lock(run.mutex);
  for (const auto& row : rows.rows) {
    const JobId id = mysql::to_i64(row[0]);
    const int attempts = mysql::to_int(row[1]);
    EXPECT_GE(run.calls[id], 1) << "job " << id << " succeeded without running";
    EXPECT_LE(run.calls[id], attempts) << "job " << id << " ran more often than it was claimed";
    if (attempts > 1) ++taken_back;
  }
  EXPECT_GT(taken_back, 0) << "no lease ran out during the outage: the test proves nothing";
}

// --- a read-only server ---------------------------------------------------------------------

// The ids of the sessions open on the test's database (the store's own, outside any test session).
std::set<int64_t> sessions_on(const TestDatabase& db) {
  std::set<int64_t> ids;
  for (const mysql::Row& row :
       db.root_session()
           ->one("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = '" + db.name() + "'")
           .rows) {
    ids.insert(mysql::to_i64(row[0]));
  }
  return ids;
}

// A store of one session on `db` (its id: `sessions`, checked to be the only one) with job `id`,
// of kind "k", that "w" claimed at 1000 under `token` (its lease until `lease_expires_ms`).
struct OneSessionRunningAJob {
  // `options`: more keys for the connection string (";read-timeout=2").
  explicit OneSessionRunningAJob(const TestDatabase& db, const std::string& options = "")
      : store(open_mysql_store(db.connection() + options, 1)) {
    id = store->enqueue(spec("k"), 1000).id;
    std::vector<Claimed> claimed = store->claim(claim_of("w", 1, 1000, {"k"}));
    sessions = sessions_on(db);
    if (claimed.size() != 1 || sessions.size() != 1) {
      throw std::runtime_error(std::to_string(claimed.size()) + " jobs claimed, " +
                               std::to_string(sessions.size()) + " sessions open");
    }
    token = claimed[0].lease_token;
    lease_expires_ms = claimed[0].lease_expires_ms;
  }
  std::unique_ptr<JobStore> store;
  JobId id = 0;
  std::string token;
  int64_t lease_expires_ms = 0;
  std::set<int64_t> sessions;
};

// What a store call run on another thread (throwing()) threw, once `done` is set.
struct Thrown {
  std::atomic<bool> done{false};
  std::string error;  // empty when it returned
  bool transient = false;
  bool lock_conflict = false;
  bool interrupted = false;
  bool outage = false;
  bool commit_unknown = false;
};

// Runs `op` on a new thread (see running()), keeping what a StorageError it throws tells.
std::thread throwing(std::function<void()> op, Thrown& thrown) {
  return running(
      [op = std::move(op), &thrown] {
        try {
          op();
        } catch (const StorageError& e) {
          thrown.transient = e.transient();
          thrown.lock_conflict = e.lock_conflict();
          thrown.interrupted = e.interrupted();
          thrown.outage = e.outage();
          thrown.commit_unknown = dynamic_cast<const mysql::CommitUnknown*>(&e) != nullptr;
          throw;
        }
      },
      thrown.error, thrown.done);
}

// A server-wide state that `begin` (statements of the administrator) sets and `undo` ends, at
// end() or the end of the scope, whatever fails in between.
class ServerWide {
 public:
  ServerWide(const TestDatabase& db, const std::string& begin, std::string undo)
      : root_(db.root_session()), undo_(std::move(undo)) {
    root_->run(begin);
  }
  ~ServerWide() {
    try {
      end();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the server stays as it was set (" << undo_ << " failed): " << e.what();
    }
  }
  ServerWide(const ServerWide&) = delete;
  ServerWide& operator=(const ServerWide&) = delete;
  void end() {
    if (ended_) return;
    root_->one(undo_);
    ended_ = true;
  }

 private:
  std::unique_ptr<mysql::Connection> root_;
  std::string undo_;
  bool ended_ = false;
};

// The server's max_allowed_packet at 1 MiB for the scope: the sessions opened in it see it.
ServerWide small_packets(const TestDatabase& db) {
  const int64_t packet = scalar(*db.root_session(), "SELECT @@max_allowed_packet");
  return ServerWide(db, "SET GLOBAL max_allowed_packet = 1048576",
                    "SET GLOBAL max_allowed_packet = " + std::to_string(packet));
}

// The server read-only (SET GLOBAL read_only).
class ReadOnlyServer : public ServerWide {
 public:
  explicit ReadOnlyServer(const TestDatabase& db)
      : ServerWide(db, "SET GLOBAL read_only = 1", "SET GLOBAL read_only = 0") {}
};

// A primary switched to read-only while a failover is under way refuses every write (1290). The
// store reports that as transient, so its callers retry (the finisher while the leases last)
// instead of dropping a completion, and it replaces the session, which behind a proxy or a moved
// address may reach the new primary. Registered RUN_SERIAL (CMakeLists.txt): read_only is global.
TEST(MysqlReadOnly, WritesRefusedByAReadOnlyServerAreTransientAndTheSessionIsReplaced) {
  TestDatabase db;
  OneSessionRunningAJob job(db);
  auto& store = job.store;

  ReadOnlyServer read_only(db);

  Finish done;
  done.kind = Finish::Kind::kComplete;
  done.id = job.id;
  done.token = job.token;
  done.result_json = "{}";
  std::vector<FinishResult> results = store->finish({done}, 2000);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].retryable) << results[0].error;
  EXPECT_FALSE(results[0].lease_lost) << results[0].error;
  EXPECT_NE(results[0].error.find("read-only"), std::string::npos) << results[0].error;
  try {
    store->enqueue(spec("k"), 2000);
    ADD_FAILURE() << "a read-only server took an enqueue";
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.transient()) << e.what();
  }
  EXPECT_EQ(store->get(job.id)->status, JobStatus::kRunning);  // reads go on

  read_only.end();
  results = store->finish({done}, 3000);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, std::optional<JobStatus>(JobStatus::kSucceeded)) << results[0].error;
  const std::set<int64_t> after = sessions_on(db);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after, job.sessions) << "the session that met read-only was kept";
}

// The sessions opened on the server so far (one more for asking).
int64_t connections_so_far(const TestDatabase& db) {
  return mysql::to_i64(
      db.root_session()->one("SHOW GLOBAL STATUS LIKE 'Connections'").rows.at(0).at(1));
}

// A write that read-only refuses in the round trip that ends with COMMIT (purge_dead_letters
// sends its DELETE and COMMIT together) did nothing, and the server said so: it is not a
// connection lost during the commit (an unknown outcome, never re-run), and it is run again on
// new sessions like any other refused write (found by review).
TEST(MysqlReadOnly, AWriteRefusedInTheCommitTripIsRetriedNotAnUnknownOutcome) {
  TestDatabase db;
  auto store = db.open(1);
  ReadOnlyServer read_only(db);
  const int64_t before = connections_so_far(db);
  try {
    store->purge_dead_letters(2000);
    ADD_FAILURE() << "a read-only server took a purge";
  } catch (const mysql::CommitUnknown& e) {
    ADD_FAILURE() << "reported as an unknown outcome: " << e.what();
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.transient()) << e.what();
    EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
  }
  EXPECT_GT(connections_so_far(db) - before - 1, 1) << "the purge was not run again";
}

// A scheduler over a server turned read-only: its claims of a due job fail while reads still
// answer, and stats().store_failures (what /health/ready reads) names them, since the first
// failure, until the server takes writes again and a claim succeeds.
TEST(MysqlReadOnly, ASchedulerReportsItsFailingClaimsUntilTheServerTakesWritesAgain) {
  TestDatabase db;
  auto store = db.open(2);
  FakeClock clock(1'000'000);
  JobSpec later = spec("k");
  later.run_after_ms = clock.now_ms() + 1'000;
  const JobId id = store->enqueue(later, clock.now_ms()).id;
  SchedulerOptions o;
  o.owner = "w";
  o.workers = 1;
  o.idle_poll_ms = 20;
  Scheduler scheduler(*store, clock, o);
  std::atomic<int> runs{0};
  scheduler.register_handler("k", [&](JobContext&) {
    ++runs;
    return Outcome::complete();
  });
  scheduler.start();
  auto claims = [&]() -> std::optional<StoreFailure> {
    const SchedulerStats stats = scheduler.stats();
    auto it = stats.store_failures.find("claim");
    if (it == stats.store_failures.end()) return std::nullopt;
    return it->second;
  };
  auto wait_until = [](auto&& done) {
    for (int i = 0; i < 600 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  {
    // Claims fail from now on (their locking reads already, the job due or not).
    ReadOnlyServer read_only(db);
    clock.advance_ms(1'000);  // the job is due
    wait_until([&] { return claims() && claims()->failures >= 2; });
    ASSERT_TRUE(claims());
    const int64_t since_ms = claims()->since_ms;
    EXPECT_LE(since_ms, clock.now_ms());
    clock.advance_ms(1'000);
    const int64_t failures = claims()->failures;
    wait_until([&] { return claims()->failures > failures; });
    EXPECT_EQ(claims()->since_ms, since_ms) << "failing since the first failure";
    EXPECT_EQ(claims()->last_ms, clock.now_ms());
    EXPECT_NE(claims()->error.find("read-only"), std::string::npos) << claims()->error;
    EXPECT_EQ(store->get(id)->status, JobStatus::kQueued) << "reads go on";
    EXPECT_EQ(store->circuit("gateway").state, "closed") << "what /metrics reads";
    EXPECT_EQ(runs.load(), 0);
  }
  wait_until([&] { return store->get(id)->status == JobStatus::kSucceeded; });
  EXPECT_EQ(store->get(id)->status, JobStatus::kSucceeded);
  EXPECT_FALSE(claims()) << claims()->error;
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A scheduler over MySQL, one of whose running jobs has its row held by another session (an
// operator's open transaction, say): that job's heartbeat waits for the lock (the server's lock
// wait, 50 s by default, more than the lease here), and the other jobs' beats go on meanwhile, so
// their leases do not run out (found by review: beats went one after another, and the ones behind
// the waiting beat lost their leases; the sweep would count an attempt and run them twice).
TEST(MysqlScheduler, AHeartbeatWaitingForAHeldRowHoldsUpNoOtherJobsBeats) {
  TestDatabase db;
  auto store = db.open();
  FakeClock clock(1'000'000);
  std::vector<JobId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(store->enqueue(spec("k"), clock.now_ms()).id);
  SchedulerOptions o;
  o.owner = "w";
  o.workers = 3;
  o.lease_ms = 1'000;
  o.heartbeat_interval_ms = 200;
  o.sweep_interval_ms = 3'600'000;
  Scheduler scheduler(*store, clock, o);
  std::atomic<int> running{0};
  std::atomic<bool> release{false};
  scheduler.register_handler("k", [&](JobContext&) {
    ++running;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Outcome::complete();
  });
  auto wait_until = [](auto&& done) {
    for (int i = 0; i < 200 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return done();
  };
  std::unique_ptr<mysql::Connection> holder;
  struct Release {  // before the scheduler is joined, whatever fails below
    std::atomic<bool>& handlers;
    std::unique_ptr<mysql::Connection>& holder;
    ~Release() {
      if (holder) holder->one("ROLLBACK");
      handlers = true;
    }
  } let_go{release, holder};
  scheduler.start();
  ASSERT_TRUE(wait_until([&] { return running.load() == 3; }));
  const int64_t claimed_ms = clock.now_ms();
  holder = holding_row(db, ids[0]);
  for (int step = 1; step <= 4; ++step) {  // 800 ms of the 1 s leases
    clock.advance_ms(o.heartbeat_interval_ms);
    for (JobId id : {ids[1], ids[2]}) {
      ASSERT_TRUE(wait_until([&] {
        return store->get(id)->lease_expires_ms == clock.now_ms() + o.lease_ms;
      })) << "job "
          << id << " was not renewed at step " << step << " while job " << ids[0]
          << "'s beat waited for its row";
    }
  }
  EXPECT_EQ(store->get(ids[0])->lease_expires_ms, claimed_ms + o.lease_ms) << "its beat waits";
  const HeartbeatLanes lanes = scheduler.stats().heartbeats;  // what /metrics shows
  EXPECT_GE(lanes.busy, 1);  // another lane may not have cleared its finished beat yet
  EXPECT_EQ(lanes.oldest_job, ids[0]);
  EXPECT_GE(lanes.oldest_ms, 2 * o.heartbeat_interval_ms) << "made at step 1 or 2, now step 4";
  holder->one("ROLLBACK");
  holder.reset();
  // Its beat goes through now, and the next ones find the job's lease theirs.
  clock.advance_ms(o.heartbeat_interval_ms);
  EXPECT_TRUE(wait_until(
      [&] { return store->get(ids[0])->lease_expires_ms == clock.now_ms() + o.lease_ms; }));
  release = true;
  EXPECT_TRUE(wait_until([&] {
    for (JobId id : ids) {
      if (store->get(id)->status != JobStatus::kSucceeded) return false;
    }
    return true;
  }));
  scheduler.drain(std::chrono::milliseconds(1'000));
  for (JobId id : ids) EXPECT_EQ(store->get(id)->attempts, 1) << "job " << id;
}

// --- values and limits the server refuses -----------------------------------------------------

// complete() is group-committed: calls from many threads share transactions. One stale lease
// and one result larger than the server's max_allowed_packet (here 1 MiB) fail alone; every other
// completion in their batches commits.
TEST(MysqlServerWide, GroupedCompletionsFailOnlyTheirBadOps) {
  TestDatabase db;
  ServerWide small = small_packets(db);
  auto store = db.open(8);  // its sessions see the small packet
  std::vector<JobSpec> specs(24, spec("k"));
  store->enqueue_batch(specs, 1000);
  ClaimRequest r;
  r.owner = "w";
  r.limit = 24;
  r.now_ms = 2000;
  std::vector<Claimed> got = store->claim(r);
  ASSERT_EQ(got.size(), 24u);
  const std::string too_large(2u << 20, 'x');  // under kMaxTextBytes: for the server to refuse
  std::vector<std::string> outcome(got.size());
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      std::string token = i == 5 ? got[i].lease_token + "-stale" : got[i].lease_token;
      const std::string& result = i == 9 ? too_large : std::string("{\"i\":1}");
      try {
        store->complete(got[i].job.id, token, result, 3000);
        outcome[i] = "ok";
      } catch (const LeaseLost&) {
        outcome[i] = "lease lost";
      } catch (const StorageError&) {
        outcome[i] = "storage error";
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < got.size(); ++i) {
    std::string expected = i == 5 ? "lease lost" : i == 9 ? "storage error" : "ok";
    EXPECT_EQ(outcome[i], expected) << i;
    JobStatus status = store->get(got[i].job.id)->status;
    EXPECT_EQ(status, expected == "ok" ? JobStatus::kSucceeded : JobStatus::kRunning) << i;
  }
  EXPECT_EQ(store->running("k", ""), 2);
  EXPECT_EQ(store->max_running_seen("k", ""), 24);
  auto c = db.app_session();
  EXPECT_EQ(scalar(*c, "SELECT running FROM running_totals WHERE kind = 'k'"), 2);
}

// A value larger than the server's max_allowed_packet (here 1 MiB; 16 MiB by default, which a
// MEDIUMTEXT's worth of text reaches once quoted) can never be stored. (A value over a MEDIUMTEXT,
// kMaxTextBytes, is refused before any statement: JobStoreConformance.TextsAreUtf8Of...) The server
// closes the connection on such a statement, before the client has sent it all when it is well
// over the limit, and the store took that for a lost connection (found by review): an enqueue was
// sent four times more and then reported transient, and a heartbeat or an ending, whose statement
// goes with its COMMIT, became an unknown outcome, transient too -- the scheduler kept sending it
// for as long as the lease lasted, and a heartbeat round took the store for down. It is a refusal,
// as a result that is not UTF-8 is.
TEST(MysqlServerWide, AValueLargerThanTheServersPacketLimitIsRefusedNotTakenForALostConnection) {
  TestDatabase db;
  ServerWide small = small_packets(db);
  const std::string huge(2u << 20, 'x');  // under kMaxTextBytes: for the server to refuse
  OneSessionRunningAJob job(db);          // its session sees the small packet
  auto& store = job.store;
  const JobId id = job.id;
  const std::string& token = job.token;

  try {
    store->enqueue(spec("k", "", huge), 2000);
    ADD_FAILURE() << "a payload over max_allowed_packet was taken";
  } catch (const StorageError& e) {
    EXPECT_FALSE(e.transient()) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_allowed_packet"), std::string::npos) << e.what();
  }
  try {
    store->heartbeat(id, token, 2000, 30'000, huge);
    ADD_FAILURE() << "a checkpoint over max_allowed_packet was taken";
  } catch (const StorageError& e) {
    EXPECT_EQ(dynamic_cast<const mysql::CommitUnknown*>(&e), nullptr) << e.what();
    EXPECT_FALSE(e.transient()) << e.what();
  }
  Finish done;
  done.kind = Finish::Kind::kComplete;
  done.id = id;
  done.token = token;
  done.result_json = huge;
  const std::vector<FinishResult> results = store->finish({done}, 3000);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results[0].status);
  EXPECT_FALSE(results[0].lease_lost) << results[0].error;
  EXPECT_FALSE(results[0].retryable) << results[0].error;

  EXPECT_EQ(sessions_on(db), job.sessions) << "the session was dropped as if lost";
  EXPECT_EQ(store->get(id)->status, JobStatus::kRunning);
  store->complete(id, token, "{}", 4000);
  EXPECT_EQ(store->get(id)->status, JobStatus::kSucceeded);
}

// An account of its own on `db`'s database, with `limits` ("WITH MAX_USER_CONNECTIONS 1", ...),
// that may read and write rows; dropped at the end of the scope. The database must be migrated.
class LimitedAccount {
 public:
  LimitedAccount(const TestDatabase& db, const std::string& limits)
      : root_(db.root_session()), user_(db.name().substr(0, 32)) {  // the limit for user names
    root_->one("CREATE USER '" + user_ + "'@'127.0.0.1' IDENTIFIED BY 'limited' " + limits);
    root_->one("GRANT SELECT, INSERT, UPDATE, DELETE ON `" + db.name() + "`.* TO '" + user_ +
               "'@'127.0.0.1'");
    const mysql::Config config = mysql::parse_config(db.connection());
    connection_ = "host=" + config.host + ";port=" + std::to_string(config.port) +
                  ";db=" + db.name() + ";user=" + user_ + ";password=limited";
  }
  ~LimitedAccount() {
    try {
      root_->one("DROP USER IF EXISTS '" + user_ + "'@'127.0.0.1'");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "cannot drop user " << user_ << ": " << e.what();
    }
  }
  LimitedAccount(const LimitedAccount&) = delete;
  LimitedAccount& operator=(const LimitedAccount&) = delete;
  const std::string& connection() const { return connection_; }

 private:
  std::unique_ptr<mysql::Connection> root_;
  std::string user_;
  std::string connection_;
};

// Several daemons share one account whose connections are limited (MAX_USER_CONNECTIONS, or the
// server's max_user_connections): when one store's sessions end (a server-side timeout, a kill)
// and another process of the account takes the free places, the server refuses the store's new
// session (1226; 1203 for the server-wide limit) until one is free again -- as it refuses one over
// max_connections (1040), which the store retries and reports transient. These were reported not
// transient (found by review): a store error the request itself causes, so the scheduler turned
// the job's ending into a failed attempt ("the store refused the attempt's outcome").
TEST(MysqlStore, ASessionRefusedForTheAccountsConnectionLimitIsTransient) {
  TestDatabase db;
  db.open(1);  // migrates
  LimitedAccount account(db, "WITH MAX_USER_CONNECTIONS 1");
  std::unique_ptr<JobStore> store = open_mysql_store(account.connection(), 1);
  store->enqueue(spec("k"), 1000);
  const std::set<int64_t> sessions = sessions_on(db);
  ASSERT_EQ(sessions.size(), 1u);
  db.root_session()->one("KILL CONNECTION " + std::to_string(*sessions.begin()));
  // Another process of the account takes the place once the killed session has ended.
  std::unique_ptr<mysql::Connection> other;
  for (int i = 0; i < 500 && !other; ++i) {
    try {
      other = std::make_unique<mysql::Connection>(mysql::parse_config(account.connection()));
    } catch (const mysql::Error& e) {
      if (e.code() != 1226) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ASSERT_TRUE(other) << "the killed session never ended";

  try {
    store->enqueue(spec("k"), 2000);
    ADD_FAILURE() << "an enqueue went through with the account's one place taken";
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.transient()) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_user_connections"), std::string::npos) << e.what();
  }
  other.reset();  // the place is free again
  EXPECT_TRUE(store->enqueue(spec("k"), 3000).created);
}

// A server or an account may bound the time of a statement (MariaDB max_statement_time or
// MAX_STATEMENT_TIME, MySQL max_execution_time). A statement that waits past it for a row another
// transaction holds is interrupted (1969) where a lock wait timeout (1205) would have ended it,
// and it is the same conflict: transient, and a conflict on those rows only. It was reported as a
// refusal of the request (found by review): the scheduler turned a completion that met it into a
// failed attempt.
TEST(MysqlStore, AStatementInterruptedByTheServersTimeLimitIsALockConflict) {
  TestDatabase db;
  db.open(1);  // migrates
  LimitedAccount account(db, "WITH MAX_STATEMENT_TIME 1");
  std::unique_ptr<JobStore> store = open_mysql_store(account.connection(), 1);
  const JobId id = store->enqueue(spec("k"), 1000).id;
  std::vector<Claimed> claimed = store->claim(claim_of("w", 1, 1000, {"k"}));
  ASSERT_EQ(claimed.size(), 1u);
  auto holder = holding_row(db, id);

  try {
    store->heartbeat(id, claimed[0].lease_token, 2000, 30'000, std::nullopt);
    ADD_FAILURE() << "a heartbeat went through a held row";
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.transient()) << e.what();
    EXPECT_TRUE(e.lock_conflict()) << e.what();
  }
  Finish done;
  done.kind = Finish::Kind::kComplete;
  done.id = id;
  done.token = claimed[0].lease_token;
  done.result_json = "{}";
  std::vector<FinishResult> results = store->finish({done}, 3000);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].retryable) << results[0].error;

  holder->one("ROLLBACK");
  results = store->finish({done}, 4000);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, std::optional<JobStatus>(JobStatus::kSucceeded)) << results[0].error;
}

// The store's errors as the server words them (mysql::Error from a code and a message, as
// Connection::fail builds it). A full disk or table (InnoDB cannot extend a tablespace: 1114; an
// OS errno 28 passed on in 1030 or the write errors) and a statement ended by KILL QUERY (1317)
// failed a statement that did nothing, on a session that still works: transient, as SQLite's
// SQLITE_FULL is, neither a lost session nor a lock conflict. They were refusals of the request.
// So is a COMMIT that the engine or the binary log failed (1180).
TEST(MysqlErrors, AFullDiskAndAKilledStatementAreTransientOnASessionThatStays) {
  struct Case {
    unsigned code;
    std::string text;
    bool transient;
  };
  const Case cases[] = {
      {1114, "The table 'jobs' is full", true},
      {1021,
       "Disk full (#sql-1.MAI); waiting for someone to free some space... "
       "(errno: 28 \"No space left on device\")",
       true},
      {1030, "Got error 28 \"No space left on device\" from storage engine InnoDB", true},
      {1030, "Got error 28 - 'No space left on device' from storage engine", true},  // MySQL 8
      {1026, "Error writing file './binlog.000001' (errno: 28 \"No space left on device\")", true},
      {1026, "Error writing file 'binlog' (errno: 28 - No space left on device)", true},  // MySQL 8
      {3, "Error writing file 'MYfd=42' (Errcode: 28 \"No space left on device\")", true},
      {3, "Error writing file 'MYfd=42' (OS errno 28 - No space left on device)", true},
      {1317, "Query execution was interrupted", true},
      {1180, "Got error 28 \"No space left on device\" during COMMIT", true},
      {1180, "Got error 1 \"Operation not permitted\" during COMMIT", true},
      // Another OS error, or another number than 28, is the request's own as before.
      {1030, "Got error 122 \"Internal (unspecified) error in handler\" from storage engine",
       false},
      {1030, "Got error 280 \"Unknown error 280\" from storage engine InnoDB", false},
      {1030, "Got error 128 - 'Too many active concurrent transactions' from storage engine",
       false},
      {1026, "Error writing file './28' (errno: 13 \"Permission denied\")", false},
      {3, "Error writing file '/tmp/x' (Errcode: 5 \"Input/output error\")", false},
      {1064, "You have an error in your SQL syntax near 'Got error 28 \"'", false},
  };
  for (const Case& c : cases) {
    const mysql::Error e("query: " + c.text + " (errno " + std::to_string(c.code) + ")", c.code,
                         false);
    EXPECT_EQ(e.transient(), c.transient) << e.what();
    EXPECT_FALSE(e.lock_conflict()) << e.what();
    // A killed statement is no outage of the store: a heartbeat round's other beats go on.
    EXPECT_EQ(e.interrupted(), c.code == 1317) << e.what();
    EXPECT_EQ(e.outage(), c.transient && c.code != 1317) << e.what();
    EXPECT_FALSE(e.connection_lost()) << e.what();
    EXPECT_FALSE(e.needs_new_session()) << e.what();
    // Met by the COMMIT, each of these may have let it apply: the store reads back what did.
    EXPECT_EQ(e.leaves_commit_unknown(), c.transient) << e.what();
  }
  // A lock conflict or a read-only server refused the COMMIT: nothing applied, and it is re-run.
  for (unsigned code : {1213u, 1205u, 1290u}) {
    EXPECT_FALSE(mysql::Error("commit refused", code, false).leaves_commit_unknown()) << code;
  }
  EXPECT_TRUE(mysql::Error("server has gone away", 2006, true).leaves_commit_unknown());
  // Rows another transaction holds are no outage either; a server gone or read-only is.
  EXPECT_FALSE(mysql::Error("Deadlock found", 1213, false).outage());
  EXPECT_FALSE(mysql::Error("Lock wait timeout exceeded", 1205, false).outage());
  EXPECT_TRUE(mysql::Error("read-only", 1290, false).outage());
  EXPECT_TRUE(mysql::Error("server has gone away", 2006, true).outage());
}

// An operator, or a tool such as pt-kill, may end a statement with KILL QUERY: here a failure
// report waiting for its job's row, which another session holds. The statement did nothing, the
// store rolled its transaction back, and its session goes on: the error is transient (it was a
// refusal of the request, and the scheduler turned the report into a failed attempt of its own).
// It is not run again at once (someone meant it to stop); the caller's next call works.
TEST(MysqlStore, AStatementKilledByAnOperatorIsTransientAndTheSessionGoesOn) {
  TestDatabase db;
  OneSessionRunningAJob job(db);
  auto& store = job.store;
  const JobId id = job.id;
  const std::string& token = job.token;
  auto holder = holding_row(db, id);
  const int64_t holder_id = scalar(*holder, "SELECT CONNECTION_ID()");

  Failure failure;
  failure.error = "boom";
  Thrown thrown;
  std::thread failing = throwing([&] { store->fail(id, token, failure, 2000); }, thrown);
  const int64_t waiting =
      session_where(db, "INFO LIKE '%FROM jobs WHERE id = " + std::to_string(id) + " FOR UPDATE%'",
                    holder_id, thrown.done);
  if (waiting != 0) db.root_session()->one("KILL QUERY " + std::to_string(waiting));
  failing.join();
  holder->one("ROLLBACK");
  const std::string& error = thrown.error;
  ASSERT_NE(waiting, 0) << "the failure report never waited for the held row: " << error;
  EXPECT_NE(error.find("interrupted"), std::string::npos) << error;
  EXPECT_TRUE(thrown.transient) << error;
  EXPECT_FALSE(thrown.lock_conflict) << error;
  EXPECT_TRUE(thrown.interrupted) << error;
  EXPECT_FALSE(thrown.outage) << error << ": the store works";
  EXPECT_FALSE(thrown.commit_unknown) << error;

  const Job after = *store->get(id);
  EXPECT_EQ(after.status, JobStatus::kRunning);
  EXPECT_EQ(after.lease_token, std::optional<std::string>(token));
  EXPECT_EQ(after.last_error, std::nullopt);
  const std::vector<Attempt> attempts = store->attempts(id);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].outcome, "running");
  std::set<int64_t> now = sessions_on(db);
  now.erase(holder_id);
  EXPECT_EQ(now, job.sessions) << "the store's session was taken for lost";

  EXPECT_EQ(store->fail(id, token, failure, 3000), JobStatus::kQueued);
  EXPECT_EQ(store->attempts(id).at(0).outcome, "failed");
}

// The read timeout (read-timeout=, 120 s by default) is how long the store waits for an answer
// before it takes the server for gone; a statement waiting for a row lock must end before it, with
// a lock wait timeout that the caller re-runs. The server's innodb_lock_wait_timeout (50 s by
// default) may be raised by an operator, or read-timeout lowered to notice a dead server sooner.
// When the read timeout came first (found by review), a held row looked like a lost connection:
// the call ran again on new sessions, each abandoned statement went on waiting on the server, and
// one that carried its COMMIT could still apply after the store had found it not applied.
TEST(MysqlStore, ARowHeldLongerThanTheReadTimeoutIsALockConflictNotALostConnection) {
  TestDatabase db;
  OneSessionRunningAJob job(db, ";read-timeout=2");
  auto& store = job.store;
  const JobId id = job.id;
  const std::set<int64_t>& sessions = job.sessions;
  auto holder = holding_row(db, id);
  const int64_t holder_id = scalar(*holder, "SELECT CONNECTION_ID()");

  try {
    store->heartbeat(id, job.token, 2000, 30'000, std::nullopt);
    ADD_FAILURE() << "a heartbeat went through a held row";
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.lock_conflict()) << e.what();
  }
  std::set<int64_t> now = sessions_on(db);
  now.erase(holder_id);
  EXPECT_EQ(now, sessions) << "the store's session was taken for lost";

  holder->one("ROLLBACK");
  EXPECT_EQ(store->heartbeat(id, job.token, 3000, 30'000, std::nullopt).lease_expires_ms, 33'000);
}

// How many locking reads (FOR UPDATE) of `db`'s sessions other than `except_id` were seen waiting
// out a lock wait of about a second (lock-wait-timeout=1) while `done` was false, polled every
// 5 ms: a statement run again shows as its time (TIME_MS) starting over, however short the pause
// between the runs. Not from INNODB_TRX: InnoDB refreshes that table only after 100 ms without a
// read. A run counts once it has lasted 700 ms: full ctest runs twice counted 3 waits for 2 when
// every start over counted, which a stray short statement would explain.
int lock_waits_until(const TestDatabase& db, int64_t except_id, const std::atomic<bool>& done) {
  constexpr double kWaited = 700;
  auto root = db.root_session();
  const std::string sql = "SELECT MAX(TIME_MS) FROM information_schema.PROCESSLIST WHERE DB = '" +
                          db.name() + "' AND ID <> " + std::to_string(except_id) +
                          " AND COMMAND = 'Query' AND INFO LIKE '%FOR UPDATE%'";
  int waits = 0;
  double last_ms = -1;
  bool counted = false;  // the run followed has been counted
  while (!done) {
    mysql::Result r = root->one(sql);
    if (!r.rows.empty() && r.rows[0][0]) {
      const double ms = std::stod(mysql::to_str(r.rows[0][0]));
      if (ms < last_ms - 300) counted = false;  // a new run
      if (!counted && ms >= kWaited) {
        ++waits;
        counted = true;
      }
      last_ms = ms;
    }
    std::this_thread::sleep_for(5ms);
  }
  return waits;
}

// A heartbeat waits for a row another transaction holds once, not twice like other operations: a
// lock wait (50 s by default) already outlasts most leases, the scheduler beats the job again half
// an interval later, after the other jobs, and a second wait held its heartbeat lane and a pooled
// connection as long again (found by review). A failure report, for contrast, waits twice: so the
// count below does see a second wait.
TEST(MysqlStore, AHeartbeatWaitsForAHeldRowOnceWhereAnEndingWaitsTwice) {
  TestDatabase db;
  OneSessionRunningAJob job(db, ";lock-wait-timeout=1");
  auto holder = holding_row(db, job.id);
  const int64_t holder_id = scalar(*holder, "SELECT CONNECTION_ID()");

  Thrown beat;
  std::thread beating =
      throwing([&] { job.store->heartbeat(job.id, job.token, 2000, 30'000, std::nullopt); }, beat);
  const int beat_waits = lock_waits_until(db, holder_id, beat.done);
  beating.join();
  EXPECT_TRUE(beat.lock_conflict) << beat.error;
  EXPECT_EQ(beat_waits, 1) << "the heartbeat waited for its row " << beat_waits << " times";

  Failure failure;
  failure.error = "boom";
  Thrown ending;
  std::thread failing =
      throwing([&] { job.store->fail(job.id, job.token, failure, 3000); }, ending);
  const int ending_waits = lock_waits_until(db, holder_id, ending.done);
  failing.join();
  holder->one("ROLLBACK");
  EXPECT_TRUE(ending.lock_conflict) << ending.error;
  EXPECT_EQ(ending_waits, 2) << "the failure report waited for its row " << ending_waits
                             << " times";
  EXPECT_EQ(job.store->get(job.id)->status, JobStatus::kRunning) << "neither went through";
}

// --- commits held by the backup lock ------------------------------------------------------

// A KILL QUERY that ends the COMMIT itself proves nothing: a server may look for the kill once
// the statement has run, and answer 1317 for a COMMIT that committed. The store reports it as an
// unknown outcome (CommitUnknown, transient, for the caller to read back), never as a transient
// error that says nothing was applied, on which a caller would act. Here the COMMIT of a heartbeat
// (sent with its UPDATE) waits for the backup lock when it is killed: it did not commit, and the
// session, rolled back, goes on. Registered RUN_SERIAL (CMakeLists.txt): the lock is global.
TEST(MysqlBackupLock, ACommitKilledByAnOperatorIsAnUnknownOutcomeAndTheSessionGoesOn) {
  TestDatabase db;
  OneSessionRunningAJob job(db);
  auto& store = job.store;

  // Every COMMIT of a transaction that wrote waits (MariaDB's backup lock, global); statements
  // still run.
  ServerWide blocked(db, "BACKUP STAGE START; BACKUP STAGE BLOCK_COMMIT", "BACKUP STAGE END");
  Thrown thrown;
  std::thread beating =
      throwing([&] { store->heartbeat(job.id, job.token, 2000, 30'000, std::nullopt); }, thrown);
  const int64_t waiting = session_where(
      db, "STATE = 'Waiting for backup lock' AND INFO LIKE '%COMMIT'", 0, thrown.done);
  if (waiting != 0) db.root_session()->one("KILL QUERY " + std::to_string(waiting));
  // The lock is freed once the killed COMMIT has returned: freed before the COMMIT saw the kill,
  // it would be granted the lock and commit.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (waiting != 0 && !thrown.done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  blocked.end();
  beating.join();
  const std::string& error = thrown.error;
  ASSERT_NE(waiting, 0) << "the heartbeat's COMMIT never waited for the backup lock: " << error;
  EXPECT_TRUE(thrown.commit_unknown) << error;
  EXPECT_TRUE(thrown.transient) << error;
  EXPECT_NE(error.find("interrupted"), std::string::npos) << error;
  // Killed, the server works: no outage, so a heartbeat round's other beats go on.
  EXPECT_TRUE(thrown.interrupted) << error;
  EXPECT_FALSE(thrown.outage) << error;

  EXPECT_EQ(store->get(job.id)->lease_expires_ms, job.lease_expires_ms) << "applied";
  EXPECT_EQ(sessions_on(db), job.sessions) << "the store's session was taken for lost";
  EXPECT_EQ(store->heartbeat(job.id, job.token, 3000, 30'000, std::nullopt).lease_expires_ms,
            33'000);
}

// Runs `call`, a store call through `t.relay` whose transaction writes, while every COMMIT waits
// for the backup lock. Once its COMMIT waits, the relay holds the replies and the lock is freed;
// once `committed` (a COUNT) reads 1, the relay cuts the connection: the COMMIT applied, and the
// store never read its reply. Returns the call's error ("" if none).
std::string commit_applies_reply_lost(ThroughRelay& t, const std::string& committed,
                                      std::function<void()> call) {
  ServerWide blocked(t.db, "BACKUP STAGE START; BACKUP STAGE BLOCK_COMMIT", "BACKUP STAGE END");
  std::atomic<bool> done{false};
  std::string error;
  std::thread caller = running(std::move(call), error, done);
  const bool waited =
      session_where(t.db, "STATE = 'Waiting for backup lock' AND INFO LIKE '%COMMIT'", 0, done) !=
      0;
  if (waited) t.relay.hold_replies();
  blocked.end();
  if (waited) {
    auto check = t.db.app_session();
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (scalar(*check, committed) != 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
  }
  t.relay.cut();
  caller.join();
  EXPECT_TRUE(waited) << "the call's COMMIT never waited for the backup lock: " << error;
  return error;
}

// Calls `op` as a careful client does: once more after an error that says to try again.
template <class Op>
auto retrying_a_transient_error(Op op) {
  try {
    return op();
  } catch (const StorageError& e) {
    if (!e.transient()) throw;
    return op();
  }
}

// Runs `call`, a store call through `t.relay` whose transaction writes, while every COMMIT waits
// for the backup lock. Once its COMMIT waits, the relay cuts the clients' side of its connections
// only: the server's session lives on and its COMMIT is still under way when the store, having
// lost the connection, reads back whether it applied. The lock is freed once the store reads (a
// locking read waits for that COMMIT) or has run its change again (its second COMMIT waiting for
// the lock as well). Returns the call's error ("" if none).
std::string connection_lost_during_commit(ThroughRelay& t, std::function<void()> call) {
  ServerWide blocked(t.db, "BACKUP STAGE START; BACKUP STAGE BLOCK_COMMIT", "BACKUP STAGE END");
  std::atomic<bool> done{false};
  std::string error;
  std::thread caller = running(std::move(call), error, done);
  const int64_t first =
      session_where(t.db, "STATE = 'Waiting for backup lock' AND INFO LIKE '%COMMIT'", 0, done);
  if (first != 0) t.relay.cut_clients_only();
  const int64_t next = first == 0 ? 0
                                  : session_where(t.db,
                                                  "((STATE = 'Waiting for backup lock' AND INFO "
                                                  "LIKE '%COMMIT') OR INFO LIKE '%LOCK IN SHARE "
                                                  "MODE%')",
                                                  first, done);
  blocked.end();
  caller.join();
  EXPECT_NE(first, 0) << "the call's COMMIT never waited for the backup lock: " << error;
  EXPECT_TRUE(first == 0 || next != 0)
      << "the store neither read back nor made its change again: " << error;
  return error;
}

// The connection of an enqueue is lost while its COMMIT is still under way on the server (a client
// read timeout during a slow fsync, a proxy dropping the client's side). The store's read-back of
// its first job must wait for that COMMIT: a plain read at READ COMMITTED saw nothing yet, the
// store took the enqueue for not applied and ran it again, and both COMMITs landed (4 jobs for 2).
TEST(MysqlBackupLock, AnEnqueueWhoseConnectionIsLostWhileItsCommitIsUnderWayMakesItsJobsOnce) {
  ThroughRelay t;
  std::vector<EnqueueResult> made;
  const std::string error = connection_lost_during_commit(t, [&] {
    made = t.store->enqueue_batch({spec("k", "a"), spec("k", "b")}, 1000);
  });
  EXPECT_EQ(error, "");
  EXPECT_EQ(scalar(*t.db.app_session(), "SELECT COUNT(*) FROM jobs"), 2) << "made twice";
  EXPECT_EQ(made.size(), 2u);
}

// The same for a claim: it read back nothing yet, failed, and its jobs stayed leased to a claim
// nobody held, until a sweep took them back and counted an attempt.
TEST(MysqlBackupLock, AClaimWhoseConnectionIsLostWhileItsCommitIsUnderWayReturnsItsJobs) {
  ThroughRelay t;
  t.direct->enqueue(spec("k", "a"), 1000);
  t.direct->enqueue(spec("k", "b"), 1000);
  t.store->claim(claim_of("w", 1, 1000, {"none"}));  // registers the owner, a write of its own
  std::vector<Claimed> got;
  const std::string error = connection_lost_during_commit(
      t, [&] { got = t.store->claim(claim_of("w", 2, 1000, {"k"})); });
  EXPECT_EQ(error, "");
  ASSERT_EQ(got.size(), 2u);
  for (const Claimed& c : got) {
    const std::optional<Job> job = t.direct->get(c.job.id);
    EXPECT_EQ(job->status, JobStatus::kRunning);
    EXPECT_EQ(job->lease_token, c.lease_token) << "the claim returned is the one in force";
  }
}

// An enqueue without a dedupe key cannot be told from its repeat. When its COMMIT applies and the
// reply is lost, the store reads back its first new job and returns the jobs it made; before, it
// reported a transient error, and a client that tried again made the jobs twice.
TEST(MysqlBackupLock, AnEnqueueWhoseCommitAppliedButWhoseReplyWasLostMakesItsJobsOnce) {
  ThroughRelay t;
  std::vector<EnqueueResult> made;
  const std::string error = commit_applies_reply_lost(t, "SELECT COUNT(*) = 2 FROM jobs", [&] {
    made = retrying_a_transient_error([&] {
      return t.store->enqueue_batch({spec("k", "a"), spec("k", "b")}, 1000);
    });
  });
  EXPECT_EQ(error, "");
  EXPECT_EQ(scalar(*t.db.app_session(), "SELECT COUNT(*) FROM jobs"), 2) << "made twice";
  ASSERT_EQ(made.size(), 2u);
  for (const EnqueueResult& r : made) {
    EXPECT_TRUE(r.created);
    ASSERT_TRUE(t.direct->get(r.id).has_value()) << "returned a job that is not there: " << r.id;
  }
  EXPECT_EQ(t.direct->get(made[0].id)->concurrency_key, "a");
  EXPECT_EQ(t.direct->get(made[1].id)->concurrency_key, "b");
}

// The same for a payload dense in quotes, with the server's max_allowed_packet at 1 MiB: the
// payload (600 KB) fits a statement, and so does the store's read-back of it. Before, the read-back
// compared the payload quoted, twice as long and over the limit: the outcome stayed unknown, and a
// client that tried again made the job twice.
TEST(MysqlBackupLock, AnEnqueueOfAPayloadDenseInQuotesWhoseReplyWasLostMakesItsJobOnce) {
  std::string payload = R"({"s":")";
  while (payload.size() < 600'000) payload += R"(\")";
  payload += R"("})";
  ThroughRelay t;
  ServerWide small = small_packets(t.db);  // for the sessions the store opens after the cut
  std::vector<EnqueueResult> made;
  const std::string error = commit_applies_reply_lost(t, "SELECT COUNT(*) = 1 FROM jobs", [&] {
    made = retrying_a_transient_error(
        [&] { return t.store->enqueue_batch({spec("k", "a", payload)}, 1000); });
  });
  EXPECT_EQ(error, "");
  EXPECT_EQ(scalar(*t.db.app_session(), "SELECT COUNT(*) FROM jobs"), 1) << "made twice";
  ASSERT_EQ(made.size(), 1u);
  EXPECT_TRUE(made[0].created);
  ASSERT_TRUE(t.direct->get(made[0].id).has_value());
  EXPECT_EQ(t.direct->get(made[0].id)->payload, payload);
}

// The same for a bulk retry of dead letters: run twice, it would retry `limit` more letters.
TEST(MysqlBackupLock, ARetryOfDeadLettersWhoseCommitAppliedButWhoseReplyWasLostRetriesThemOnce) {
  ThroughRelay t;
  std::vector<int64_t> letters;
  for (int i = 0; i < 3; ++i) letters.push_back(kill_one(*t.direct, spec("k"), 1000));
  int retried = -1;
  const std::string error = commit_applies_reply_lost(
      t, "SELECT COUNT(*) FROM dead_letters WHERE status = 'retrying'", [&] {
        retried =
            retrying_a_transient_error([&] { return t.store->retry_dead_letters({}, 1, 2000); });
      });
  EXPECT_EQ(error, "");
  EXPECT_EQ(retried, 1);
  EXPECT_EQ(
      scalar(*t.db.app_session(), "SELECT COUNT(*) FROM dead_letters WHERE status = 'retrying'"), 1)
      << "retried twice";
  EXPECT_EQ(t.direct->get_dead_letter(letters.back())->status, DeadLetterStatus::kRetrying)
      << "the newest letter goes first";
  EXPECT_EQ(t.direct->get_dead_letter(letters.back())->retries, 1);
}

// One letter: run twice, the second run would find it retrying and report an error for a retry
// that was made.
TEST(MysqlBackupLock, ARetryOfOneDeadLetterWhoseCommitAppliedButWhoseReplyWasLostSucceeds) {
  ThroughRelay t;
  const int64_t letter = kill_one(*t.direct, spec("k"), 1000);
  const std::string error = commit_applies_reply_lost(
      t, "SELECT COUNT(*) FROM dead_letters WHERE status = 'retrying'", [&] {
        retrying_a_transient_error([&] {
          t.store->retry_dead_letter(letter, 2000);
          return 0;
        });
      });
  EXPECT_EQ(error, "");
  EXPECT_EQ(t.direct->get_dead_letter(letter)->status, DeadLetterStatus::kRetrying);
  EXPECT_EQ(t.direct->get_dead_letter(letter)->retries, 1);
}

// When the read-back finds that the COMMIT did not apply (an operator's KILL QUERY ended it while
// it waited), the store runs the enqueue again instead of reporting an unknown outcome.
TEST(MysqlBackupLock, AnEnqueueWhoseCommitWasKilledBeforeItAppliedIsMadeAgain) {
  TestDatabase db;
  auto store = db.open(2);
  ServerWide blocked(db, "BACKUP STAGE START; BACKUP STAGE BLOCK_COMMIT", "BACKUP STAGE END");
  std::atomic<bool> done{false};
  std::string error;
  EnqueueResult made;
  std::thread caller = running([&] { made = store->enqueue(spec("k"), 1000); }, error, done);
  // The first COMMIT waits: kill it. The one that waits next, another statement, is the re-run's.
  auto root = db.root_session();
  const std::string waiting_commit =
      "SELECT ID, QUERY_ID FROM information_schema.PROCESSLIST WHERE DB = '" + db.name() +
      "' AND STATE = 'Waiting for backup lock' AND INFO LIKE '%COMMIT'";
  auto wait_for_commit = [&](int64_t other_than_query) -> std::pair<int64_t, int64_t> {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      for (const mysql::Row& row : root->one(waiting_commit).rows) {
        if (mysql::to_i64(row[1]) != other_than_query)
          return {mysql::to_i64(row[0]), mysql::to_i64(row[1])};
      }
      std::this_thread::sleep_for(5ms);
    }
    return {0, 0};
  };
  const auto [session, first_commit] = wait_for_commit(-1);
  if (session != 0) root->one("KILL QUERY " + std::to_string(session));
  const int64_t second_commit = session != 0 ? wait_for_commit(first_commit).second : 0;
  blocked.end();
  caller.join();
  ASSERT_NE(session, 0) << "the enqueue's COMMIT never waited for the backup lock: " << error;
  EXPECT_NE(second_commit, 0) << "the enqueue was not run again: " << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(scalar(*db.app_session(), "SELECT COUNT(*) FROM jobs"), 1);
  ASSERT_TRUE(store->get(made.id).has_value()) << made.id;
  EXPECT_EQ(store->get(made.id)->kind, "k");
}

// --- server-wide settings -------------------------------------------------------------------

// The rows read from `table` of `db` so far, as the server's user statistics count them (SET
// GLOBAL userstat = 1; `root`: a session that may read them).
int64_t rows_read(mysql::Connection& root, const TestDatabase& db, const std::string& table) {
  return scalar(root,
                "SELECT COALESCE(SUM(ROWS_READ), 0) FROM information_schema.TABLE_STATISTICS "
                "WHERE TABLE_SCHEMA = '" +
                    db.name() + "' AND TABLE_NAME = '" + table + "'");
}

// A job's result is in its succeeded attempt's row (schema 0004), which only a succeeded job has.
// Reading any job looked for it among all of the job's attempt rows, of which a dead or often
// deferred job may have hundreds: every read of such a job, a page of a listing included, read
// them all. Counted with the server's user statistics (SET GLOBAL userstat, hence server-wide).
TEST(MysqlServerWide, ReadingAJobThatDidNotSucceedReadsNoneOfItsAttempts) {
  TestDatabase db;
  ServerWide userstat(db, "SET GLOBAL userstat = 1", "SET GLOBAL userstat = 0");
  auto store = db.open();
  const JobId deferred = store->enqueue(spec("k"), 1000).id;
  for (int i = 0; i < 30; ++i) {
    std::vector<Claimed> got = store->claim(claim_of("w", 1, 1000 + i));
    ASSERT_EQ(got.size(), 1u);
    store->defer(got[0].job.id, got[0].lease_token, 1000 + i, "throttled", 1000 + i);
  }
  const JobId done = store->enqueue(spec("k2"), 2000).id;
  ClaimRequest r = claim_of("w", 1, 2000);
  r.kinds = {"k2"};
  std::vector<Claimed> got = store->claim(r);
  ASSERT_EQ(got.size(), 1u);
  store->complete(done, got[0].lease_token, R"({"n":7})", 2000);

  auto root = db.root_session();
  const auto attempt_rows_read = [&] { return rows_read(*root, db, "job_attempts"); };
  int64_t before = attempt_rows_read();
  std::optional<Job> job = store->get(deferred);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->status, JobStatus::kQueued);
  EXPECT_FALSE(job->result.has_value());
  EXPECT_EQ(attempt_rows_read() - before, 0) << "the deferred job's 30 attempts were read";
  before = attempt_rows_read();
  EXPECT_EQ(store->list(JobQuery{}).jobs.size(), 2u);
  EXPECT_LE(attempt_rows_read() - before, 2) << "more than the succeeded job's attempt was read";
  EXPECT_EQ(store->get(done)->result, R"({"n":7})");
}

// A claim read its kinds' queued jobs in index order (priority, run_after_ms, id) up to the
// first it could take: it stepped over every job not yet due (deferred, backed off, throttled)
// of its priority and of every better one, and a per-key capped kind's read of its keys
// (SELECT DISTINCT) read all its queued jobs, those waiting for their key's cap included. With
// 200 000 such jobs a claim cycle took 186-214 ms, against 4 ms with none. Claims now read a
// range per priority and per key, which ends at the first job not yet due, and find the
// priorities and keys by seeking from one to the next. Counted with the server's user statistics.
TEST(MysqlServerWide, ClaimsReadNeitherJobsNotDueYetNorJobsWaitingForTheirCap) {
  TestDatabase db;
  ServerWide userstat(db, "SET GLOBAL userstat = 1", "SET GLOBAL userstat = 0");
  auto store = db.open();
  store->set_caps("capped", {2, 0});
  const int64_t now = 1'000'000;
  std::vector<JobSpec> specs;
  for (const char* kind : {"plain", "capped"}) {
    for (int priority : {-1, 0, 1}) {
      for (int i = 0; i < 1000; ++i) {
        JobSpec s = spec(kind, "a");
        s.priority = priority;
        s.run_after_ms = now + 3'600'000;
        specs.push_back(s);
      }
    }
  }
  for (int i = 0; i < 2002; ++i) specs.push_back(spec("capped", "full"));
  store->enqueue_batch(specs, now - 10);
  // Two of "full" run: its cap is reached, and its other 2000 jobs wait for it.
  ASSERT_EQ(store->claim(claim_of("w", 2, now - 5, {"capped"})).size(), 2u);
  const JobId plain = store->enqueue(spec("plain", "a"), now).id;
  const JobId capped = store->enqueue(spec("capped", "a"), now).id;

  auto root = db.root_session();
  const auto jobs_rows_read = [&] { return rows_read(*root, db, "jobs"); };
  for (int round = 0; round < 2; ++round) {  // the second with what the first learned
    SCOPED_TRACE("claim " + std::to_string(round + 1));
    int64_t before = jobs_rows_read();
    std::vector<Claimed> got = store->claim(claim_of("w", 8, now + round, {"capped"}));
    ASSERT_EQ(got.size(), round == 0 ? 1u : 0u);
    if (round == 0) {
      EXPECT_EQ(got[0].job.id, capped);
    }
    EXPECT_LE(jobs_rows_read() - before, 100)
        << "a claim of the capped kind read past jobs not due, or waiting for their cap";
    before = jobs_rows_read();
    got = store->claim(claim_of("w", 8, now + round, {"plain"}));
    ASSERT_EQ(got.size(), round == 0 ? 1u : 0u);
    if (round == 0) {
      EXPECT_EQ(got[0].job.id, plain);
    }
    EXPECT_LE(jobs_rows_read() - before, 100)
        << "a claim of the uncapped kind read past jobs not due yet";
  }

  // Once due, they are claimed best priority first.
  std::vector<Claimed> got = store->claim(claim_of("w", 1500, now + 3'600'000, {"plain"}));
  ASSERT_EQ(got.size(), 1500u);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].job.priority, i < 1000 ? -1 : 0) << "job " << i;
  }
}

// The ids of a multi-row INSERT step by the session's auto_increment_increment, which the store
// read once when it opened. An operator's SET GLOBAL (or a Galera cluster that resized) reaches
// the sessions opened later: a batch enqueued on one returned ids of other jobs, or of none.
// Registered RUN_SERIAL (CMakeLists.txt): the setting is global.
// A per-key capped claim reads the head of each key with room, one sub-SELECT per key. With
// thousands of keys queued (installations), those went out as one statement, which grew past the
// server's max_allowed_packet (here 1 MiB; 16 MiB by default is about 60 000 keys): every claim
// then failed with error 1153, jobs of any kind included. They go in statements and round trips
// of at most 256 KiB now, and the claim is as fair as before.
TEST(MysqlServerWide, AClaimOverMoreKeysThanOneStatementHoldsStillClaims) {
  TestDatabase db;
  ServerWide small = small_packets(db);
  auto store = db.open(2);  // its sessions see the small packet
  store->set_caps("k", {1, 0});
  std::vector<JobSpec> specs;
  for (int i = 0; i < 2'000; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "%05d-", i);
    specs.push_back(spec("k", key + std::string(600, 'k')));
  }
  store->enqueue_batch(specs, 1000);
  store->enqueue(spec("other", "x"), 1000);
  std::vector<Claimed> got;
  ASSERT_NO_THROW(got = store->claim(claim_of("w", 8, 2000, {"k", "other"})));
  ASSERT_EQ(got.size(), 8u);
  std::set<std::string> keys;
  for (const Claimed& c : got) keys.insert(c.job.concurrency_key);
  EXPECT_EQ(keys.size(), 8u) << "one job per key: the cap is 1";
  small.end();
}

TEST(MysqlServerWide, ABatchEnqueuedAfterTheIncrementChangedReturnsTheIdsOfItsJobs) {
  TestDatabase db;
  auto store = db.open(2);
  store->enqueue(spec("k", "before"), 1000);
  ServerWide increment(db, "SET GLOBAL auto_increment_increment = 3",
                       "SET GLOBAL auto_increment_increment = 1");
  auto root = db.root_session();
  for (const mysql::Row& row :
       root->one("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = '" + db.name() + "'")
           .rows) {
    root->one("KILL CONNECTION " + mysql::to_str(row[0]));  // the store opens new sessions
  }
  std::vector<JobSpec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back(spec("k", "key-" + std::to_string(i)));
  const std::vector<EnqueueResult> made = store->enqueue_batch(specs, 2000);
  increment.end();
  ASSERT_EQ(made.size(), specs.size());
  for (size_t i = 0; i < made.size(); ++i) {
    const std::optional<Job> job = store->get(made[i].id);
    ASSERT_TRUE(job.has_value()) << "returned job " << made[i].id << " is not there";
    EXPECT_EQ(job->concurrency_key, specs[i].concurrency_key) << "returned another job's id";
  }
  EXPECT_EQ(made[1].id - made[0].id, 3);
}

}  // namespace
}  // namespace backhaul::jobs
