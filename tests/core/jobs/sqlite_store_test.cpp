// What is specific to the SQLite backend of the job queue: the file and its pragmas, migrations,
// several store instances ("hosts") on one file, group commit (results to the right caller, one
// operation's failure isolated from its batch), durability across reopen, and the schema's claim
// plans. The shared contract is tested by job_store_conformance_test against both backends.
#include "core/jobs/sqlite_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/jobs/migrations.h"
#include <sqlite3.h>
#include <unistd.h>

namespace backhaul::jobs {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int64_t kT0 = 1'700'000'000'000;
constexpr int64_t kLeaseMs = 30'000;

// A directory of its own under the system temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("backhaul-sqlite-store-test-" + std::to_string(::getpid()) + "-" +
             std::to_string(counter++) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Reads the file through a connection of its own, outside the store: what another process sees.
std::vector<std::vector<std::string>> query_file(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::string error = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    throw std::runtime_error("cannot open " + path + ": " + error);
  }
  sqlite3_busy_timeout(db, 5'000);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    std::string error = sqlite3_errmsg(db);
    sqlite3_close(db);
    throw std::runtime_error(error + " in " + sql);
  }
  std::vector<std::vector<std::string>> rows;
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    std::vector<std::string> row;
    for (int i = 0; i < sqlite3_column_count(stmt); ++i) {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, i));
      row.emplace_back(text ? text : "NULL");
    }
    rows.push_back(std::move(row));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rows;
}

std::string query_value(const std::string& path, const std::string& sql) {
  auto rows = query_file(path, sql);
  return rows.empty() || rows[0].empty() ? "" : rows[0][0];
}

JobSpec spec(std::string kind = "entity", std::string key = "inst-1", std::string payload = "{}") {
  JobSpec s;
  s.kind = std::move(kind);
  s.concurrency_key = std::move(key);
  s.payload = std::move(payload);
  return s;
}

ClaimRequest claim_request(const std::string& owner, size_t limit, int64_t now = kT0) {
  ClaimRequest r;
  r.owner = owner;
  r.limit = limit;
  r.now_ms = now;
  r.lease_ms = kLeaseMs;
  return r;
}

class SqliteStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<SqliteJobStore> open(const SqliteStoreOptions& options = {}) {
    return open_sqlite_store(path_, options);
  }
  // Occupies the writer: the operation blocks inside its transaction until `release` is set, so
  // that operations submitted meanwhile queue up and share the next transaction.
  std::thread hold_writer(SqliteJobStore& store, std::atomic<bool>& holding,
                          std::atomic<bool>& release) {
    std::thread holder([&store, &holding, &release] {
      store.update_circuit("hold", [&](const CircuitRecord& r) {
        holding = true;
        while (!release) std::this_thread::sleep_for(1ms);
        return r;
      });
    });
    while (!holding) std::this_thread::sleep_for(1ms);
    return holder;
  }

  // What opening the store throws once `edit` ran on a migrated database, or "" when it opens.
  std::string refusal_after(const char* edit) {
    open().reset();
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, edit, nullptr, nullptr, nullptr), SQLITE_OK) << edit;
    sqlite3_close(db);
    try {
      open();
      return "";
    } catch (const StorageError& e) {
      return e.what();
    }
  }

  TempDir dir_;
  std::string path_ = dir_.file("jobs.db");
};

// --- the file ------------------------------------------------------------------------------

TEST_F(SqliteStoreTest, CreatesTheFileInWalModeWithFullSyncAndForeignKeys) {
  ASSERT_FALSE(fs::exists(path_));
  auto store = open();
  EXPECT_TRUE(fs::exists(path_));
  EXPECT_EQ(store->backend(), "sqlite");
  EXPECT_EQ(store->writer_pragma("journal_mode"), "wal");
  EXPECT_EQ(store->writer_pragma("synchronous"), "2") << "2 = FULL: an fsync per commit";
  EXPECT_EQ(store->writer_pragma("foreign_keys"), "1");
  // WAL is a property of the file: every other connection (process, host) uses it too.
  EXPECT_EQ(query_value(path_, "PRAGMA journal_mode"), "wal");
}

// SQLite says only "unable to open database file"; the error says why, from the file system.
TEST_F(SqliteStoreTest, AFileThatCannotBeOpenedIsRefusedSayingWhy) {
  const auto refusal = [](const std::string& path) -> std::string {
    try {
      open_sqlite_store(path);
    } catch (const StorageError& e) {
      return e.what();
    }
    return "(opened)";
  };
  const std::string missing = dir_.file("missing/dir");
  EXPECT_THAT(refusal(missing + "/jobs.db"),
              ::testing::StartsWith("sqlite: cannot open " + missing + "/jobs.db: the directory " +
                                    missing + " does not exist ("));
  { std::ofstream(dir_.file("plain")) << "x"; }
  EXPECT_THAT(refusal(dir_.file("plain") + "/jobs.db"),
              ::testing::HasSubstr(": " + dir_.file("plain") + " is not a directory ("));
  fs::create_directory(dir_.file("a-directory"));
  EXPECT_THAT(refusal(dir_.file("a-directory")), ::testing::HasSubstr(": it is a directory ("));
}

TEST_F(SqliteStoreTest, AnInMemoryStoreWorks) {
  auto store = open_sqlite_store(":memory:");
  EnqueueResult r = store->enqueue(spec(), kT0);
  ASSERT_TRUE(store->get(r.id).has_value()) << "reads must use the writer's connection";
  EXPECT_EQ(store->claim(claim_request("w", 5)).size(), 1u);
}

TEST_F(SqliteStoreTest, ASqlErrorIsAStorageErrorAndLeavesTheWriterUsable) {
  auto store = open();
  EXPECT_THROW(store->writer_pragma("no such syntax ("), StorageError);
  EXPECT_THROW(store->writer_pragma("no such syntax ("), StorageError) << "not cached broken";
  EXPECT_EQ(store->writer_pragma("journal_mode"), "wal");
  EXPECT_TRUE(store->enqueue(spec(), kT0).created);
}

// What may pass is told from what will not (StorageError::transient()): the file locked by
// another process past the busy timeout is a lock conflict; a statement the database refuses (a
// trigger here; a constraint) is the call's own. Every SQLite error used to be "not transient",
// so the admin API could not tell a client whether to retry.
TEST_F(SqliteStoreTest, AFileLockedPastTheBusyTimeoutIsTransientARefusedStatementIsNot) {
  SqliteStoreOptions options;
  options.busy_timeout_ms = 50;
  auto store = open(options);
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  try {
    store->enqueue(spec(), kT0);
    ADD_FAILURE() << "enqueued while another connection held the file exclusively";
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.transient()) << e.what();
    EXPECT_TRUE(e.lock_conflict()) << e.what();
  }
  ASSERT_EQ(sqlite3_exec(other,
                         "ROLLBACK; CREATE TRIGGER refuse BEFORE INSERT ON jobs "
                         "BEGIN SELECT RAISE(ABORT, 'refused by this test'); END",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(other);
  try {
    store->enqueue(spec(), kT0);
    ADD_FAILURE() << "enqueued past the trigger";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("refused by this test"), std::string::npos) << e.what();
    EXPECT_FALSE(e.transient()) << e.what();
  }
}

// Review: a finish() item that meets an error which may pass (the disk full: SQLITE_FULL, now
// StorageError::transient) must come back retryable, as on MySQL and in JobStore::finish, or throw
// a transient error; reported as the item's own refusal, the scheduler turns the job's checkpointed
// wait into a failed attempt ("the store refused the attempt's outcome") and, at max_attempts,
// kills a job that only met a full disk.
TEST_F(SqliteStoreTest, AFinishItemThatMeetsAFullDiskIsRetryable) {
  auto store = open();
  ASSERT_TRUE(store->enqueue(spec(), kT0).created);
  auto claimed = store->claim(claim_request("w", 1));
  ASSERT_EQ(claimed.size(), 1u);
  const std::string pages = store->writer_pragma("page_count");
  store->writer_pragma("max_page_count = " + pages);  // no page more: SQLITE_FULL
  Finish f;
  f.kind = Finish::Kind::kWaitForChildren;
  f.id = claimed[0].job.id;
  f.token = claimed[0].lease_token;
  f.until_ms = kT0 + 60'000;
  f.checkpoint = "{\"units\":[],\"pad\":\"" + std::string(1 << 20, 'x') + "\"}";
  try {
    std::vector<FinishResult> r = store->finish({f}, kT0 + 10);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_FALSE(r[0].status);
    EXPECT_TRUE(r[0].retryable) << "a full disk reported as the item's own refusal: " << r[0].error;
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.transient()) << e.what();
  }
  store->writer_pragma("max_page_count = 1073741823");
  EXPECT_EQ(store->get(f.id)->status, JobStatus::kRunning);
}

// Review: an ending the store refuses for a reason of its own is that item's refusal (the
// scheduler turns it into a failed attempt); the other items of the call are recorded. A
// completion the database refuses (a trigger here; SQLITE_TOOBIG for a result over the length
// limit) failed the whole completion chunk: finish() threw, every completion in the call was
// retried until the leases ran out and given up, and the refused job was never failed.
TEST_F(SqliteStoreTest, ACompletionTheDatabaseRefusesFailsOnlyItsOwnItem) {
  auto store = open();
  ASSERT_TRUE(store->enqueue(spec("entity", "a"), kT0).created);
  ASSERT_TRUE(store->enqueue(spec("entity", "b"), kT0).created);
  auto claimed = store->claim(claim_request("w", 2));
  ASSERT_EQ(claimed.size(), 2u);
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  const std::string trigger =
      "CREATE TRIGGER refuse BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'succeeded' AND "
      "NEW.id = " +
      std::to_string(claimed[0].job.id) + " BEGIN SELECT RAISE(ABORT, 'refused by this test'); END";
  ASSERT_EQ(sqlite3_exec(other, trigger.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  std::vector<Finish> items;
  for (const Claimed& c : claimed) {
    Finish f;
    f.kind = Finish::Kind::kComplete;
    f.id = c.job.id;
    f.token = c.lease_token;
    items.push_back(f);
  }
  std::vector<FinishResult> r;
  try {
    r = store->finish(items, kT0 + 10);
  } catch (const StorageError& e) {
    FAIL() << "one refused completion failed the whole call: " << e.what();
  }
  ASSERT_EQ(r.size(), 2u);
  EXPECT_FALSE(r[0].status);
  EXPECT_FALSE(r[0].retryable);
  EXPECT_NE(r[0].error.find("refused by this test"), std::string::npos) << r[0].error;
  EXPECT_EQ(r[1].status, JobStatus::kSucceeded);
}

// Review: a refused completion chunk and a refused failure chunk, each undone and redone one by
// one, leave the running counters, the attempt rows and the dead letters as one-by-one writes do
// (it fails when finish_jobs() does not restore `down` and `one_by_one` after the rollback).
TEST_F(SqliteStoreTest, RefusedChunksKeepCountersAttemptsAndLettersExact) {
  auto store = open();
  for (const char* key : {"a", "b", "c", "d"}) {
    JobSpec s = spec("entity", key);
    if (std::string(key) == "d") s.max_attempts = 1;
    ASSERT_TRUE(store->enqueue(s, kT0).created);
  }
  auto claimed = store->claim(claim_request("w", 4));
  ASSERT_EQ(claimed.size(), 4u);
  std::map<std::string, Claimed> by_key;
  for (const Claimed& c : claimed) by_key[c.job.concurrency_key] = c;
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  const std::string triggers =
      "CREATE TRIGGER refuse_a BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'succeeded' AND "
      "NEW.id = " +
      std::to_string(by_key["a"].job.id) +
      " BEGIN SELECT RAISE(ABORT, 'refused a'); END;"
      "CREATE TRIGGER refuse_c BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'queued' AND "
      "NEW.id = " +
      std::to_string(by_key["c"].job.id) + " BEGIN SELECT RAISE(ABORT, 'refused c'); END;";
  ASSERT_EQ(sqlite3_exec(other, triggers.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  std::vector<Finish> items;
  for (const char* key : {"a", "b", "c", "d"}) {
    Finish f;
    f.kind = (key[0] == 'a' || key[0] == 'b') ? Finish::Kind::kComplete : Finish::Kind::kFail;
    f.id = by_key[key].job.id;
    f.token = by_key[key].lease_token;
    f.failure.error = std::string("boom ") + key;
    items.push_back(f);
  }
  auto r = store->finish(items, kT0 + 10);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_FALSE(r[0].status) << r[0].error;
  EXPECT_EQ(r[1].status, JobStatus::kSucceeded);
  EXPECT_FALSE(r[2].status) << r[2].error;
  EXPECT_EQ(r[3].status, JobStatus::kDead) << r[3].error;
  // a and c still run: each (kind, key) row and the kind's total.
  EXPECT_EQ(
      query_value(path_, "SELECT running FROM running_counts WHERE kind = 'entity' AND total = 1"),
      "2");
  EXPECT_EQ(query_value(path_,
                        "SELECT COALESCE(SUM(running), 0) FROM running_counts WHERE "
                        "kind = 'entity' AND total = 0"),
            "2");
  EXPECT_EQ(query_value(path_, "SELECT COUNT(*) FROM dead_letters"), "1");
  EXPECT_EQ(query_value(path_, "SELECT COUNT(*) FROM attempts"), "1");
  EXPECT_EQ(query_value(path_,
                        "SELECT status FROM jobs WHERE id = " + std::to_string(by_key["c"].job.id)),
            "running");
}

// --- migrations ----------------------------------------------------------------------------

TEST_F(SqliteStoreTest, MigrateRecordsEachVersionOnceAndIsANoOpTheSecondTime) {
  const auto& migrations = sqlite_migrations();
  ASSERT_FALSE(migrations.empty());
  auto store = open();
  const std::string rows_sql = "SELECT version, name, applied_ms FROM schema_migrations";
  auto before = query_file(path_, rows_sql);
  ASSERT_EQ(before.size(), migrations.size());
  EXPECT_EQ(before[0][0], std::to_string(migrations[0].version));
  EXPECT_EQ(before[0][1], migrations[0].name);

  EXPECT_EQ(store->migrate(), migrations.back().version);
  EXPECT_EQ(store->migrate(), migrations.back().version);
  auto again = open();  // a second host starting up migrates too
  EXPECT_EQ(again->migrate(), migrations.back().version);
  EXPECT_EQ(query_file(path_, rows_sql), before) << "nothing re-applied, applied_ms unchanged";
}

// Schema 0002 writes an attempt's row when it ends. A job running across the upgrade already has
// its row open (schema 0001 opened it at the claim): it is shown once while running, and its end
// closes that row instead of adding a second.
TEST_F(SqliteStoreTest, AJobRunningAcrossTheAttemptRowUpgradeKeepsOneRowPerAttempt) {
  const auto& migrations = sqlite_migrations();
  ASSERT_GE(migrations.size(), 2u);
  ASSERT_EQ(migrations[1].version, 2);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    auto exec = [db](const std::string& sql) {
      char* error = nullptr;
      int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
      std::string message = error ? error : "";
      sqlite3_free(error);
      ASSERT_EQ(rc, SQLITE_OK) << message << " in " << sql;
    };
    exec(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "applied_ms INTEGER NOT NULL)");
    for (const std::string& statement : split_sql_statements(migrations[0].sql)) exec(statement);
    exec("INSERT INTO schema_migrations VALUES (1, '" + std::string(migrations[0].name) + "', 1)");
    // Attempt 1 failed; attempt 2 runs under token "tok" (as a schema-0001 claim left it).
    exec(
        "INSERT INTO jobs (id, kind, concurrency_key, status, attempts, max_attempts, "
        "run_after_ms, lease_owner, lease_token, lease_expires_ms, claims, created_ms, "
        "started_ms, updated_ms, payload) VALUES (1, 'entity', 'inst-1', 'running', 2, 5, "
        "1700000000000, 'old-host', 'tok', 1700000030000, 2, 1699999990000, 1700000000000, "
        "1700000000000, '{}')");
    exec(
        "INSERT INTO attempts (job_id, seq, attempt, owner, started_ms, finished_ms, outcome, "
        "error) VALUES (1, 1, 1, 'old-host', 1699999990000, 1699999995000, 'failed', 'boom'), "
        "(1, 2, 2, 'old-host', 1700000000000, 0, 'running', NULL)");
    exec(
        "INSERT INTO running_counts (kind, total, concurrency_key, running, max_running) VALUES "
        "('entity', 0, 'inst-1', 1, 1), ('entity', 1, '', 1, 1)");
    sqlite3_close(db);
  }
  auto store = open();
  EXPECT_EQ(store->migrate(), migrations.back().version);

  auto history = store->attempts(1);
  ASSERT_EQ(history.size(), 2u) << "the open row once, not also the job row's attempt";
  EXPECT_EQ(history[0].outcome, "failed");
  EXPECT_EQ(history[1].attempt, 2);
  EXPECT_EQ(history[1].outcome, "running");
  EXPECT_EQ(history[1].owner, "old-host");

  store->complete(1, "tok", "{}", kT0 + 100);
  history = store->attempts(1);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[1].attempt, 2);
  EXPECT_EQ(history[1].outcome, "succeeded");
  EXPECT_EQ(history[1].started_ms, kT0);
  EXPECT_EQ(history[1].finished_ms, kT0 + 100);
  EXPECT_EQ(store->running("entity", "inst-1"), 0);

  // A job claimed after the upgrade: no row while it runs, one when it ends.
  JobId id = store->enqueue(spec(), kT0).id;
  auto claimed = store->claim(claim_request("new-host", 1, kT0 + 200));
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_EQ(
      query_value(path_, "SELECT COUNT(*) FROM attempts WHERE job_id = " + std::to_string(id)),
      "0");
  history = store->attempts(id);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].outcome, "running");
  EXPECT_EQ(history[0].owner, "new-host");
  store->complete(id, claimed[0].lease_token, "{}", kT0 + 300);
  history = store->attempts(id);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].attempt, 1);
  EXPECT_EQ(history[0].outcome, "succeeded");
  EXPECT_EQ(history[0].finished_ms, kT0 + 300);
}

TEST_F(SqliteStoreTest, ADatabaseFromANewerBuildIsRefusedWithItsVersion) {
  const std::string error =
      refusal_after("INSERT INTO schema_migrations VALUES (999, 'future', 1)");
  EXPECT_NE(error.find("schema version 999, newer than this build's " +
                       std::to_string(sqlite_migrations().back().version)),
            std::string::npos)
      << error;
}

// A database whose recorded history has a gap (migration 2 deleted from schema_migrations by
// hand) is refused, naming the missing one, rather than having migration 2 applied after 3.
TEST_F(SqliteStoreTest, ADatabaseWhoseMigrationHistoryHasAGapIsRefusedNamingTheMissingOne) {
  const std::string error = refusal_after("DELETE FROM schema_migrations WHERE version = 2");
  EXPECT_NE(error.find("sqlite: the database records schema migration " +
                       std::to_string(sqlite_migrations().back().version) + " but not 2 ('" +
                       sqlite_migrations().at(1).name + "')"),
            std::string::npos)
      << error;
}

// A store.path that holds something else (a file that is not a database) stops the start: the
// error names the file, as the one for a file that cannot be opened does. It said only "sqlite:
// file is not a database (code 26) in: PRAGMA journal_mode=WAL", which file left to guess.
TEST_F(SqliteStoreTest, AFileThatIsNotADatabaseIsRefusedNamingTheFile) {
  {
    FILE* f = std::fopen(path_.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("this is the audit log, not a database\n", f);
    std::fclose(f);
  }
  try {
    open();
    FAIL() << "opened a file that is not a database";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a database"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
}

// A database file this process cannot write (permissions, an immutable file, a read-only mount)
// is opened read-only by SQLite without an error. The store is refused at open, naming the file,
// as the daemon's start expects ("a store that cannot be opened is an error"): it opened, the
// daemon started and answered, and every write after (each claim, enqueue, retry) failed with
// "attempt to write a readonly database".
TEST_F(SqliteStoreTest, ADatabaseFileThatCannotBeWrittenIsRefusedAtOpenNamingIt) {
  open()->enqueue(spec(), kT0);  // a store at the current schema: migrating it writes nothing
  struct Unwritable {
    std::string path;
    bool immutable = false;
    ~Unwritable() {
      if (immutable) (void)!std::system(("chattr -i '" + path + "' 2>/dev/null").c_str());
      std::error_code ignored;
      fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, ignored);
    }
  } unwritable{path_};
  if (::geteuid() == 0) {  // root writes through permissions; an immutable file it cannot
    unwritable.immutable = std::system(("chattr +i '" + path_ + "' 2>/dev/null").c_str()) == 0;
    ASSERT_TRUE(unwritable.immutable) << "as root, this test needs chattr +i on " << path_;
  } else {
    fs::permissions(path_, fs::perms::owner_read);
  }
  try {
    auto store = open();
    ADD_FAILURE() << "opened a database it cannot write; a write then says: " << [&] {
      try {
        store->enqueue(spec(), kT0);
        return std::string("(it worked)");
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    }();
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
  }
}

TEST_F(SqliteStoreTest, HostsStartingTogetherOnAFreshFileMigrateItOnce) {
  constexpr int kHosts = 4;
  std::latch start(kHosts);
  std::vector<std::unique_ptr<SqliteJobStore>> stores(kHosts);
  std::vector<std::string> errors(kHosts);
  std::vector<std::thread> threads;
  for (int i = 0; i < kHosts; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      try {
        stores[i] = open();
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kHosts; ++i) {
    ASSERT_EQ(errors[i], "") << "host " << i;
    EXPECT_EQ(stores[i]->migrate(), sqlite_migrations().back().version);
  }
  EXPECT_EQ(query_value(path_, "SELECT COUNT(*) FROM schema_migrations"),
            std::to_string(sqlite_migrations().size()));
}

// --- several hosts on one file -------------------------------------------------------------

TEST_F(SqliteStoreTest, TwoHostsOnOneFileClaimDisjointJobs) {
  auto host_a = open();
  auto host_b = open();
  constexpr int kJobs = 400;
  std::vector<JobSpec> specs;
  for (int i = 0; i < kJobs; ++i) specs.push_back(spec("entity", "inst-" + std::to_string(i % 7)));
  host_a->enqueue_batch(specs, kT0);

  std::mutex mutex;
  std::multiset<JobId> claimed;
  std::vector<std::thread> workers;
  for (int w = 0; w < 8; ++w) {
    JobStore& store = w % 2 ? *host_b : *host_a;
    workers.emplace_back([&, w] {
      const std::string owner = (w % 2 ? "host-b/" : "host-a/") + std::to_string(w);
      while (true) {
        auto batch = store.claim(claim_request(owner, 1 + w % 4));
        if (batch.empty()) return;
        for (const Claimed& c : batch) {
          {
            std::lock_guard lock(mutex);
            claimed.insert(c.job.id);
          }
          store.complete(c.job.id, c.lease_token, "{}", kT0 + 1);
        }
      }
    });
  }
  for (auto& t : workers) t.join();

  EXPECT_EQ(claimed.size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(std::set<JobId>(claimed.begin(), claimed.end()).size(), claimed.size())
      << "a job was claimed twice";
  EXPECT_EQ((host_b->counts()[{"entity", JobStatus::kSucceeded}]), kJobs);
  // One attempt each, by the host that claimed it; a successful one stays in the job row.
  for (JobId id : claimed) {
    auto history = host_a->attempts(id);
    ASSERT_EQ(history.size(), 1u) << "job " << id;
    EXPECT_EQ(history[0].outcome, "succeeded");
    EXPECT_EQ(history[0].owner.substr(0, 5), "host-");
  }
  EXPECT_EQ(query_value(path_, "SELECT COUNT(*) FROM attempts"), "0");
  EXPECT_EQ(host_a->running("entity", ""), 0);
}

// A successful attempt writes no attempt row: it stays in the job row, which keeps its owner,
// and attempts() shows it after the rows of the attempts before it. Both ways to complete (one
// job, and a finish() batch) do this; the job reports no lease once it succeeded.
TEST_F(SqliteStoreTest, ASuccessfulAttemptStaysInTheJobRow) {
  auto store = open();
  JobSpec retried = spec();
  retried.max_attempts = 3;
  const JobId one = store->enqueue(retried, kT0).id;
  const JobId batched = store->enqueue(spec(), kT0).id;

  auto first = store->claim(claim_request("host-a", 1));
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].job.id, one);
  store->fail(one, first[0].lease_token, {"boom", false, 0}, kT0 + 10);
  auto claimed = store->claim(claim_request("host-b", 2, kT0 + 20));
  ASSERT_EQ(claimed.size(), 2u);
  for (const Claimed& c : claimed) {
    if (c.job.id == one) {
      store->complete(one, c.lease_token, "{\"n\":1}", kT0 + 30);
    } else {
      Finish f;
      f.kind = Finish::Kind::kComplete;
      f.id = c.job.id;
      f.token = c.lease_token;
      f.result_json = "{\"n\":2}";
      auto results = store->finish({f}, kT0 + 40);
      ASSERT_EQ(results.size(), 1u);
      EXPECT_EQ(results[0].status, JobStatus::kSucceeded);
    }
  }

  auto history = store->attempts(one);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].outcome, "failed");
  EXPECT_EQ(history[0].owner, "host-a");
  EXPECT_EQ(history[0].error, std::optional<std::string>("boom"));
  EXPECT_EQ(history[1].outcome, "succeeded");
  EXPECT_EQ(history[1].owner, "host-b");
  EXPECT_EQ(history[1].attempt, 2);
  EXPECT_EQ(history[1].started_ms, kT0 + 20);
  EXPECT_EQ(history[1].finished_ms, kT0 + 30);
  auto other = store->attempts(batched);
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other[0].outcome, "succeeded");
  EXPECT_EQ(other[0].owner, "host-b");
  EXPECT_EQ(other[0].finished_ms, kT0 + 40);

  EXPECT_EQ(query_value(path_, "SELECT COUNT(*) FROM attempts"), "1");  // the failure's
  for (JobId id : {one, batched}) {
    Job job = *store->get(id);
    EXPECT_EQ(job.status, JobStatus::kSucceeded);
    EXPECT_FALSE(job.lease_owner) << "job " << id;
    EXPECT_FALSE(job.lease_token) << "job " << id;
  }
  EXPECT_EQ(store->get(batched)->result, std::optional<std::string>("{\"n\":2}"));
}

// --- group commit --------------------------------------------------------------------------

TEST_F(SqliteStoreTest, GroupCommitDeliversEachResultToItsOwnCaller) {
  auto store = open();
  constexpr int kThreads = 8;
  constexpr int kPerThread = 150;
  std::vector<std::vector<JobId>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string payload =
            "{\"thread\":" + std::to_string(t) + ",\"i\":" + std::to_string(i) + "}";
        EnqueueResult r = store->enqueue(spec("entity", "k", payload), kT0);
        ids[t].push_back(r.id);
        // Read-your-writes: the acknowledgement means committed, so any reader sees it.
        std::optional<Job> job = store->get(r.id);
        ASSERT_TRUE(job.has_value());
        ASSERT_EQ(job->payload, payload);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<JobId> distinct;
  for (const auto& v : ids) distinct.insert(v.begin(), v.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads * kPerThread));
  SqliteStoreStats stats = store->stats();
  EXPECT_GE(stats.operations, kThreads * kPerThread);
  EXPECT_LE(stats.transactions, stats.operations);
}

TEST_F(SqliteStoreTest,
       OperationsQueuedBehindATransactionShareTheNextAndALeaseLostFailsOnlyItself) {
  auto store = open();
  constexpr int kJobs = 6;
  for (int i = 0; i < kJobs; ++i) store->enqueue(spec(), kT0);
  std::vector<Claimed> claimed = store->claim(claim_request("w", kJobs));
  ASSERT_EQ(claimed.size(), static_cast<size_t>(kJobs));

  std::atomic<bool> holding{false}, release{false};
  const int64_t transactions_before = store->stats().transactions;
  std::thread holder = hold_writer(*store, holding, release);
  // kJobs - 1 completions with their tokens, one with a stale token: all queue behind the holder.
  std::vector<std::string> outcome(kJobs);
  std::vector<std::thread> callers;
  for (int i = 0; i < kJobs; ++i) {
    callers.emplace_back([&, i] {
      const bool stale = i == 2;
      try {
        store->complete(claimed[i].job.id, stale ? "stale-token" : claimed[i].lease_token,
                        "{\"i\":" + std::to_string(i) + "}", kT0 + 1);
        outcome[i] = "ok";
      } catch (const LeaseLost&) {
        outcome[i] = "lease lost";
      } catch (const std::exception& e) {
        outcome[i] = e.what();
      }
    });
  }
  std::this_thread::sleep_for(200ms);  // let every caller queue up behind the holder
  release = true;
  holder.join();
  for (auto& t : callers) t.join();

  for (int i = 0; i < kJobs; ++i) {
    EXPECT_EQ(outcome[i], i == 2 ? "lease lost" : "ok") << "caller " << i;
    const std::string status = query_value(
        path_, "SELECT status FROM jobs WHERE id = " + std::to_string(claimed[i].job.id));
    EXPECT_EQ(status, i == 2 ? "running" : "succeeded") << "job of caller " << i;
  }
  EXPECT_EQ(store->stats().transactions - transactions_before, 2)
      << "the holder's transaction, then one for all six completions";
  EXPECT_GE(store->stats().max_batch, kJobs);
}

TEST_F(SqliteStoreTest, AFailedOperationIsRolledBackAloneWithinItsBatch) {
  auto store = open();
  std::atomic<bool> holding{false}, release{false};
  const int64_t transactions_before = store->stats().transactions;
  std::thread holder = hold_writer(*store, holding, release);
  std::string batch_error;
  std::thread failing([&] {
    // The first job is inserted, then the second is refused: the whole batch must vanish.
    try {
      store->enqueue_batch({spec("entity", "k", "{\"first\":1}"), spec("", "k")}, kT0);
    } catch (const std::invalid_argument& e) {
      batch_error = e.what();
    }
  });
  std::optional<EnqueueResult> ok;
  std::thread succeeding([&] { ok = store->enqueue(spec("entity", "k", "{\"ok\":1}"), kT0); });
  std::this_thread::sleep_for(200ms);
  release = true;
  holder.join();
  failing.join();
  succeeding.join();

  EXPECT_NE(batch_error, "");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(store->stats().transactions - transactions_before, 2) << "both in one transaction";
  EXPECT_EQ(query_file(path_, "SELECT payload FROM jobs"),
            (std::vector<std::vector<std::string>>{{"{\"ok\":1}"}}));
}

// --- durability ----------------------------------------------------------------------------

TEST_F(SqliteStoreTest, AcknowledgedChangesAreCommittedAndSurviveReopening) {
  std::vector<JobId> completed;
  std::vector<JobId> dead;
  {
    auto store = open();
    for (int i = 0; i < 60; ++i) store->enqueue(spec(), kT0);
    std::vector<Claimed> claimed = store->claim(claim_request("w", 40));
    ASSERT_EQ(claimed.size(), 40u);
    for (size_t i = 0; i < claimed.size(); ++i) {
      const Claimed& c = claimed[i];
      if (i % 4 == 0) {
        Failure fatal{"HTTP 404", true, 0};
        store->fail(c.job.id, c.lease_token, fatal, kT0 + 1);
        dead.push_back(c.job.id);
      } else {
        store->complete(c.job.id, c.lease_token, "{\"n\":" + std::to_string(i) + "}", kT0 + 1);
        completed.push_back(c.job.id);
      }
      // Acknowledged = committed: a connection of another process sees it at once.
      const std::string status =
          query_value(path_, "SELECT status FROM jobs WHERE id = " + std::to_string(c.job.id));
      EXPECT_TRUE(status == "succeeded" || status == "dead") << status;
    }
  }
  auto reopened = open();
  for (JobId id : completed) {
    std::optional<Job> job = reopened->get(id);
    ASSERT_TRUE(job.has_value());
    EXPECT_EQ(job->status, JobStatus::kSucceeded);
    ASSERT_TRUE(job->result.has_value());
  }
  for (JobId id : dead) EXPECT_EQ(reopened->get(id)->status, JobStatus::kDead);
  auto counts = reopened->counts();
  EXPECT_EQ((counts[{"entity", JobStatus::kSucceeded}]), 30);
  EXPECT_EQ((counts[{"entity", JobStatus::kDead}]), 10);
  EXPECT_EQ((counts[{"entity", JobStatus::kQueued}]), 20);
  EXPECT_EQ((reopened->dead_letter_stats()[{"entity", DeadLetterStatus::kPending}]), 10);
  EXPECT_EQ(reopened->running("entity", ""), 0);
  EXPECT_EQ(reopened->max_running_seen("entity", ""), 40);
}

// --- claiming under caps -------------------------------------------------------------------

TEST_F(SqliteStoreTest, EveryKeyProgressesWhenTheGlobalCapBinds) {
  auto store = open();
  store->set_caps("entity", Caps{5, 30});
  // Ten tenants, each enqueued as one block of 1000 (as a backfill run fans out): the oldest
  // tenants' backlogs come first in (priority, run_after, id) order.
  for (int k = 0; k < 10; ++k) {
    std::vector<JobSpec> block(1000, spec("entity", "inst-" + std::to_string(k)));
    store->enqueue_batch(block, kT0);
  }
  std::vector<Claimed> first = store->claim(claim_request("w", 100));
  ASSERT_EQ(first.size(), 30u) << "the global cap";
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(store->running("entity", "inst-" + std::to_string(k)), 3) << "tenant " << k;
  }
  EXPECT_EQ(store->max_running_seen("entity", ""), 30);

  // Tenant 0 finishes its three: the freed slots go to the least-loaded tenant, tenant 0 again,
  // rather than to whichever tenant is oldest.
  for (const Claimed& c : first) {
    if (c.job.concurrency_key == "inst-0") store->complete(c.job.id, c.lease_token, "{}", kT0 + 1);
  }
  std::vector<Claimed> second = store->claim(claim_request("w", 100, kT0 + 2));
  ASSERT_EQ(second.size(), 3u);
  for (const Claimed& c : second) EXPECT_EQ(c.job.concurrency_key, "inst-0");
  EXPECT_EQ(store->max_running_seen("entity", "inst-0"), 3);
}

// Jobs waiting for a later time (throttled, backing off, deferred by an open circuit) are not
// stepped over by claims: each claim read them all, at every better priority and after the due
// ones of its own, and with 200 000 of them each claim took about 22 ms of the writer.
TEST_F(SqliteStoreTest, ClaimsDoNotStepOverJobsThatAreNotDueYet) {
  auto store = open();
  store->set_caps("capped", Caps{1, 0});
  std::vector<JobSpec> later;
  for (const char* kind : {"plain", "capped"}) {
    for (int i = 0; i < 3000; ++i) {
      JobSpec s = spec(kind);
      s.priority = i % 3 - 1;  // -1, 0 and 1: before, with and after the due job below
      s.run_after_ms = kT0 + 3'600'000;
      later.push_back(s);
    }
  }
  store->enqueue_batch(later, kT0);
  std::set<JobId> due;
  for (const char* kind : {"plain", "capped"}) due.insert(store->enqueue(spec(kind), kT0).id);

  const int64_t before = store->stats().claim_read_steps;
  std::set<JobId> claimed;
  for (const Claimed& c : store->claim(claim_request("w", 100, kT0 + 1))) {
    claimed.insert(c.job.id);
    store->complete(c.job.id, c.lease_token, "{}", kT0 + 1);
  }
  EXPECT_EQ(claimed, due);
  const int64_t steps = store->stats().claim_read_steps - before;
  EXPECT_GT(steps, 0);
  EXPECT_LT(steps, 1000) << "a claim read past the 6000 jobs that are not due yet";

  // Once due, they are claimed in priority order: the plain kind's 1000 of the best priority come
  // before any of the next, and the capped kind's one (its cap) too.
  std::vector<Claimed> next = store->claim(claim_request("w", 1001, kT0 + 3'600'000));
  ASSERT_EQ(next.size(), 1001u);
  int capped = 0;
  for (const Claimed& c : next) {
    EXPECT_EQ(c.job.priority, -1) << c.job.kind;
    capped += c.job.kind == "capped";
  }
  EXPECT_EQ(capped, 1);
}

// Claims read a few priorities one at a time and the rest as one range: across both, the due jobs
// come in priority order and those not due yet are left.
TEST_F(SqliteStoreTest, ClaimsTakeTheDueJobsOfManyPrioritiesInOrder) {
  auto store = open();
  store->set_caps("capped", Caps{1000, 0});
  std::vector<JobSpec> specs;
  for (int priority = 39; priority >= 0; --priority) {
    for (const char* kind : {"plain", "capped"}) {
      JobSpec s = spec(kind);
      s.priority = priority;
      s.run_after_ms = kT0 + 3'600'000;
      specs.push_back(s);
      s.run_after_ms = kT0;
      specs.push_back(s);
    }
  }
  store->enqueue_batch(specs, kT0);
  for (const char* kind : {"plain", "capped"}) {
    ClaimRequest request = claim_request("w", 25, kT0 + 1);
    request.kinds = {kind};
    std::vector<int> priorities;
    for (const Claimed& c : store->claim(request)) priorities.push_back(c.job.priority);
    request.limit = 100;
    for (const Claimed& c : store->claim(request)) priorities.push_back(c.job.priority);
    std::vector<int> expected(40);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(priorities, expected) << kind;
  }
}

// A key's jobs are read a page at a time, each page after the last job of the one before: across
// priorities (the extremes included), past the ones read one by one, and around the jobs not due.
TEST_F(SqliteStoreTest, ClaimsPageThroughAKeysPrioritiesInOrder) {
  auto store = open();
  store->set_caps("capped", Caps{1000, 0});
  std::vector<int> priorities = {INT_MIN, INT_MAX};
  for (int p = -9; p < 9; ++p) priorities.push_back(p * 1000);
  std::vector<JobSpec> specs;
  for (int priority : priorities) {
    for (int64_t run_after : {kT0 + 3'600'000, kT0, kT0 - 1}) {
      JobSpec s = spec("capped", "a");
      s.priority = priority;
      s.run_after_ms = run_after;
      specs.push_back(s);
    }
  }
  specs.push_back(spec("capped", "b"));
  store->enqueue_batch(specs, kT0);

  // Pages of want / keys + 2: a claim of 10 reads key a's jobs in pages of 7.
  std::vector<std::pair<int, int64_t>> order;  // key a's, in the order claimed
  std::set<JobId> ids;
  for (size_t limit : {10u, 7u, 100u}) {
    for (const Claimed& c : store->claim(claim_request("w", limit, kT0 + 1))) {
      EXPECT_TRUE(ids.insert(c.job.id).second) << "job " << c.job.id << " claimed twice";
      EXPECT_LE(c.job.run_after_ms, kT0) << "job " << c.job.id << " is not due";
      if (c.job.concurrency_key == "a") order.emplace_back(c.job.priority, c.job.run_after_ms);
    }
  }
  EXPECT_EQ(ids.size(), 2 * priorities.size() + 1);
  std::vector<std::pair<int, int64_t>> expected;
  std::sort(priorities.begin(), priorities.end());
  for (int priority : priorities) {
    expected.emplace_back(priority, kT0 - 1);
    expected.emplace_back(priority, kT0);
  }
  EXPECT_EQ(order, expected);
}

TEST_F(SqliteStoreTest, TheSchemaLetsClaimsSeekInsteadOfScanning) {
  auto store = open();
  store->enqueue(spec(), kT0);
  auto plan = [&](const std::string& sql) {
    std::string text;
    for (const auto& row : query_file(path_, "EXPLAIN QUERY PLAN " + sql)) {
      text += row.back() + "\n";
    }
    return text;
  };
  // The claims' reads of the claim indexes, as the store makes them: a saturated tenant's backlog
  // is skipped by seeking each unsaturated key's head; within a priority, the due jobs are a
  // range that ends at the first job not yet due (`at`, `first`); the rest past the priorities
  // read one by one are one range (`from`); none sorts.
  const std::vector<std::string> reads = detail::claim_read_statements();
  ASSERT_EQ(reads.size(), 6u);
  const char* const kinds[] = {"jobs_claim_kind (kind=? AND ",
                               "jobs_claim_key (kind=? AND "
                               "concurrency_key=? AND "};
  for (size_t i = 0; i < reads.size(); ++i) {
    const std::string text = plan(reads[i]);
    const std::string index = kinds[i / 3];
    EXPECT_EQ(text.find("TEMP B-TREE"), std::string::npos) << text;
    EXPECT_EQ(text.find("SCAN jobs"), std::string::npos) << text;
    if (i % 3 == 0) {  // at
      EXPECT_NE(text.find(index + "priority=? AND run_after_ms>? AND run_after_ms<?)"),
                std::string::npos)
          << text;
    } else if (i % 3 == 1) {  // first
      EXPECT_NE(text.find(index + "priority=? AND run_after_ms<?)"), std::string::npos) << text;
      EXPECT_NE(text.find(index + "priority>?)"), std::string::npos) << text;
    } else {  // from
      EXPECT_NE(text.find(index + "priority>?)"), std::string::npos) << text;
    }
  }
  std::string next_key = plan(
      "SELECT concurrency_key FROM jobs WHERE status = 'queued' AND fair = 1 "
      "AND kind = 'entity' AND concurrency_key > 'k' ORDER BY concurrency_key LIMIT 1");
  EXPECT_NE(next_key.find("jobs_claim_key (kind=? AND concurrency_key>?)"), std::string::npos)
      << next_key;
  // A queued job is in one of the two claim indexes: the next kind with queued jobs is a seek in
  // each, and counting queued jobs scans the two indexes, not the table.
  std::string next_kind = plan(
      "SELECT * FROM (SELECT kind FROM jobs WHERE status = 'queued' AND fair = 0 AND kind > 'a' "
      "ORDER BY kind LIMIT 1) UNION ALL SELECT * FROM (SELECT kind FROM jobs WHERE status = "
      "'queued' AND fair = 1 AND kind > 'a' ORDER BY kind LIMIT 1) ORDER BY 1 LIMIT 1");
  EXPECT_NE(next_kind.find("jobs_claim_kind (kind>?)"), std::string::npos) << next_kind;
  EXPECT_NE(next_kind.find("jobs_claim_key (kind>?)"), std::string::npos) << next_kind;
  std::string counts = plan(
      "SELECT kind, COUNT(*) FROM jobs WHERE status = 'queued' AND fair = 0 GROUP BY kind "
      "UNION ALL SELECT kind, COUNT(*) FROM jobs WHERE status = 'queued' AND fair = 1 "
      "GROUP BY kind");
  EXPECT_NE(counts.find("SCAN jobs USING INDEX jobs_claim_kind"), std::string::npos) << counts;
  EXPECT_NE(counts.find("SCAN jobs USING INDEX jobs_claim_key"), std::string::npos) << counts;
}

}  // namespace
}  // namespace backhaul::jobs
