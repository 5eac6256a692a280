// Private to the SQLite job store (sqlite_store.cpp): a thin RAII layer over the sqlite3 C API.
//
// Connections are opened through Poco Data (registerConnector, Session). Statements then run on
// the session's raw sqlite3 handle, prepared once per connection and cached: measured here, one
// UPDATE by id costs ~8 us through Poco's per-call `session << ...`, ~6 us with a reused
// Poco::Data::Statement, and ~1.2 us with a cached sqlite3_stmt; the queue runs ~8 statements
// per job on its hot path.
//
// All writes go through one GroupCommitWriter per store: callers hand it an operation and block;
// the writer thread runs every pending operation in ONE transaction (BEGIN IMMEDIATE), each inside
// its own SAVEPOINT so that one operation's exception (LeaseLost, a constraint) undoes only that
// operation, commits, and only then wakes the callers. Reads borrow a connection from a
// ReaderPool (WAL lets readers run beside the writer and see every committed transaction).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <Poco/Data/SQLite/Connector.h>
#include <Poco/Data/SQLite/Utility.h>
#include <Poco/Data/Session.h>

#include "core/common/errors.h"
#include <pthread.h>
#include <sqlite3.h>
#include <unistd.h>

namespace backhaul::jobs::sqlite {

// An error the same call may not meet again (StorageError::transient()): the file locked by
// another connection past the busy timeout (a lock conflict), or the disk failing or full.
// Anything else (a constraint, a corrupt file, a statement the schema refuses) is the call's own.
inline StorageError storage_error(std::string message, int rc) {
  const int primary = rc & 0xff;
  const bool locked = primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
  const bool disk = primary == SQLITE_IOERR || primary == SQLITE_FULL;
  return StorageError(std::move(message), disk, locked);
}

[[noreturn]] inline void throw_error(sqlite3* db, int rc, std::string_view context) {
  std::string message = "sqlite: ";
  message += db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  message += " (code " + std::to_string(rc) + ")";
  if (!context.empty()) {
    message += " in: ";
    message += context.substr(0, 160);
  }
  throw storage_error(std::move(message), rc);
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// One execution of a prepared statement. Binds by position (1-based), steps, reads columns
// (0-based). On destruction it resets the statement and clears its bindings, so the connection's
// cache can hand it out again; an uncached statement is finalized instead.
class Query {
 public:
  Query(sqlite3* db, sqlite3_stmt* stmt, bool* in_use) : db_(db), stmt_(stmt), in_use_(in_use) {}
  Query(Query&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), in_use_(other.in_use_) {}
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;
  Query& operator=(Query&&) = delete;
  ~Query() {
    if (!stmt_) return;
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    if (in_use_) {
      *in_use_ = false;
    } else {
      sqlite3_finalize(stmt_);
    }
  }

  // Integers (and bool) bind as INTEGER, floating point as REAL, anything convertible to
  // std::string_view as TEXT (copied), std::nullopt and empty optionals as NULL.
  template <class T>
  Query& bind(int index, const T& value) {
    if constexpr (is_optional<T>::value) {
      return value ? bind(index, *value) : bind(index, std::nullopt);
    } else {
      int rc = bind_value(index, value);
      if (rc != SQLITE_OK) throw_error(db_, rc, sqlite3_sql(stmt_));
      return *this;
    }
  }

  // Binds TEXT without copying: `text` must stay alive and unchanged until the statement has
  // run (the Query is destroyed).
  Query& bind_static(int index, std::string_view text) {
    int rc =
        sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_STATIC, SQLITE_UTF8);
    if (rc != SQLITE_OK) throw_error(db_, rc, sqlite3_sql(stmt_));
    return *this;
  }

  // Binds the arguments to ?1, ?2, ... in order.
  template <class... Args>
  Query& args(const Args&... values) {
    int index = 0;
    (bind(++index, values), ...);
    return *this;
  }

  // Returns true while a row is available.
  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw_error(db_, rc, sqlite3_sql(stmt_));
  }
  // Runs to completion, ignoring rows; returns the number of rows changed.
  int64_t run() {
    while (step()) {
    }
    return sqlite3_changes64(db_);
  }

  // The virtual machine steps run since the last call (or since the statement was prepared).
  int64_t vm_steps() { return sqlite3_stmt_status(stmt_, SQLITE_STMTSTATUS_VM_STEP, 1); }

  bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t i64(int col) const { return sqlite3_column_int64(stmt_, col); }
  int i32(int col) const { return sqlite3_column_int(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string text(int col) const {
    const auto* data = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return data ? std::string(data, static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
                : std::string();
  }
  std::optional<std::string> opt_text(int col) const {
    if (is_null(col)) return std::nullopt;
    return text(col);
  }
  std::optional<int64_t> opt_i64(int col) const {
    if (is_null(col)) return std::nullopt;
    return i64(col);
  }

 private:
  template <class T>
  int bind_value(int index, const T& value) {
    if constexpr (std::is_same_v<T, std::nullopt_t>) {
      return sqlite3_bind_null(stmt_, index);
    } else if constexpr (std::is_integral_v<T>) {
      return sqlite3_bind_int64(stmt_, index, static_cast<sqlite3_int64>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      return sqlite3_bind_double(stmt_, index, static_cast<double>(value));
    } else {
      std::string_view text(value);
      return sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT,
                                 SQLITE_UTF8);
    }
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  bool* in_use_;  // the cache slot's flag; nullptr = uncached, finalize when done
};

struct ConnectionOptions {
  int busy_timeout_ms = 10'000;
  bool read_only = false;     // PRAGMA query_only: a reader cannot write by mistake
  int cache_kib = 16 * 1024;  // page cache size
};

// One SQLite connection opened through Poco Data, with its prepared-statement cache.
// Not thread-safe: one thread uses it at a time (the writer thread, or a reader's borrower).
class Connection {
 public:
  Connection(const std::string& path, const ConnectionOptions& options)
      : session_(open(path)), db_(Poco::Data::SQLite::Utility::dbHandle(session_)) {
    // The busy handler first: switching to WAL needs a lock another process may hold.
    busy_.timeout = std::chrono::milliseconds(options.busy_timeout_ms);
    sqlite3_busy_handler(db_, &Connection::on_busy, &busy_);
    if (!options.read_only) {
      refuse_another_programs_database(path);
      ensure_wal(path, options.busy_timeout_ms);
      // SQLite opens a file it cannot write (permissions, an immutable file, a read-only mount)
      // read-only, silently: every write would then fail. The store is refused here instead.
      if (sqlite3_db_readonly(db_, "main") == 1) {
        throw StorageError("sqlite: " + path +
                           " is read-only (the file's permissions, or a read-only file system): "
                           "the store writes to it");
      }
    }
    exec("PRAGMA synchronous=FULL");  // every acknowledged commit is on disk (fsync per commit)
    exec("PRAGMA foreign_keys=ON");
    // The writer's statements use indexes and need no large temporary structures; a reader's
    // GROUP BY or sort over a large table (counts() of a million finished jobs) spills to a
    // temporary file past the page cache instead of growing the heap.
    if (!options.read_only) exec("PRAGMA temp_store=MEMORY");
    exec("PRAGMA cache_size=-" + std::to_string(options.cache_kib));
    if (options.read_only) exec("PRAGMA query_only=ON");
  }
  ~Connection() {
    for (auto& [sql, slot] : cache_) sqlite3_finalize(slot.stmt);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  sqlite3* handle() const { return db_; }

  // A prepared statement for `sql`, from the cache. When the cached one is still in use (a
  // nested query with the same text), a fresh uncached statement is prepared instead.
  Query query(const std::string& sql) {
    auto it = cache_.find(sql);
    if (it == cache_.end()) {
      // Prepared before insertion: a statement that fails to prepare is not cached.
      it = cache_.emplace(sql, Slot{prepare(sql, SQLITE_PREPARE_PERSISTENT), false}).first;
    }
    Slot& slot = it->second;
    if (slot.in_use) return Query(db_, prepare(sql, 0), nullptr);
    slot.in_use = true;
    return Query(db_, slot.stmt, &slot.in_use);
  }

  // Runs one or more statements without caching them (PRAGMAs, DDL, transaction control).
  void exec(const std::string& sql) {
    char* error = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error);
    if (rc != SQLITE_OK) {
      std::string message = error ? error : sqlite3_errstr(rc);
      sqlite3_free(error);
      throw storage_error(
          "sqlite: " + message + " (code " + std::to_string(rc) + ") in: " + sql.substr(0, 160),
          rc);
    }
  }

  // The value of a PRAGMA on this connection, as text.
  std::string pragma(const std::string& name) {
    Query q = query("PRAGMA " + name);
    return q.step() ? q.text(0) : std::string();
  }

  // False while a transaction is open (SQLite rolls back on its own after some I/O errors).
  bool autocommit() const { return sqlite3_get_autocommit(db_) != 0; }

 private:
  struct Slot {
    sqlite3_stmt* stmt = nullptr;
    bool in_use = false;
  };

  static Poco::Data::Session open(const std::string& path) {
    static const bool registered = [] {
      // Before SQLite initializes (else these return SQLITE_MISUSE and change nothing): no
      // memory statistics (a global mutex around every allocation), and no per-connection
      // mutexes -- every Connection is used by one thread at a time (the writer thread, or a
      // reader's borrower). Measured: ~10% of the queue's writer time.
      sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
      sqlite3_config(SQLITE_CONFIG_MULTITHREAD);
      Poco::Data::SQLite::Connector::registerConnector();
      return true;
    }();
    (void)registered;
    try {
      // Poco retries a failing open until this "login timeout" (seconds; 60 by default). A file
      // that cannot be opened now (missing directory, permissions) will not open later either.
      constexpr size_t kOpenTimeoutSeconds = 1;
      return Poco::Data::Session("SQLite", path, kOpenTimeoutSeconds);
    } catch (const Poco::Exception& e) {
      const std::string why = open_failure_reason(path);
      throw StorageError("sqlite: cannot open " + path + ": " +
                         (why.empty() ? e.displayText() : why + " (" + e.displayText() + ")"));
    }
  }

  // What the file system says about `path` when SQLite could not open it ("unable to open
  // database file" alone names no cause), or "" when it says nothing useful.
  static std::string open_failure_reason(const std::string& path) {
    namespace fs = std::filesystem;
    if (path.empty() || path == ":memory:" || path.rfind("file:", 0) == 0) return "";
    // "Absent" only when the file system says so: a directory that cannot be searched leaves the
    // file's status unknown (EACCES), not missing.
    const auto absent = [](const std::error_code& e) {
      return e == std::errc::no_such_file_or_directory || e == std::errc::not_a_directory;
    };
    std::error_code error;
    const fs::path file(path);
    const fs::file_status status = fs::status(file, error);
    if (error && !absent(error)) return error.message();
    if (fs::is_directory(status)) return "it is a directory";
    const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
    if (!fs::exists(status)) {
      const fs::file_status dir_status = fs::status(dir, error);
      if (error && !absent(error)) return "the directory " + dir.string() + ": " + error.message();
      if (!fs::exists(dir_status)) return "the directory " + dir.string() + " does not exist";
      if (!fs::is_directory(dir_status)) return dir.string() + " is not a directory";
      if (::access(dir.c_str(), W_OK | X_OK) != 0) {
        const int e = errno;
        return "the directory " + dir.string() + " is not writable (" + std::strerror(e) + ")";
      }
      return "";
    }
    if (::access(file.c_str(), R_OK | W_OK) != 0) {
      const int e = errno;
      return "the file is not readable and writable (" + std::string(std::strerror(e)) + ")";
    }
    return "";
  }

  // A database with tables but no schema_migrations is another program's (a mistyped path): it
  // is refused before anything is written to it, its journal mode included. (A store's first
  // migration commits whole, with its record.) A file that cannot be read as a database is left
  // to ensure_wal(), whose error names it.
  void refuse_another_programs_database(const std::string& path) {
    sqlite3_stmt* stmt = nullptr;
    const char* sql =
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
        "ESCAPE '\\' ORDER BY name";
    if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return;
    }
    std::vector<std::string> tables;
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      tables.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)));
    }
    sqlite3_finalize(stmt);
    if (tables.empty() ||
        std::find(tables.begin(), tables.end(), "schema_migrations") != tables.end()) {
      return;
    }
    std::string names;
    for (size_t i = 0; i < tables.size() && i < 5; ++i) names += (i ? ", " : "") + tables[i];
    if (tables.size() > 5) names += ", ...";
    throw StorageError("sqlite: " + path +
                       " is not a backhaul store: it holds tables of its own (" + names +
                       ") and no schema_migrations; give the path of a backhaul store, or of a new "
                       "file");
  }

  // Switching a fresh file to WAL needs an exclusive lock, and SQLite answers SQLITE_BUSY at
  // once (no busy handler) while another connection opens the same new file: retry until the
  // busy timeout.
  void ensure_wal(const std::string& path, int busy_timeout_ms) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(busy_timeout_ms);
    // The first statement to read the file: its errors (not a database, cannot be opened or
    // written) name the file, which the daemon's "cannot start" line otherwise leaves to guess.
    auto fail = [&](int rc) {
      throw storage_error("sqlite: " + path + ": " + sqlite3_errmsg(db_) + " (code " +
                              std::to_string(rc) + ") in: PRAGMA journal_mode=WAL",
                          rc);
    };
    for (int attempt = 0;; ++attempt) {
      sqlite3_stmt* stmt = nullptr;
      const char* sql = "PRAGMA journal_mode=WAL";
      int rc = sqlite3_prepare_v3(db_, sql, -1, 0, &stmt, nullptr);
      if (rc != SQLITE_OK) {
        sqlite3_finalize(stmt);
        if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= deadline) fail(rc);
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min(50, 1 << std::min(attempt, 6))));
        continue;
      }
      rc = sqlite3_step(stmt);
      std::string mode;
      if (rc == SQLITE_ROW) mode = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
      sqlite3_finalize(stmt);
      if (rc == SQLITE_ROW) {
        if (mode != "wal" && path != ":memory:") {
          throw StorageError("sqlite: " + path + " cannot use WAL (journal_mode is " + mode + ")");
        }
        return;
      }
      if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= deadline) fail(rc);
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min(50, 1 << std::min(attempt, 6))));
    }
  }

  sqlite3_stmt* prepare(const std::string& sql, unsigned flags) {
    sqlite3_stmt* stmt = nullptr;
    int rc =
        sqlite3_prepare_v3(db_, sql.c_str(), static_cast<int>(sql.size()), flags, &stmt, nullptr);
    if (rc != SQLITE_OK) throw_error(db_, rc, sql);
    return stmt;
  }

  // Waiting for another process's lock. SQLite's own busy_timeout sleeps 1, 2, 5, ... up to
  // 100 ms between tries; against processes that commit many short transactions back to back,
  // such a waiter keeps missing the short gaps between them (one process of three on one file
  // was seen waiting for seconds). This one tries again every 100-300 us until the timeout.
  struct Busy {
    std::chrono::milliseconds timeout{10'000};
    std::chrono::steady_clock::time_point since;
    unsigned seed = 0;
  };
  static int on_busy(void* context, int count) {
    auto* busy = static_cast<Busy*>(context);
    const auto now = std::chrono::steady_clock::now();
    if (count == 0) busy->since = now;
    if (now - busy->since >= busy->timeout) return 0;  // SQLITE_BUSY to the caller
    busy->seed = busy->seed * 1'103'515'245u + 12'345u;
    std::this_thread::sleep_for(std::chrono::microseconds(100 + (busy->seed >> 16) % 200));
    return 1;
  }

  Busy busy_;
  Poco::Data::Session session_;  // owns the sqlite3 handle; destroyed after the cache is cleared
  sqlite3* db_;
  std::unordered_map<std::string, Slot> cache_;
};

struct WriterStats {
  int64_t transactions = 0;  // committed (or failed) batches
  int64_t operations = 0;    // operations run in them
  int64_t max_batch = 0;     // the most operations seen in one transaction
};

// Group commit: one thread, one connection, one transaction per batch of pending operations.
class GroupCommitWriter {
 public:
  GroupCommitWriter(std::unique_ptr<Connection> connection, size_t max_batch)
      : connection_(std::move(connection)),
        max_batch_(std::max<size_t>(max_batch, 1)),
        thread_([this] { loop(); }) {}
  // Runs what is already queued, then stops the thread.
  ~GroupCommitWriter() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  GroupCommitWriter(const GroupCommitWriter&) = delete;
  GroupCommitWriter& operator=(const GroupCommitWriter&) = delete;

  // Runs `op(Connection&)` on the writer thread inside a transaction and returns its result
  // once that transaction has committed; rethrows the operation's exception (its changes are
  // rolled back) or the commit's. [thread-safe] Must not be called from inside an operation.
  template <class Op>
  auto run(Op&& op) -> std::invoke_result_t<Op&, Connection&> {
    using Fn = std::remove_reference_t<Op>;
    using Result = std::invoke_result_t<Op&, Connection&>;
    if (std::this_thread::get_id() == thread_.get_id()) {
      throw std::logic_error("GroupCommitWriter::run called from inside an operation");
    }
    if constexpr (std::is_void_v<Result>) {
      Task task(&op, [](void* ctx, Connection& c) { (*static_cast<Fn*>(ctx))(c); });
      submit(task);
    } else {
      struct Context {
        Fn* op;
        std::optional<Result> result;
      } context{&op, std::nullopt};
      Task task(&context, [](void* ctx, Connection& c) {
        auto* self = static_cast<Context*>(ctx);
        self->result.emplace((*self->op)(c));
      });
      submit(task);
      return std::move(*context.result);
    }
  }

  WriterStats stats() const { return {transactions_.load(), operations_.load(), max_seen_.load()}; }

 private:
  // Lives on the caller's stack. The writer marks it finished and notifies it while holding
  // mutex_, so the caller cannot wake and destroy it before the writer is done with it; the
  // caller then owns the only reference to the exception, if any.
  struct Task {
    Task(void* c, void (*f)(void*, Connection&)) : context(c), call(f) {}
    void* context;
    void (*call)(void*, Connection&);
    std::exception_ptr error;
    bool finished = false;  // guarded by mutex_
    std::condition_variable finished_cv;
  };

  void submit(Task& task) {
    std::unique_lock lock(mutex_);
    if (stopping_) throw StorageError("sqlite: the store is closing");
    queue_.push_back(&task);
    // A busy writer looks at the queue again before it sleeps: waking it costs a syscall.
    if (idle_) wake_.notify_one();
    task.finished_cv.wait(lock, [&task] { return task.finished; });
    lock.unlock();
    if (task.error) std::rethrow_exception(std::move(task.error));
  }

  void acknowledge(std::vector<Task*>& batch) {
    std::lock_guard lock(mutex_);
    for (Task* task : batch) {
      task->finished = true;
      task->finished_cv.notify_one();
    }
  }

  void loop() {
    pthread_setname_np(pthread_self(), "bh-sqlite-write");
    std::vector<Task*> batch;
    batch.reserve(max_batch_);
    while (true) {
      {
        std::unique_lock lock(mutex_);
        idle_ = true;
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        idle_ = false;
        if (queue_.empty()) return;  // stopping, and nothing left
        while (!queue_.empty() && batch.size() < max_batch_) {
          batch.push_back(queue_.front());
          queue_.pop_front();
        }
      }
      run_batch(batch);
      // Acknowledge only now: the batch committed, or every task carries its error.
      acknowledge(batch);
      batch.clear();
    }
  }

  void run_batch(std::vector<Task*>& batch) {
    transactions_.fetch_add(1, std::memory_order_relaxed);
    operations_.fetch_add(static_cast<int64_t>(batch.size()), std::memory_order_relaxed);
    int64_t size = static_cast<int64_t>(batch.size());
    if (size > max_seen_.load(std::memory_order_relaxed)) max_seen_.store(size);
    // A transaction left open by a ROLLBACK that failed (rollback() cannot throw) would fail every
    // later BEGIN ("cannot start a transaction within a transaction") until a restart.
    rollback();
    try {
      // IMMEDIATE takes the write lock up front (waiting up to busy_timeout for another
      // process); a DEFERRED read-then-write transaction would fail with SQLITE_BUSY instead.
      connection_->query("BEGIN IMMEDIATE").run();
    } catch (...) {
      fail_all(batch, std::current_exception());
      return;
    }
    for (Task* task : batch) {
      if (!run_one(*task)) {
        // SQLite rolled the whole transaction back (I/O error, disk full): nothing in this
        // batch is durable, so every operation fails with that error.
        std::exception_ptr error = task->error;
        fail_all(batch, error);
        return;
      }
    }
    try {
      connection_->query("COMMIT").run();
    } catch (...) {
      std::exception_ptr error = std::current_exception();
      rollback();
      fail_all(batch, error);
    }
  }

  // Runs one operation in a savepoint. Returns false when the enclosing transaction is gone.
  bool run_one(Task& task) {
    try {
      connection_->query("SAVEPOINT op").run();
      task.call(task.context, *connection_);
      connection_->query("RELEASE op").run();
      return true;
    } catch (...) {
      task.error = std::current_exception();
    }
    if (connection_->autocommit()) return false;
    try {
      connection_->query("ROLLBACK TO op").run();
      connection_->query("RELEASE op").run();
      return true;
    } catch (...) {
      task.error = std::current_exception();
      rollback();
      return false;
    }
  }

  void rollback() noexcept {
    if (connection_->autocommit()) return;
    try {
      connection_->exec("ROLLBACK");
    } catch (...) {  // nothing more to undo
    }
  }

  static void fail_all(std::vector<Task*>& batch, const std::exception_ptr& error) {
    for (Task* task : batch) {
      if (!task->error) task->error = error;
    }
  }

  std::unique_ptr<Connection> connection_;
  const size_t max_batch_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task*> queue_;
  bool idle_ = false;  // the writer waits for work (guarded by mutex_)
  bool stopping_ = false;
  std::atomic<int64_t> transactions_{0};
  std::atomic<int64_t> operations_{0};
  std::atomic<int64_t> max_seen_{0};
  std::thread thread_;  // last: starts once everything above exists
};

// Connections for reads, opened on demand up to `max_open`, each used by one thread at a time.
// A read is one statement (one snapshot) and sees every transaction committed before it began.
class ReaderPool {
 public:
  ReaderPool(std::string path, ConnectionOptions options, size_t max_open)
      : path_(std::move(path)), options_(options), max_open_(std::max<size_t>(max_open, 1)) {
    options_.read_only = true;
  }

  template <class Op>
  auto run(Op&& op) -> std::invoke_result_t<Op&, Connection&> {
    Lease lease(*this);
    return op(*lease.connection);
  }

 private:
  struct Lease {
    explicit Lease(ReaderPool& p) : pool(p), connection(p.acquire()) {}
    ~Lease() { pool.release(std::move(connection)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ReaderPool& pool;
    std::unique_ptr<Connection> connection;
  };

  std::unique_ptr<Connection> acquire() {
    std::unique_lock lock(mutex_);
    available_.wait(lock, [this] { return !idle_.empty() || open_ < max_open_; });
    if (!idle_.empty()) {
      auto connection = std::move(idle_.back());
      idle_.pop_back();
      return connection;
    }
    ++open_;
    lock.unlock();
    try {
      return std::make_unique<Connection>(path_, options_);
    } catch (...) {
      std::lock_guard relock(mutex_);
      --open_;
      available_.notify_one();
      throw;
    }
  }

  void release(std::unique_ptr<Connection> connection) {
    {
      std::lock_guard lock(mutex_);
      idle_.push_back(std::move(connection));
    }
    available_.notify_one();
  }

  const std::string path_;
  ConnectionOptions options_;
  const size_t max_open_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t open_ = 0;
};

}  // namespace backhaul::jobs::sqlite
