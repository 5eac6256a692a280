// The MySQL/MariaDB connection layer of the job store (private to core/jobs): a parsed connection
// string, a connection over the MariaDB C API (text protocol, multi-statements; prepared
// statements where values are bulky: enqueue's INSERT), a bounded pool, and transactions with the
// retry rules of DESIGN.md ("The queue").
//
// Why the C API and not Poco::Data::MySQL (env-recipe.md section 4): Poco 1.11 binds every result
// column to a buffer of the column's declared size, so reading one job row (three MEDIUMTEXT
// columns) allocates and clears 48 MiB -- measured on this machine at ~330 ms per SELECT, against
// ~0.3 ms with the columns CAST to short types -- and it prepares every statement (an extra round
// trip and server command each). The text protocol returns values at their real size, runs
// several statements per round trip (a whole transition ends with its COMMIT in one trip), and
// gives mysql_errno() directly for the retry decisions below. The connection string keeps Poco's
// format, so configurations and the test fixture work unchanged. Prepared statements are used
// only where the values are most of the statement: the server then parses no literal (a text
// INSERT of 1000 jobs spent about half its server time in the parser), and a session keeps each
// of its few texts prepared.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/common/errors.h"

typedef struct st_mysql MYSQL;
typedef struct st_mysql_stmt MYSQL_STMT;

namespace backhaul::jobs::mysql {

// "host=127.0.0.1;port=3306;db=backhaul;user=u;password=p;character-set=utf8mb4" (Poco's keys).
// Also accepted: socket=PATH (Unix socket), connect-timeout=S, read-timeout=S,
// lock-wait-timeout=S (how long a statement waits for a row lock; 0 = the server's),
// idle-transaction-timeout=S (MariaDB: how long the server keeps a session that went quiet inside
// a transaction; 0 = the server's),
// migrate-wait=S (how long opening the store waits for another host's migration). Poco-only keys
// (auto-reconnect, secure-auth, reset, fail-readonly) are accepted and ignored: this layer
// reconnects by itself. Any other key is a ConfigError (Poco would silently ignore a typo).
// Blanks around keys and values are dropped, as Poco drops them; a port is 1..65535.
// db may be empty (no default database); the store requires one.
struct Config {
  std::string host = "127.0.0.1";
  unsigned port = 3306;
  std::string socket;
  std::string db;
  std::string user;
  std::string password;
  bool compress = false;
  unsigned connect_timeout_s = 10;
  // Longer than innodb_lock_wait_timeout (default 50 s): a statement waiting for a lock is not a
  // dead server. 0 = none (the session of migrate(), whose DDL may run for as long as it needs).
  unsigned read_timeout_s = 120;
  // The sessions' innodb_lock_wait_timeout, in seconds; 0 = the server's (50 s by default).
  // Either way at most read_timeout_s - 1 (see Connection).
  unsigned lock_wait_timeout_s = 0;
  // MariaDB ends a session that stays this long inside a transaction without a statement, and
  // frees its locks (MySQL has no such setting, and ignores it). A host that lost power or its
  // network mid-transaction leaves its session open on the server, holding its row locks, until
  // TCP keepalive or wait_timeout notice (2 to 8 hours): the kind's cap row among them, every
  // host's claims of that kind would wait on it. The store's transactions never wait on their
  // client between statements for long. 0 = the server's (none by default).
  unsigned idle_transaction_timeout_s = 60;
  // How long migrate() waits for the migration lock while another session holds it (another
  // host migrating: an ALTER of a large jobs table may take minutes). 0 = not at all.
  unsigned migrate_wait_s = 600;
};
Config parse_config(const std::string& connection_string);
// The connection string with its db= replaced (or added).
std::string with_database(const std::string& connection_string, const std::string& db);

// A server or client error with its errno. `lost` means the connection is unusable.
// Transient (StorageError::transient()): a lost connection, a read-only server, a lock conflict,
// a statement interrupted, a full disk, a failed COMMIT.
class Error : public StorageError {
 public:
  Error(const std::string& message, unsigned code, bool lost)
      : StorageError(
            message,
            lost || is_read_only(code) || is_disk_full(code, message) || is_commit_error(code),
            is_lock_conflict(code), is_interrupted(code)),
        code_(code),
        lost_(lost) {}
  unsigned code() const noexcept { return code_; }
  bool connection_lost() const noexcept { return lost_; }
  // KILL QUERY (by an operator, or a tool such as pt-kill) ended the statement (1317
  // ER_QUERY_INTERRUPTED). The session stays usable; the statement did nothing, and the store
  // rolls its transaction back -- unless the statement was the COMMIT (Tx::send). Not re-run:
  // someone meant it to stop.
  static bool is_interrupted(unsigned code) noexcept { return code == 1317; }
  // The disk or a table is full: 1114 ER_RECORD_FILE_FULL (InnoDB cannot extend a tablespace),
  // 1021 ER_DISK_FULL, or an OS error 28 (ENOSPC) that the server passes on: 1030 ER_GET_ERRNO,
  // 1026 ER_ERROR_ON_WRITE, 3 EE_WRITE (reports_no_space). The statement failed and the session
  // stays usable; the call may succeed once space is freed, as SQLite's SQLITE_FULL.
  static bool is_disk_full(unsigned code, std::string_view message) noexcept {
    if (code == 1114 || code == 1021) return true;
    return (code == 1030 || code == 1026 || code == 3) && reports_no_space(message);
  }
  bool disk_full() const noexcept { return is_disk_full(code_, what()); }
  // The storage engine or the binary log failed the COMMIT (1180 ER_ERROR_DURING_COMMIT, "Got
  // error N during COMMIT"): a full disk or a failed write while committing. Transient; what it
  // left applied depends on where it failed, so it is an unknown outcome (Tx::send).
  static bool is_commit_error(unsigned code) noexcept { return code == 1180; }
  // Met by the COMMIT itself, whether this error leaves the transaction's fate unknown: a lost
  // connection; a KILL QUERY, which a server may look for once the COMMIT has run (MySQL 8 does)
  // and answer for a COMMIT that committed; a full disk or a failed write while committing (the
  // binary log, the redo log), whose effect depends on the server and its settings.
  bool leaves_commit_unknown() const noexcept {
    return lost_ || is_interrupted(code_) || disk_full() || is_commit_error(code_);
  }
  // Whether the text of an error that carries an OS errno gives errno 28: the client has no
  // other trace of it. The number follows "Got error " (1030) or "errno: ", "Errcode: ",
  // "OS errno " (the write errors), and is followed by its description: MariaDB writes
  // `28 "No space left on device"`, MySQL 8 `28 - 'No space left on device'` or `28 - No ...`.
  static bool reports_no_space(std::string_view message) noexcept;
  // The server refused a write because it is read-only (1290 ER_OPTION_PREVENTS_STATEMENT under
  // --read-only, 1836 ER_READ_ONLY_MODE): a primary being switched over. The statement did
  // nothing; a new session (through a proxy or a moved address) may reach the new primary.
  static bool is_read_only(unsigned code) noexcept { return code == 1290 || code == 1836; }
  // Worth running again on a new session: this one died, or its server takes no writes.
  bool needs_new_session() const noexcept { return lost_ || is_read_only(code_); }
  // Deadlock (1213) or lock wait (is_lock_wait), StorageError::lock_conflict(): the transaction
  // is rolled back and can be re-run.
  static bool is_lock_conflict(unsigned code) noexcept {
    return code == 1213 || is_lock_wait(code);
  }
  // A statement that waited too long: a lock wait timeout (1205), or a statement interrupted by
  // the server's or the account's time limit (1969: MariaDB max_statement_time, 3024: MySQL
  // max_execution_time), which ends a wait for another transaction's rows before the lock wait
  // timeout does. Re-run once (RetryLimits::lock_waits): each run waited that long.
  static bool is_lock_wait(unsigned code) noexcept {
    return code == 1205 || code == 1969 || code == 3024;
  }
  bool duplicate_key() const noexcept { return code_ == 1062; }

 private:
  unsigned code_;
  bool lost_;
};

// One cell: nullopt is SQL NULL.
using Cell = std::optional<std::string>;
using Row = std::vector<Cell>;

// The outcome of one statement: rows for a SELECT, counts for the rest.
struct Result {
  std::vector<Row> rows;
  uint64_t affected = 0;  // rows changed (not merely matched)
  uint64_t insert_id = 0;
};

int64_t to_i64(const Cell& cell);  // NULL -> 0
int to_int(const Cell& cell);
double to_double(const Cell& cell);
std::string to_str(const Cell& cell);  // NULL -> ""

// SQL text building. quote() escapes for a utf8mb4 connection whose sql_mode does not contain
// NO_BACKSLASH_ESCAPES (Connection sets both), which makes backslash escaping complete: no byte of
// a utf8mb4 multibyte sequence is ASCII, so a value cannot end its literal early.
void append_quoted(std::string& out, std::string_view value);
std::string quote(std::string_view value);
inline std::string quote(const std::string& value) { return quote(std::string_view(value)); }
inline std::string quote(const char* value) { return quote(std::string_view(value)); }
std::string quote(const std::optional<std::string>& value);  // NULL when absent

// Builds statement text with literals: strings and optionals are quoted, integers printed.
class Sql {
 public:
  Sql() = default;
  explicit Sql(std::string_view raw) : text_(raw) {}
  Sql& raw(std::string_view text) {
    text_ += text;
    return *this;
  }
  Sql& operator<<(std::string_view text) { return raw(text); }
  Sql& operator<<(const char* text) { return raw(text); }
  Sql& str(std::string_view value) {
    append_quoted(text_, value);
    return *this;
  }
  Sql& opt(const std::optional<std::string>& value);
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                          !std::is_same_v<T, char>,
                                      int> = 0>
  Sql& operator<<(T value) {
    text_ += std::to_string(value);
    return *this;
  }
  Sql& real(double value);
  const std::string& text() const { return text_; }
  operator std::string() const { return text_; }  // NOLINT: a builder ends as its text

 private:
  std::string text_;
};

// A value for one '?' of a prepared statement: NULL, an integer, or bytes. Bytes travel as they
// are (the binary protocol): nothing is escaped, and the server parses no literal. A Param views
// its bytes; they must outlive the call it is passed to.
struct Param {
  enum class Kind { kNull, kInt, kBytes };
  Kind kind = Kind::kNull;
  int64_t number = 0;
  std::string_view bytes;

  static Param null() { return {}; }
  static Param of(int64_t value) { return {Kind::kInt, value, {}}; }
  static Param of(std::string_view value) { return {Kind::kBytes, 0, value}; }
  static Param of(const std::string& value) { return of(std::string_view(value)); }
  static Param of(const std::optional<std::string>& value) { return value ? of(*value) : null(); }
};

// One session to the server. Sessions run at READ COMMITTED with a strict sql_mode and
// autocommit on; transactions are explicit. Not thread-safe: one user at a time (the pool).
class Connection {
 public:
  explicit Connection(const Config& config);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs one or more statements separated by ';' in one round trip and returns one Result per
  // statement. On an error, statements after the failing one are not run; `*completed` (when
  // given) receives the number of statements that had succeeded. Throws Error.
  std::vector<Result> run(std::string_view sql, size_t* completed = nullptr);
  Result one(std::string_view sql);
  Result one(const Sql& sql) { return one(std::string_view(sql.text())); }
  // Runs one statement with a '?' per param (no result set: INSERT, UPDATE, DELETE) as a
  // server-side prepared statement. It is prepared at its first use on this session and kept,
  // keyed by its text: callers use a small set of texts. Throws Error.
  Result execute(const std::string& sql, const std::vector<Param>& params);

  bool broken() const noexcept { return broken_; }
  void mark_broken() noexcept { broken_ = true; }
  unsigned long server_version() const;

 private:
  [[noreturn]] void fail(const char* what);
  [[noreturn]] void fail(MYSQL_STMT* statement, const char* what);
  // Throws Error 1153 (not lost) when a packet of `bytes` would exceed max_packet_.
  void check_packet(uint64_t bytes) const;

  MYSQL* handle_ = nullptr;
  bool broken_ = false;
  uint64_t max_packet_ = UINT64_MAX;  // the server's max_allowed_packet, read at connect
  std::map<std::string, MYSQL_STMT*, std::less<>> statements_;  // prepared, by text
};

// A bounded pool: at most `size` connections, created on demand; a broken one is dropped when
// it comes back. acquire() blocks while all are in use.
class Pool {
 public:
  Pool(Config config, size_t size);
  ~Pool();

  class Lease {
   public:
    Lease(Pool* pool, std::unique_ptr<Connection> connection)
        : pool_(pool), connection_(std::move(connection)) {}
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (connection_) pool_->give_back(std::move(connection_));
    }
    Connection& operator*() const { return *connection_; }
    Connection* operator->() const { return connection_.get(); }

   private:
    Pool* pool_;
    std::unique_ptr<Connection> connection_;
  };

  Lease acquire();
  const Config& config() const { return config_; }

 private:
  void give_back(std::unique_ptr<Connection> connection);

  Config config_;
  size_t size_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t open_ = 0;  // idle + leased
};

// Thrown by transaction bodies to re-run the whole transaction (e.g. a unique-key race that a
// fresh read resolves). Counted like a deadlock.
class RetryTransaction : public StorageError {
 public:
  using StorageError::StorageError;
};

// A transaction on one connection. The first statement sent carries START TRANSACTION; commit()
// sends its statements and COMMIT in one round trip. Destroying an unfinished Tx rolls back.
class Tx {
 public:
  explicit Tx(Connection& connection) : connection_(connection) {}
  ~Tx();
  Tx(const Tx&) = delete;
  Tx& operator=(const Tx&) = delete;

  std::vector<Result> run(const std::vector<std::string>& statements);
  Result one(const std::string& statement);
  Result execute(const std::string& sql, const std::vector<Param>& params);  // prepared
  // Runs `statements` and COMMIT in one round trip. A lost connection in this trip, or a KILL
  // QUERY or full disk met by the COMMIT itself, throws Error with commit_unknown() set: the
  // caller cannot know whether the commit happened.
  std::vector<Result> commit(const std::vector<std::string>& statements = {});
  void rollback() noexcept;
  bool finished() const noexcept { return finished_; }
  bool commit_unknown() const noexcept { return commit_unknown_; }

 private:
  std::vector<Result> send(const std::vector<std::string>& statements, bool commit);
  template <class Call>
  auto guarded(Call&& call) -> decltype(call());

  Connection& connection_;
  bool begun_ = false;
  bool finished_ = false;
  bool commit_unknown_ = false;
};

// Thrown by transact() when the connection was lost while the COMMIT was in flight, or the
// COMMIT was interrupted or met a full disk (Tx::commit): the transaction may have applied. Never
// re-run by transact(). `interrupted`: by KILL QUERY, so it says nothing of the server's health
// (StorageError::outage).
class CommitUnknown : public StorageError {
 public:
  explicit CommitUnknown(const std::string& message, bool interrupted = false)
      : StorageError(message, true, false, interrupted) {}
};

// Retry rules shared by the store's operations.
struct RetryLimits {
  int lock_conflicts = 25;  // deadlocks / RetryTransaction: found at once, cheap to re-run
  // Lock wait timeouts: each run waited innodb_lock_wait_timeout (50 s by default) for a row
  // held all that time; re-run once, not 25 times (about 20 minutes of waiting). Heartbeats: not
  // re-run (the scheduler beats again half an interval later).
  int lock_waits = 2;
  int connection = 5;  // lost or refused connections (server restart, "gone away")
};

// Sleeps before retry number `attempt` (1-based): exponential from `base` with full jitter.
void backoff(int attempt, std::chrono::milliseconds base, std::chrono::milliseconds cap);

// Runs `body(Tx&)` in a transaction on a pooled connection and commits it (unless the body
// committed itself). Deadlocks, lock wait timeouts and RetryTransaction re-run the body;
// a connection lost before the commit was sent re-runs it on a new connection. A connection lost
// during the commit is reported (CommitUnknown), never re-run: the change may have been applied.
// Other errors, transient (an interrupted statement, a full disk) or not, roll back and propagate,
// as do exceptions of the body (LeaseLost, InvalidTransition, ...).
template <class Body>
auto transact(Pool& pool, const char* what, Body&& body, RetryLimits limits = {})
    -> std::invoke_result_t<Body&, Tx&> {
  using R = std::invoke_result_t<Body&, Tx&>;
  int conflicts = 0;
  int waits = 0;
  int lost = 0;
  while (true) {
    try {
      Pool::Lease connection = pool.acquire();
      Tx tx(*connection);
      try {
        if constexpr (std::is_void_v<R>) {
          body(tx);
          if (!tx.finished()) tx.commit();
          return;
        } else {
          R result = body(tx);
          if (!tx.finished()) tx.commit();
          return result;
        }
      } catch (const Error& e) {
        if (tx.commit_unknown()) {
          throw CommitUnknown(
              std::string("mysql: ") + what +
                  (e.connection_lost() ? ": connection lost during commit" : ": commit failed") +
                  ", outcome unknown: " + e.what(),
              e.interrupted());
        }
        throw;
      }
    } catch (const Error& e) {
      const bool timed_out = Error::is_lock_wait(e.code());
      if (timed_out && ++waits < limits.lock_waits) {
        backoff(waits, std::chrono::milliseconds(2), std::chrono::milliseconds(200));
        continue;
      }
      if (!timed_out && e.lock_conflict() && ++conflicts < limits.lock_conflicts) {
        backoff(conflicts, std::chrono::milliseconds(2), std::chrono::milliseconds(200));
        continue;
      }
      if (e.needs_new_session() && ++lost < limits.connection) {
        backoff(lost, std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
        continue;
      }
      throw StorageError(std::string("mysql: ") + what + ": " + e.what(), e.transient(),
                         e.lock_conflict(), e.interrupted());
    } catch (const RetryTransaction& e) {
      if (++conflicts < limits.lock_conflicts) {
        backoff(conflicts, std::chrono::milliseconds(2), std::chrono::milliseconds(200));
        continue;
      }
      throw StorageError(std::string("mysql: ") + what + ": " + e.what(), true);
    }
  }
}

}  // namespace backhaul::jobs::mysql
