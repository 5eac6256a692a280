// The MySQL/MariaDB backend of the job queue (SPEC D2, D3). The contract is job_store.h; the schema
// is schemas/sql/mysql/; the connection layer (mysql_db.h) is defined in the first half of this
// file.
//
// Concurrency model (DESIGN.md "The queue"):
// * Every session runs at READ COMMITTED. Each method is one transaction that first locks the rows
//   it changes (SELECT ... FOR UPDATE), checks them, then sends its writes together with COMMIT in
//   one round trip. Deadlocks (1213) and lock wait timeouts (1205) re-run the transaction; a lost
//   connection re-runs it on a new one unless the COMMIT itself was in flight.
// * Claims take queued rows with FOR UPDATE SKIP LOCKED, so concurrent claimers on any number of
//   hosts never wait for each other and never take the same job.
// * Caps (SPEC D7): a kind with a cap has a row in job_caps that every claim of that kind locks
//   (FOR UPDATE, in kind order, so claimers never deadlock on them). While it is held no other
//   claim of the kind can commit, so COUNTing the kind's running rows is exact (under SKIP LOCKED
//   alone it would not be: a concurrent claim's rows are invisible until it commits). Leaving
//   running takes no cap lock. Kinds without caps take no cap lock; every claim holds the row of
//   claim_gate in share mode, which set_caps takes exclusively, so that a cap set while a claim
//   of an uncapped kind is in flight waits for it (schema 0005).
// * running_counts / running_totals keep the running jobs per (kind, key) and per kind and their
//   high-water marks (max_running_seen): +n in the claim, -1 in every exit from running
//   (end_attempt). Their statements come last in every transaction, in one sorted order.
// * Fencing: every transition of a running job locks its row and checks status = 'running' and
//   the lease token; the attempt row is found by the same token.
// * Fan-in: a child counted in its parent (counted_in_parent = 1) decrements the parent's
//   pending_children in the transaction that makes the child terminal and clears its flag in the
//   same statement set, so the decrement happens exactly once; a waiting parent whose count
//   reaches 0 becomes queued there too.
// * Dead letters: one per job (unique job_id), upserted when the job dies, resolved when a
//   retried job succeeds, ignored when it is cancelled.
// * Dedupe (SPEC D10): jobs.active_dedupe_key equals dedupe_key while the job is active and is
//   NULL once it is terminal; a unique index on (kind, active_dedupe_key) does the rest.
// * Group commit: claim() and complete(), the hot paths, merge concurrent calls into one
//   transaction with set-based statements (GroupCommit); each call still returns only after the
//   transaction carrying it committed.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include <Poco/DigestEngine.h>
#include <Poco/SHA2Engine.h>

#include "core/common/fnv1a.h"
#include "core/common/unique_fd.h"
#include "core/common/utf8.h"
#include "core/jobs/job_store.h"
#include "core/jobs/migrations.h"
#include "core/jobs/mysql_db.h"
#include "core/jobs/token_bucket.h"
#include <mysql/mysql.h>

namespace backhaul::jobs {
namespace mysql {

// --- configuration -------------------------------------------------------------------------

namespace {

// `shown`: the value as an error may show it (quoted, or not at all when it may be a password's).
bool parse_bool(const std::string& key, const std::string& value, const std::string& shown) {
  if (value == "true" || value == "1" || value == "yes" || value == "on") return true;
  if (value == "false" || value == "0" || value == "no" || value == "off") return false;
  throw ConfigError("mysql connection string: " + key + " must be true or false, not " + shown);
}

unsigned parse_unsigned(const std::string& key, const std::string& value,
                        const std::string& shown) {
  unsigned out = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || end != value.data() + value.size()) {
    throw ConfigError("mysql connection string: " + key + " must be a number, not " + shown);
  }
  return out;
}

}  // namespace

namespace {
// Calls fn(item) for each ';'-separated item of a connection string that is not blank.
template <class Fn>
void for_each_item(const std::string& connection_string, Fn&& fn) {
  size_t pos = 0;
  while (pos <= connection_string.size()) {
    size_t end = connection_string.find(';', pos);
    if (end == std::string::npos) end = connection_string.size();
    std::string item = connection_string.substr(pos, end - pos);
    pos = end + 1;
    if (item.find_first_not_of(" \t") != std::string::npos) fn(std::move(item));
  }
}
}  // namespace

Config parse_config(const std::string& connection_string) {
  Config config;
  // An item after a password may be the rest of a password holding ';': such an item is not
  // quoted in an error, which would put part of the password in the log.
  bool after_password = false;
  int number = 0;
  for_each_item(connection_string, [&](std::string item) {
    ++number;
    const bool may_be_secret = std::exchange(after_password, false);
    auto shown = [&](const std::string& text) {
      return may_be_secret ? std::string("the item after password= (a password cannot hold ';')")
                           : "'" + text + "'";
    };
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      // Not quoted: what is not key=value may be anything, a URL with its password, or a bare
      // password.
      throw ConfigError("mysql connection string: " +
                        (may_be_secret ? shown(item)
                                       : "item " + std::to_string(number) +
                                             " (not shown: it may hold a password)") +
                        " is not key=value; give host=...;port=...;user=...;password=...;db=... "
                        "(a URL is not taken)");
    }
    // Blanks around keys and values are dropped, as Poco's connector drops them.
    auto strip = [](std::string text) {
      const char* blanks = " \t\r\n\v\f";
      text.erase(0, text.find_first_not_of(blanks));
      text.erase(text.find_last_not_of(blanks) + 1);
      return text;
    };
    std::string key = strip(item.substr(0, eq));
    std::string value = strip(item.substr(eq + 1));
    const std::string value_shown =
        may_be_secret ? std::string(
                            "its value (not shown: the item after password= may be the "
                            "rest of a password holding ';', which a password cannot hold)")
                      : "'" + value + "'";
    if (key == "host") {
      config.host = value;
    } else if (key == "port") {
      // The client library takes the port modulo 65536, and 0 as its default port (3306).
      config.port = parse_unsigned(key, value, value_shown);
      if (config.port < 1 || config.port > 65535) {
        throw ConfigError("mysql connection string: port must be between 1 and 65535, not " +
                          value_shown);
      }
    } else if (key == "socket") {
      config.socket = value;
    } else if (key == "db") {
      config.db = value;
    } else if (key == "user") {
      config.user = value;
    } else if (key == "password") {
      config.password = value;
      after_password = true;
    } else if (key == "compress") {
      config.compress = parse_bool(key, value, value_shown);
    } else if (key == "connect-timeout") {
      config.connect_timeout_s = parse_unsigned(key, value, value_shown);
    } else if (key == "read-timeout") {
      config.read_timeout_s = parse_unsigned(key, value, value_shown);
    } else if (key == "lock-wait-timeout") {
      config.lock_wait_timeout_s = parse_unsigned(key, value, value_shown);
    } else if (key == "idle-transaction-timeout") {
      config.idle_transaction_timeout_s = parse_unsigned(key, value, value_shown);
    } else if (key == "migrate-wait") {
      config.migrate_wait_s = parse_unsigned(key, value, value_shown);
    } else if (key == "character-set") {
      // The store needs utf8mb4 (4-byte UTF-8) and always uses it.
      if (value != "utf8mb4") {
        throw ConfigError("mysql connection string: character-set must be utf8mb4, not " +
                          value_shown);
      }
    } else if (key == "auto-reconnect" || key == "secure-auth" || key == "reset" ||
               key == "fail-readonly") {
      // Poco options with no meaning here: reconnecting is this layer's job.
    } else {
      // A key quoted is a word: anything else (a URL with a query, "mysql://u:pw@h/db?x") may
      // hold a password.
      const bool word = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_';
      });
      throw ConfigError(
          "mysql connection string: unknown key " +
          (word ? shown(key)
                : "in item " + std::to_string(number) + " (not shown: it may hold a password)"));
    }
  });
  return config;
}

std::string with_database(const std::string& connection_string, const std::string& db) {
  std::string out;
  for_each_item(connection_string, [&](const std::string& item) {
    if (item.rfind("db=", 0) != 0) out += item + ";";
  });
  return out + "db=" + db;
}

// --- values --------------------------------------------------------------------------------

int64_t to_i64(const Cell& cell) {
  if (!cell) return 0;
  int64_t out = 0;
  auto [end, ec] = std::from_chars(cell->data(), cell->data() + cell->size(), out);
  if (ec != std::errc() || end != cell->data() + cell->size()) {
    throw StorageError("mysql: expected an integer, got '" + *cell + "'");
  }
  return out;
}

int to_int(const Cell& cell) { return static_cast<int>(to_i64(cell)); }

// from_chars and to_chars (Sql::real) read and write the C locale's form whatever the process's
// locale (a plugin may call setlocale()): strtod and printf would read "3999.5" as 3999 and
// write 3999,5 under de_DE. The whole cell must be the number.
double to_double(const Cell& cell) {
  if (!cell) return 0;
  double out = 0;
  auto [end, ec] = std::from_chars(cell->data(), cell->data() + cell->size(), out);
  if (ec != std::errc() || end != cell->data() + cell->size()) {
    throw StorageError("mysql: expected a number, got '" + *cell + "'");
  }
  return out;
}

std::string to_str(const Cell& cell) { return cell ? *cell : std::string(); }

void append_quoted(std::string& out, std::string_view value) {
  out.reserve(out.size() + value.size() + 2);
  out += '\'';
  for (char c : value) {
    switch (c) {
      case '\0':
        out += "\\0";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\'':
        out += "\\'";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\x1a':
        out += "\\Z";
        break;
      default:
        out += c;
    }
  }
  out += '\'';
}

std::string quote(std::string_view value) {
  std::string out;
  append_quoted(out, value);
  return out;
}

std::string quote(const std::optional<std::string>& value) {
  return value ? quote(*value) : std::string("NULL");
}

Sql& Sql::opt(const std::optional<std::string>& value) {
  if (value) {
    append_quoted(text_, *value);
  } else {
    text_ += "NULL";
  }
  return *this;
}

Sql& Sql::real(double value) {
  char buffer[40];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);  // round-trips
  if (ec != std::errc()) throw StorageError("mysql: a number that cannot be written");
  text_.append(buffer, end);
  return *this;
}

// --- connection ----------------------------------------------------------------------------

namespace {

// Errors after which the session is gone (or never was): the server went away, the network
// failed, the connection was killed, or the server is shutting down or full -- for everyone, or
// for this account (its connections held by another process of it, or by sessions a restart left
// behind, until they end; an hourly limit, until the hour is over).
bool is_connection_error(unsigned code) {
  switch (code) {
    case 1040:  // ER_CON_COUNT_ERROR: too many connections
    case 1203:  // ER_TOO_MANY_USER_CONNECTIONS: the server's max_user_connections
    case 1226:  // ER_USER_LIMIT_REACHED: the account's MAX_USER_CONNECTIONS (or an hourly limit)
    case 1053:  // ER_SERVER_SHUTDOWN
    case 1927:  // ER_CONNECTION_KILLED
    case 2002:  // CR_CONNECTION_ERROR
    case 2003:  // CR_CONN_HOST_ERROR
    case 2006:  // CR_SERVER_GONE_ERROR
    case 2013:  // CR_SERVER_LOST
    case 2014:  // CR_COMMANDS_OUT_OF_SYNC (the session state is unknown)
    case 2055:  // CR_SERVER_LOST_EXTENDED
    case 4031:  // MySQL 8: disconnected by the server for inactivity
      return true;
    default:
      return false;
  }
}

std::once_flag library_once;

}  // namespace

bool Error::reports_no_space(std::string_view message) noexcept {
  for (std::string_view lead : {"Got error ", "errno: ", "Errcode: ", "OS errno "}) {
    for (size_t at = message.find(lead); at != std::string_view::npos;
         at = message.find(lead, at + 1)) {
      const std::string_view rest = message.substr(at + lead.size());
      if (rest.substr(0, 2) == "28" && (rest.size() == 2 || rest[2] < '0' || rest[2] > '9')) {
        return true;
      }
    }
  }
  return false;
}

Connection::Connection(const Config& config) {
  std::call_once(library_once, [] { mysql_library_init(0, nullptr, nullptr); });
  handle_ = mysql_init(nullptr);
  if (!handle_) throw Error("mysql_init failed (out of memory)", 0, true);
  mysql_options(handle_, MYSQL_SET_CHARSET_NAME, "utf8mb4");
  unsigned connect_timeout = config.connect_timeout_s;
  unsigned read_timeout = config.read_timeout_s;
  mysql_options(handle_, MYSQL_OPT_CONNECT_TIMEOUT, &connect_timeout);
  mysql_options(handle_, MYSQL_OPT_READ_TIMEOUT, &read_timeout);
  mysql_options(handle_, MYSQL_OPT_WRITE_TIMEOUT, &read_timeout);
  my_bool reconnect = 0;  // a silent reconnect would lose the session settings below
  mysql_options(handle_, MYSQL_OPT_RECONNECT, &reconnect);
  unsigned long max_packet = 1UL << 30;
  mysql_options(handle_, MYSQL_OPT_MAX_ALLOWED_PACKET, &max_packet);
  if (config.compress) mysql_options(handle_, MYSQL_OPT_COMPRESS, nullptr);
  const char* host = config.socket.empty() ? config.host.c_str() : "localhost";
  const char* socket = config.socket.empty() ? nullptr : config.socket.c_str();
  if (!mysql_real_connect(handle_, host, config.user.c_str(), config.password.c_str(),
                          config.db.empty() ? nullptr : config.db.c_str(), config.port, socket,
                          CLIENT_MULTI_STATEMENTS | CLIENT_MULTI_RESULTS)) {
    unsigned code = mysql_errno(handle_);
    std::string message =
        "connecting to " +
        (socket ? config.socket : config.host + ":" + std::to_string(config.port)) + ": " +
        mysql_error(handle_) + " (errno " + std::to_string(code) + ")";
    mysql_close(handle_);
    handle_ = nullptr;
    // Refused or unreachable servers may come back; bad credentials or databases will not.
    throw Error(message, code, is_connection_error(code) || code >= 2000);
  }
  // A process a plugin starts must not hold the session open: the server would keep a
  // transaction (and its locks) that this side gave up on by closing the connection.
  set_close_on_exec(mysql_get_socket(handle_));
  // READ COMMITTED: REPEATABLE READ (the default) would make counts read after taking a lock
  // stale (the snapshot is older than the lock) and allows lost updates. Strict mode: a value
  // that does not fit is an error, never silently truncated. No NO_BACKSLASH_ESCAPES (quote()).
  // A lock wait ends at least a second before the read timeout: else a statement waiting for a
  // row would be taken for a lost connection, run again on another session while it still waited
  // on this one, and, with its COMMIT, might apply after the caller had found it not applied.
  try {
    std::string setup =
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; "
        "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
        "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', SESSION autocommit = 1";
    std::string lock_wait = config.lock_wait_timeout_s > 0
                                ? std::to_string(config.lock_wait_timeout_s)
                                : std::string("@@GLOBAL.innodb_lock_wait_timeout");
    if (config.read_timeout_s > 0) {
      lock_wait = "LEAST(" + lock_wait + ", " +
                  std::to_string(std::max(config.read_timeout_s, 2u) - 1) + ")";
    }
    if (config.lock_wait_timeout_s > 0 || config.read_timeout_s > 0) {
      setup += ", SESSION innodb_lock_wait_timeout = " + lock_wait;
    }
    if (config.idle_transaction_timeout_s > 0) {  // MariaDB 10.3 and later run the comment
      setup += " /*M!100300 , SESSION idle_transaction_timeout = " +
               std::to_string(config.idle_transaction_timeout_s) + " */";
    }
    setup += "; SELECT @@max_allowed_packet";
    max_packet_ = static_cast<uint64_t>(to_i64(run(setup).back().rows.at(0).at(0)));
  } catch (...) {
    mysql_close(handle_);
    handle_ = nullptr;
    throw;
  }
}

Connection::~Connection() {
  for (auto& [sql, statement] : statements_) mysql_stmt_close(statement);
  if (handle_) mysql_close(handle_);
}

unsigned long Connection::server_version() const { return mysql_get_server_version(handle_); }

void Connection::fail(const char* what) {
  unsigned code = mysql_errno(handle_);
  bool lost = is_connection_error(code);
  if (lost || Error::is_read_only(code)) broken_ = true;  // a new session, not this one
  throw Error(
      std::string(what) + ": " + mysql_error(handle_) + " (errno " + std::to_string(code) + ")",
      code, lost);
}

void Connection::fail(MYSQL_STMT* statement, const char* what) {
  unsigned code = mysql_stmt_errno(statement);
  bool lost = is_connection_error(code);
  if (lost || Error::is_read_only(code)) broken_ = true;  // a new session, not this one
  throw Error(std::string(what) + ": " + mysql_stmt_error(statement) + " (errno " +
                  std::to_string(code) + ")",
              code, lost);
}

// The server answers a packet larger than its max_allowed_packet by closing the connection (after
// error 1153), mostly before the client has sent it all, which the client then reports as lost
// (2006): a statement that can never pass (a result, checkpoint or payload too large for the
// server) would be taken for a lost connection -- transient, sent again on new sessions, and in a
// COMMIT's round trip an unknown outcome. It is refused here instead, unsent, with the server's
// code for it (1153, not transient), and the session is kept.
void Connection::check_packet(uint64_t bytes) const {
  if (bytes <= max_packet_) return;
  throw Error("a statement of " + std::to_string(bytes) +
                  " bytes exceeds the server's max_allowed_packet (" + std::to_string(max_packet_) +
                  " bytes)",
              1153, false);
}

Result Connection::execute(const std::string& sql, const std::vector<Param>& params) {
  if (broken_) throw Error("connection is broken", 2006, true);
  // COM_STMT_EXECUTE: a 10-byte head, then per value at most 12 bytes (type, null bit, length)
  // and its bytes.
  uint64_t packet = 10;
  for (const Param& p : params) packet += 12 + p.bytes.size();
  check_packet(packet);
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    MYSQL_STMT* statement = mysql_stmt_init(handle_);
    if (!statement) throw Error("mysql_stmt_init failed (out of memory)", 0, false);
    if (mysql_stmt_prepare(statement, sql.data(), static_cast<unsigned long>(sql.size())) != 0) {
      try {
        fail(statement, "prepare");
      } catch (...) {
        mysql_stmt_close(statement);
        throw;
      }
    }
    it = statements_.emplace(sql, statement).first;
  }
  MYSQL_STMT* statement = it->second;
  if (mysql_stmt_param_count(statement) != params.size()) {
    throw std::logic_error("mysql: a prepared statement takes " +
                           std::to_string(mysql_stmt_param_count(statement)) + " values, not " +
                           std::to_string(params.size()));
  }
  std::vector<MYSQL_BIND> binds(params.size());
  std::vector<unsigned long> lengths(params.size());
  static const char kEmpty[] = "";
  for (size_t i = 0; i < params.size(); ++i) {
    MYSQL_BIND& b = binds[i];
    std::memset(&b, 0, sizeof b);
    const Param& p = params[i];
    switch (p.kind) {
      case Param::Kind::kNull:
        b.buffer_type = MYSQL_TYPE_NULL;
        break;
      case Param::Kind::kInt:
        b.buffer_type = MYSQL_TYPE_LONGLONG;
        b.buffer = const_cast<int64_t*>(&p.number);  // the API's buffers are not const
        break;
      case Param::Kind::kBytes:
        b.buffer_type = MYSQL_TYPE_STRING;
        b.buffer = const_cast<char*>(p.bytes.empty() ? kEmpty : p.bytes.data());
        b.buffer_length = lengths[i] = static_cast<unsigned long>(p.bytes.size());
        b.length = &lengths[i];
        break;
    }
  }
  if (mysql_stmt_bind_param(statement, binds.data()) != 0) fail(statement, "binding values");
  if (mysql_stmt_execute(statement) != 0) fail(statement, "statement");
  Result result;
  result.affected = mysql_stmt_affected_rows(statement);
  result.insert_id = mysql_stmt_insert_id(statement);
  return result;
}

std::vector<Result> Connection::run(std::string_view sql, size_t* completed) {
  std::vector<Result> results;
  if (completed) *completed = 0;
  if (broken_) throw Error("connection is broken", 2006, true);
  check_packet(sql.size() + 1);  // COM_QUERY: a command byte and the text
  if (mysql_real_query(handle_, sql.data(), static_cast<unsigned long>(sql.size())) != 0) {
    fail("query");
  }
  while (true) {
    Result result;
    MYSQL_RES* res = mysql_store_result(handle_);
    if (res) {
      unsigned fields = mysql_num_fields(res);
      result.rows.reserve(static_cast<size_t>(mysql_num_rows(res)));
      while (MYSQL_ROW row = mysql_fetch_row(res)) {
        unsigned long* lengths = mysql_fetch_lengths(res);
        Row out;
        out.reserve(fields);
        for (unsigned i = 0; i < fields; ++i) {
          if (row[i]) {
            out.emplace_back(std::string(row[i], lengths[i]));
          } else {
            out.emplace_back(std::nullopt);
          }
        }
        result.rows.push_back(std::move(out));
      }
      mysql_free_result(res);
    } else if (mysql_field_count(handle_) != 0) {
      fail("reading a result");
    } else {
      result.affected = mysql_affected_rows(handle_);
      result.insert_id = mysql_insert_id(handle_);
    }
    results.push_back(std::move(result));
    if (completed) *completed = results.size();
    int status = mysql_next_result(handle_);
    if (status == -1) break;
    if (status > 0) fail("statement");
  }
  return results;
}

Result Connection::one(std::string_view sql) {
  std::vector<Result> results = run(sql);
  if (results.empty()) return {};
  return std::move(results.back());
}

// --- pool ----------------------------------------------------------------------------------

Pool::Pool(Config config, size_t size)
    : config_(std::move(config)), size_(std::max<size_t>(size, 1)) {}

Pool::~Pool() = default;

Pool::Lease Pool::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  available_.wait(lock, [&] { return !idle_.empty() || open_ < size_; });
  if (!idle_.empty()) {
    std::unique_ptr<Connection> connection = std::move(idle_.back());
    idle_.pop_back();
    return Lease(this, std::move(connection));
  }
  ++open_;
  lock.unlock();
  try {
    return Lease(this, std::make_unique<Connection>(config_));
  } catch (...) {
    lock.lock();
    --open_;
    available_.notify_one();
    throw;
  }
}

void Pool::give_back(std::unique_ptr<Connection> connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (connection->broken()) {
    // A lost session is dropped; the idle ones may be just as dead (a server restart), so they
    // go too rather than failing the next retries one by one.
    connection.reset();
    open_ -= 1 + idle_.size();
    idle_.clear();
  } else {
    idle_.push_back(std::move(connection));
  }
  available_.notify_all();
}

// --- transactions --------------------------------------------------------------------------

Tx::~Tx() { rollback(); }

// Runs `call` on the session; a lost session ends the transaction (nothing to roll back).
template <class Call>
auto Tx::guarded(Call&& call) -> decltype(call()) {
  try {
    return call();
  } catch (const Error& e) {
    if (e.connection_lost()) finished_ = true;
    throw;
  }
}

Result Tx::execute(const std::string& sql, const std::vector<Param>& params) {
  if (!begun_) {
    guarded([&] { return connection_.run("START TRANSACTION"); });
    begun_ = true;
  }
  return guarded([&] { return connection_.execute(sql, params); });
}

std::vector<Result> Tx::send(const std::vector<std::string>& statements, bool commit) {
  std::string sql;
  size_t skip = 0;
  if (!begun_) {
    sql = "START TRANSACTION";
    skip = 1;
  }
  for (const std::string& statement : statements) {
    if (!sql.empty()) sql += ";\n";
    sql += statement;
  }
  if (commit) sql += sql.empty() ? "COMMIT" : ";\nCOMMIT";
  if (sql.empty()) return {};
  begun_ = true;
  std::vector<Result> results;
  size_t completed = 0;
  try {
    results = connection_.run(sql, &completed);
  } catch (const Error& e) {
    // A lost connection leaves the whole trip's fate unknown. So do the errors that do not
    // prove a COMMIT undone when the COMMIT itself met them (every statement before it
    // completed; Error::leaves_commit_unknown). The caller then reads what happened, after this
    // session's ROLLBACK (the session lives on). Met by a statement before the COMMIT, such an
    // error ended the trip there: nothing committed, and it is an ordinary transient error.
    const bool at_commit = commit && completed == skip + statements.size();
    if (commit && (e.connection_lost() || (at_commit && e.leaves_commit_unknown()))) {
      commit_unknown_ = true;
    }
    if (e.connection_lost()) finished_ = true;  // nothing to roll back on a dead session
    throw;
  }
  if (commit) {
    finished_ = true;
    results.pop_back();
  }
  results.erase(results.begin(), results.begin() + static_cast<std::ptrdiff_t>(skip));
  return results;
}

std::vector<Result> Tx::run(const std::vector<std::string>& statements) {
  return send(statements, false);
}

Result Tx::one(const std::string& statement) { return std::move(send({statement}, false).back()); }

std::vector<Result> Tx::commit(const std::vector<std::string>& statements) {
  return send(statements, true);
}

void Tx::rollback() noexcept {
  if (finished_) return;
  finished_ = true;
  if (!begun_ || connection_.broken()) return;
  try {
    connection_.run("ROLLBACK");
  } catch (...) {
    connection_.mark_broken();
  }
}

void backoff(int attempt, std::chrono::milliseconds base, std::chrono::milliseconds cap) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  int64_t limit = base.count() << std::min(attempt - 1, 16);
  limit = std::min<int64_t>(limit, cap.count());
  std::uniform_int_distribution<int64_t> pick(limit / 2, std::max<int64_t>(limit, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(pick(rng)));
}

}  // namespace mysql

// =============================================================================================
// The store
// =============================================================================================

namespace {

using mysql::Cell;
using mysql::Param;
using mysql::Pool;
using mysql::quote;
using mysql::Result;
using mysql::Row;
using mysql::Sql;
using mysql::to_i64;
using mysql::to_int;
using mysql::to_str;
using mysql::Tx;

constexpr const char* kActive = "('queued', 'running', 'waiting')";

// Errors go to TEXT columns (65535 bytes), in the stores' common form.
std::string clip(std::string_view text) { return stored_error(text); }

std::string clip(const std::string& text) { return clip(std::string_view(text)); }

std::optional<std::string> clip(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  return clip(*text);
}

std::string id_list(const std::vector<JobId>& ids) {
  std::string out;
  for (JobId id : ids) {
    if (!out.empty()) out += ',';
    out += std::to_string(id);
  }
  return out;
}

JobStatus status_from(const Cell& cell) {
  std::optional<JobStatus> status = parse_job_status(to_str(cell));
  if (!status) throw StorageError("mysql: unknown job status '" + to_str(cell) + "'");
  return *status;
}

DeadLetterStatus letter_status_from(const Cell& cell) {
  std::optional<DeadLetterStatus> status = parse_dead_letter_status(to_str(cell));
  if (!status) throw StorageError("mysql: unknown dead letter status '" + to_str(cell) + "'");
  return *status;
}

std::string status_sql(JobStatus status) { return quote(to_string(status)); }

// --- rows ----------------------------------------------------------------------------------

// lease_token is '' while a job is not running (schema 0003: a fixed-size column).
std::optional<std::string> token_from(const Cell& cell) {
  if (!cell || cell->empty()) return std::nullopt;
  return cell;
}

// lease_owners.name is VARBINARY(255). A longer owner name is kept as its first 238 bytes (cut at
// a UTF-8 boundary), '#' and the 16 hex digits of the whole name's FNV-1a hash, so that two names
// which share their first 255 bytes are still two owners (cut alone, they were one: each could
// recover the other's live leases).
constexpr size_t kOwnerBytes = 255;

std::string owner_key(const std::string& owner) {
  if (owner.size() <= kOwnerBytes) return owner;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(owner)));
  return cut_utf8(owner, kOwnerBytes - 17) + "#" + hash;
}

// The name of a running job's owner (schema 0003), in a statement that reads `jobs` unaliased.
constexpr const char* kOwnerName =
    "(SELECT name FROM lease_owners WHERE lease_owners.id = jobs.owner_id)";

// A job's result. A completion writes it into the succeeded attempt's row (schema 0004), so that
// the job row is rewritten in place (a result changes the row's length); jobs.result keeps the
// results of jobs that completed before. Only a succeeded job has a succeeded attempt: the others'
// attempt rows, of which a dead or often deferred job may have many, are not read for it.
constexpr const char* kJobResult =
    "IF(result IS NULL AND status = 'succeeded', (SELECT a.result FROM job_attempts a WHERE "
    "a.job_id = jobs.id AND a.outcome = 'succeeded' ORDER BY a.id DESC LIMIT 1), result)";

// The columns read_job reads, from `jobs` unaliased. A queued job, which is what a claim reads,
// has no owner and has never succeeded: its columns leave out those lookups.
std::string job_columns(bool queued) {
  return std::string(
             "id, kind, concurrency_key, dedupe_key, payload, status, priority, attempts, "
             "max_attempts, run_after_ms, ") +
         (queued ? "NULL" : kOwnerName) + ", lease_token, lease_expires_ms, checkpoint, " +
         (queued ? "NULL" : kJobResult) +
         ", last_error, parent_id, pending_children, wait_deadline_ms, timeout_ms, "
         "cancel_requested, created_ms, started_ms, finished_ms, updated_ms";
}
const std::string kJobColumns = job_columns(false);
const std::string kQueuedJobColumns = job_columns(true);

Job read_job(const Row& r) {
  Job job;
  job.id = to_i64(r[0]);
  job.kind = to_str(r[1]);
  job.concurrency_key = to_str(r[2]);
  job.dedupe_key = r[3];
  job.payload = to_str(r[4]);
  job.status = status_from(r[5]);
  job.priority = to_int(r[6]);
  job.attempts = to_int(r[7]);
  job.max_attempts = to_int(r[8]);
  job.run_after_ms = to_i64(r[9]);
  job.lease_owner = r[10];
  job.lease_token = token_from(r[11]);
  job.lease_expires_ms = to_i64(r[12]);
  job.checkpoint = r[13];
  job.result = r[14];
  job.last_error = r[15];
  if (r[16]) job.parent_id = to_i64(r[16]);
  job.pending_children = to_int(r[17]);
  job.wait_deadline_ms = to_i64(r[18]);
  job.timeout_ms = to_i64(r[19]);
  job.cancel_requested = to_i64(r[20]) != 0;
  job.created_ms = to_i64(r[21]);
  job.started_ms = to_i64(r[22]);
  job.finished_ms = to_i64(r[23]);
  job.updated_ms = to_i64(r[24]);
  return job;
}

constexpr const char* kLetterColumns =
    "id, job_id, kind, concurrency_key, status, error, retries, created_ms, updated_ms";

DeadLetter read_letter(const Row& r) {
  DeadLetter letter;
  letter.id = to_i64(r[0]);
  letter.job_id = to_i64(r[1]);
  letter.kind = to_str(r[2]);
  letter.concurrency_key = to_str(r[3]);
  letter.status = letter_status_from(r[4]);
  letter.error = to_str(r[5]);
  letter.retries = to_int(r[6]);
  letter.created_ms = to_i64(r[7]);
  letter.updated_ms = to_i64(r[8]);
  return letter;
}

// What the transitions need to know about a job.
struct JobState {
  JobId id = 0;
  JobStatus status = JobStatus::kQueued;
  std::string kind;
  std::string key;
  std::optional<std::string> token;
  std::optional<std::string> dedupe_key;
  int attempts = 0;
  int max_attempts = 0;
  int pending_children = 0;
  bool cancel_requested = false;
  bool counted_in_parent = false;
  std::optional<JobId> parent_id;
  std::optional<int64_t> dead_letter_id;
};

constexpr const char* kStateColumns =
    "id, status, kind, concurrency_key, lease_token, dedupe_key, attempts, max_attempts, "
    "pending_children, cancel_requested, counted_in_parent, parent_id, dead_letter_id";

JobState read_state(const Row& r) {
  JobState s;
  s.id = to_i64(r[0]);
  s.status = status_from(r[1]);
  s.kind = to_str(r[2]);
  s.key = to_str(r[3]);
  s.token = token_from(r[4]);
  s.dedupe_key = r[5];
  s.attempts = to_int(r[6]);
  s.max_attempts = to_int(r[7]);
  s.pending_children = to_int(r[8]);
  s.cancel_requested = to_i64(r[9]) != 0;
  s.counted_in_parent = to_i64(r[10]) != 0;
  if (r[11]) s.parent_id = to_i64(r[11]);
  if (r[12]) s.dead_letter_id = to_i64(r[12]);
  return s;
}

// Locks the job's row for the rest of the transaction.
std::optional<JobState> lock_state(Tx& tx, JobId id) {
  Result r = tx.one(Sql("SELECT ").raw(kStateColumns).raw(" FROM jobs WHERE id = ")
                    << id << " FOR UPDATE");
  if (r.rows.empty()) return std::nullopt;
  return read_state(r.rows[0]);
}

JobState lock_existing(Tx& tx, JobId id) {
  std::optional<JobState> s = lock_state(tx, id);
  if (!s) throw JobNotFound("job " + std::to_string(id) + " not found");
  return *s;
}

// Fencing: the job must be running under `token`, or the caller has lost it.
// Fencing: why a write under `token` to job `id` (state `s`, none if it is gone) must not apply,
// or nothing when the job is running under that token.
std::optional<std::string> lease_problem(JobId id, const JobState* s, const std::string& token) {
  std::string job = "job " + std::to_string(id);
  if (!s) return job + " no longer exists";
  if (s->status != JobStatus::kRunning) {
    return job + " is " + std::string(to_string(s->status)) + ", not running";
  }
  if (s->token != token) return job + ": the lease was taken over (token mismatch)";
  return std::nullopt;
}

// The states of `ids` (duplicates allowed), their rows locked in id order; absent ones are gone.
std::map<JobId, JobState> lock_states(Tx& tx, std::vector<JobId> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  Result locked = tx.one(Sql("SELECT ").raw(kStateColumns).raw(" FROM jobs WHERE id IN (")
                         << id_list(ids) << ") ORDER BY id FOR UPDATE");
  std::map<JobId, JobState> states;
  for (const Row& row : locked.rows) {
    JobState s = read_state(row);
    states.emplace(s.id, std::move(s));
  }
  return states;
}

JobState lock_running(Tx& tx, JobId id, const std::string& token) {
  std::optional<JobState> s = lock_state(tx, id);
  if (auto problem = lease_problem(id, s ? &*s : nullptr, token)) throw LeaseLost(*problem);
  return *s;
}

// --- transitions ---------------------------------------------------------------------------
// Each helper appends its writes to `w`; they are sent with the next read or the COMMIT.

// The writes of a transaction, sent with its next read or with its COMMIT (one round trip), and
// the changes of running_counts / running_totals, which always come last: their rows are shared
// by every claim and exit of a kind, so they are locked only while the COMMIT itself runs, in one
// order (keys, then kinds, each sorted) that no other lock ever follows.
class Writes {
 public:
  void push_back(std::string statement) { statements_.push_back(std::move(statement)); }
  void running(const std::string& kind, const std::string& key, int64_t delta) {
    running_[{kind, key}] += delta;
  }
  // Running jobs this transaction asked to stop (a parent's cancellation reached them): a state
  // read before that is stale in cancel_requested, and an ending of the job later in the same
  // transaction must follow the cancellation rule.
  void cancel_requested(JobId id) { cancel_requested_.insert(id); }
  // Jobs this transaction cancelled (mark_cancelled).
  void cancelled(JobId id) { cancelled_.insert(id); }
  bool cancelled_here(JobId id) const { return cancelled_.count(id) > 0; }
  JobState current(JobState s) const {
    if (cancel_requested_.count(s.id)) s.cancel_requested = true;
    return s;
  }

  // Sends the pending statements (not the counters) now.
  void flush(Tx& tx) {
    if (statements_.empty()) return;
    tx.run(statements_);
    statements_.clear();
  }
  // Sends the pending statements and then `statement`; returns the latter's result.
  Result read(Tx& tx, const std::string& statement) {
    statements_.push_back(statement);
    std::vector<Result> results = tx.run(statements_);
    statements_.clear();
    return std::move(results.back());
  }
  void commit(Tx& tx) {
    append_running(statements_);
    tx.commit(statements_);
    statements_.clear();
    running_.clear();
  }

 private:
  // Claims add (and raise the high-water marks, exact since the rows are locked by the upsert);
  // exits subtract.
  void append_running(std::vector<std::string>& out) const {
    std::map<std::string, int64_t> kinds;
    std::string added;
    for (const auto& [kk, delta] : running_) {
      kinds[kk.first] += delta;
      if (delta > 0) {
        if (!added.empty()) added += ", ";
        added += Sql("(").str(kk.first)
                 << ", " << quote(kk.second) << ", " << delta << ", " << delta << ")";
      } else if (delta < 0) {
        out.push_back(Sql("UPDATE running_counts SET running = GREATEST(running - ")
                      << -delta << ", 0) WHERE kind = " << quote(kk.first)
                      << " AND concurrency_key = " << quote(kk.second));
      }
    }
    // max_running is assigned first, from the old running: the same under MySQL's left-to-right
    // and MariaDB's simultaneous assignment.
    const char* raise =
        " ON DUPLICATE KEY UPDATE max_running = GREATEST(max_running, running + "
        "VALUES(running)), running = running + VALUES(running)";
    if (!added.empty()) {
      out.push_back(
          "INSERT INTO running_counts (kind, concurrency_key, running, max_running) "
          "VALUES " +
          added + raise);
    }
    added.clear();
    for (const auto& [kind, delta] : kinds) {
      if (delta > 0) {
        if (!added.empty()) added += ", ";
        added += Sql("(").str(kind) << ", " << delta << ", " << delta << ")";
      } else if (delta < 0) {
        out.push_back(Sql("UPDATE running_totals SET running = GREATEST(running - ")
                      << -delta << ", 0) WHERE kind = " << quote(kind));
      }
    }
    if (!added.empty()) {
      out.push_back("INSERT INTO running_totals (kind, running, max_running) VALUES " + added +
                    raise);
    }
  }

  std::vector<std::string> statements_;
  std::map<std::pair<std::string, std::string>, int64_t> running_;
  std::set<JobId> cancelled_;
  std::set<JobId> cancel_requested_;
};

Result read_after(Tx& tx, Writes& w, const std::string& statement) { return w.read(tx, statement); }

// The attempt rows of jobs leaving running, from their job rows: it goes before the exit's own
// UPDATE of them (schema 0002: the claim opens no row). `finished`, `outcome` and `error` are
// SQL expressions (literals, or per-id CASEs for a batch); `where` picks the jobs.
std::string attempt_rows(const std::string& finished, const std::string& outcome,
                         const std::string& error, const std::string& where,
                         const std::string& result = "NULL") {
  return "INSERT INTO job_attempts (job_id, attempt, owner, lease_token, started_ms, "
         "finished_ms, outcome, error, result) SELECT id, attempt_no, COALESCE(" +
         std::string(kOwnerName) + ", ''), lease_token, started_ms, " + finished + ", " + outcome +
         ", " + error + ", " + result + " FROM jobs WHERE " + where + " ORDER BY id";
}

// Every exit from running writes the attempt's row.
void end_attempt(Writes& w, const JobState& s, std::string_view outcome,
                 const std::optional<std::string>& error, int64_t now) {
  w.running(s.kind, s.key, -1);
  w.push_back(attempt_rows(std::to_string(now), quote(outcome), quote(clip(error)),
                           "id = " + std::to_string(s.id)));
}

// Fan-in: `n` children of `parent` became terminal. A waiting parent whose count reaches 0 is
// queued now. Each assignment reads only columns assigned after it (or none), so the statement
// means the same under MySQL's left-to-right and MariaDB's SIMULTANEOUS_ASSIGNMENT semantics.
std::string uncount_children(JobId parent, int n, int64_t now) {
  std::string last = Sql("(status = 'waiting' AND pending_children <= ") << n << ")";
  return Sql("UPDATE jobs SET run_after_ms = IF(")
         << last << ", " << now << ", run_after_ms), wait_deadline_ms = IF(" << last
         << ", 0, wait_deadline_ms), status = IF(" << last
         << ", 'queued', status), pending_children = GREATEST(pending_children - " << n
         << ", 0), updated_ms = " << now << " WHERE id = " << parent << " AND pending_children > 0";
}

// The job just became terminal (its own UPDATE cleared counted_in_parent).
void uncount_from_parent(Writes& w, const JobState& s, int64_t now) {
  if (!s.parent_id || !s.counted_in_parent) return;
  w.push_back(uncount_children(*s.parent_id, 1, now));
}

// Back to queued; `refund` = 1 when the attempt does not count (defer, release).
void requeue(Writes& w, const JobState& s, int64_t run_after, int refund,
             const std::optional<std::string>& error, int64_t now) {
  w.push_back(Sql("UPDATE jobs SET status = 'queued', run_after_ms = ")
              << run_after << ", attempts = GREATEST(attempts - " << refund
              << ", 0), last_error = COALESCE(" << quote(clip(error))
              << ", last_error), owner_id = 0, lease_token = '', lease_expires_ms = 0, "
                 "updated_ms = "
              << now << " WHERE id = " << s.id);
}

void cancel_active_children(Tx& tx, Writes& w, JobId parent, int64_t now);

// Dead (attempts exhausted, FATAL, or an expired last lease): the dead letter is created, or a
// retried one is pending again with the new error. One asked to stop takes its active children
// with it, as its cancellation would have.
void mark_dead(Tx& tx, Writes& w, const JobState& s, const std::string& error, int64_t now) {
  std::string e = quote(clip(error));
  w.push_back(Sql("INSERT INTO dead_letters (job_id, kind, concurrency_key, status, error, "
                  "retries, created_ms, updated_ms) VALUES (")
              << s.id << ", " << quote(s.kind) << ", " << quote(s.key) << ", 'pending', " << e
              << ", 0, " << now << ", " << now
              << ") ON DUPLICATE KEY UPDATE status = 'pending', error = VALUES(error), "
                 "updated_ms = VALUES(updated_ms)");
  w.push_back(Sql("UPDATE jobs j JOIN dead_letters d ON d.job_id = j.id SET j.status = 'dead', "
                  "j.last_error = ")
              << e << ", j.dead_letter_id = d.id, j.finished_ms = " << now
              << ", j.updated_ms = " << now
              << ", j.owner_id = 0, j.lease_token = '', j.lease_expires_ms = 0, "
                 "j.active_dedupe_key = NULL, j.counted_in_parent = 0 WHERE j.id = "
              << s.id);
  uncount_from_parent(w, s, now);
  if (s.cancel_requested) cancel_active_children(tx, w, s.id, now);
}

CancelOutcome cancel_job(Tx& tx, Writes& w, JobId id, int64_t now);

// Cancelled (terminal), with its active children: queued and waiting ones at once, running ones
// asked to stop.
void mark_cancelled(Tx& tx, Writes& w, const JobState& s, int refund,
                    const std::optional<std::string>& error, int64_t now) {
  w.push_back(Sql("UPDATE jobs SET status = 'cancelled', attempts = GREATEST(attempts - ")
              << refund << ", 0), last_error = COALESCE(" << quote(clip(error))
              << ", last_error), finished_ms = " << now << ", updated_ms = " << now
              << ", owner_id = 0, lease_token = '', lease_expires_ms = 0, "
                 "wait_deadline_ms = 0, active_dedupe_key = NULL, counted_in_parent = 0 "
                 "WHERE id = "
              << s.id);
  w.cancelled(s.id);
  if (s.dead_letter_id) {
    w.push_back(Sql("UPDATE dead_letters SET status = 'ignored', updated_ms = ")
                << now << " WHERE id = " << *s.dead_letter_id << " AND status = 'retrying'");
  }
  uncount_from_parent(w, s, now);
  cancel_active_children(tx, w, s.id, now);
}

void cancel_active_children(Tx& tx, Writes& w, JobId parent, int64_t now) {
  Result children = read_after(tx, w,
                               Sql("SELECT id FROM jobs WHERE parent_id = ")
                                   << parent << " AND status IN " << kActive << " ORDER BY id");
  for (const Row& row : children.rows) cancel_job(tx, w, to_i64(row[0]), now);
}

CancelOutcome cancel_job(Tx& tx, Writes& w, JobId id, int64_t now) {
  w.flush(tx);  // this job may have been changed by the pending writes
  JobState s = lock_existing(tx, id);
  if (is_terminal(s.status)) return CancelOutcome::kAlreadyFinished;
  if (s.status == JobStatus::kRunning) {
    w.push_back(Sql("UPDATE jobs SET cancel_requested = 1, updated_ms = ")
                << now << " WHERE id = " << id);
    w.cancel_requested(id);
    return CancelOutcome::kRequested;
  }
  mark_cancelled(tx, w, s, 0, std::nullopt, now);
  return CancelOutcome::kCancelled;
}

// --- claiming ------------------------------------------------------------------------------

// A queued job a claim may take.
struct Candidate {
  JobId id = 0;
  std::string kind;
  std::string key;
  int priority = 0;
  int64_t run_after = 0;
  int64_t load = 0;        // running jobs of its key + its rank in the key (fair share)
  std::optional<Job> row;  // the full row, once locked
};

bool claim_order(const Candidate& a, const Candidate& b) {
  return std::tie(a.priority, a.run_after, a.id) < std::tie(b.priority, b.run_after, b.id);
}

bool fair_order(const Candidate& a, const Candidate& b) {
  return std::tie(a.priority, a.load, a.run_after, a.id) <
         std::tie(b.priority, b.load, b.run_after, b.id);
}

// Merges the lists by (priority, run_after, id), keeping each list's own order.
std::vector<Candidate*> merge_heads(std::vector<std::vector<Candidate>>& lists, size_t limit) {
  std::vector<Candidate*> out;
  std::vector<size_t> next(lists.size(), 0);
  while (out.size() < limit) {
    int best = -1;
    for (size_t i = 0; i < lists.size(); ++i) {
      if (next[i] == lists[i].size()) continue;
      if (best < 0 ||
          claim_order(lists[i][next[i]],
                      lists[static_cast<size_t>(best)][next[static_cast<size_t>(best)]])) {
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    out.push_back(&lists[static_cast<size_t>(best)][next[static_cast<size_t>(best)]++]);
  }
  return out;
}

std::string in_list(const std::vector<std::string>& values) {
  std::string out;
  for (const std::string& v : values) {
    if (!out.empty()) out += ", ";
    mysql::append_quoted(out, v);
  }
  return out;
}

std::string random_hex(size_t bytes) {
  thread_local std::mt19937_64 rng = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }();
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < bytes; ++j) {
      out += digits[(v >> (j * 8 + 4)) & 0xF];
      out += digits[(v >> (j * 8)) & 0xF];
    }
  }
  return out;
}

struct KindCaps {
  int per_key = 0;
  int global = 0;
  int64_t total = 0;                    // running jobs of the kind (exact under the lock)
  std::map<std::string, int64_t> keys;  // running jobs per key
};

// A value per job in one statement: CASE column WHEN id THEN value ... END, or the value alone
// when every job has the same (the usual case: one caller, one clock).
std::string per_id(const char* column, const std::vector<std::pair<JobId, std::string>>& values) {
  bool same = true;
  for (const auto& [id, value] : values) same = same && value == values.front().second;
  if (same) return values.front().second;
  std::string out = std::string("CASE ") + column;
  for (const auto& [id, value] : values) {
    out += " WHEN " + std::to_string(id) + " THEN " + value;
  }
  return out + " END";
}

// Group commit (DESIGN.md "The queue"): concurrent calls of one operation queue up; a caller that
// finds fewer than `leaders` batches in flight takes what is queued (the ops that merge with the
// oldest, within a size budget) and runs them as one transaction while the others wait for their
// own op. Every caller returns only after the transaction that carried its op has committed (or
// failed). Batches grow with the load by themselves: while one is in flight, the next one fills.
// Op needs: bool done; size_t bytes() const; bool merges_with(const Op&) const.
template <class Op>
class GroupCommit {
 public:
  GroupCommit(size_t leaders, size_t max_ops, size_t max_bytes)
      : leaders_(leaders), max_ops_(max_ops), max_bytes_(max_bytes) {}

  // `run(batch)` executes a batch and records each op's outcome in the op; it must not throw.
  template <class Run>
  void submit(Op& op, Run&& run) {
    std::unique_lock<std::mutex> lock(mutex_);
    queue_.push_back(&op);
    while (!op.done) {
      if (running_ < leaders_ && !queue_.empty()) {
        ++running_;
        std::vector<Op*> batch = take();
        lock.unlock();
        run(batch);
        lock.lock();
        for (Op* o : batch) o->done = true;
        --running_;
        finished_.notify_all();
      } else {
        finished_.wait(lock);
      }
    }
  }

 private:
  std::vector<Op*> take() {
    std::vector<Op*> batch{queue_.front()};
    queue_.pop_front();
    size_t bytes = batch.front()->bytes();
    for (auto it = queue_.begin(); it != queue_.end() && batch.size() < max_ops_;) {
      if ((*it)->merges_with(*batch.front()) && bytes + (*it)->bytes() <= max_bytes_) {
        bytes += (*it)->bytes();
        batch.push_back(*it);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return batch;
  }

  const size_t leaders_;
  const size_t max_ops_;
  const size_t max_bytes_;
  std::mutex mutex_;
  std::condition_variable finished_;
  std::deque<Op*> queue_;
  size_t running_ = 0;
};

// One claim() call waiting for a group commit (GroupCommit). Calls merge when they ask for
// the same kinds with the same lease length; each keeps its owner, clock and limit.
struct ClaimOp {
  const ClaimRequest& request;
  int owner_id;  // request.owner's row in lease_owners
  std::vector<Claimed> result;
  std::exception_ptr error;
  bool done = false;
  size_t bytes() const { return 64; }
  bool merges_with(const ClaimOp& other) const {
    return request.kinds == other.request.kinds && request.lease_ms == other.request.lease_ms;
  }
};

std::vector<Candidate> read_candidates(const std::vector<Row>& rows) {
  std::vector<Candidate> out;
  for (const Row& row : rows) {
    Candidate c;
    c.id = to_i64(row[0]);
    c.kind = to_str(row[1]);
    c.key = to_str(row[2]);
    c.priority = to_int(row[3]);
    c.run_after = to_i64(row[4]);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<Candidate> read_candidates(const Result& result) {
  return read_candidates(result.rows);
}

// The first `limit` candidates in claim order of the results of uncapped_candidates()'s statements.
std::vector<Candidate> uncapped_of(std::vector<Result>::const_iterator begin,
                                   std::vector<Result>::const_iterator end, size_t limit) {
  if (end - begin == 1) return read_candidates(*begin);
  std::vector<Candidate> out;
  for (auto it = begin; it != end; ++it) {
    for (Candidate& c : read_candidates(*it)) out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), claim_order);
  if (out.size() > limit) out.resize(limit);
  return out;
}

// Locks those of the candidates that are still queued and due (SKIP LOCKED: a row another claim
// or an operator holds is passed over) and reads their rows into them. Returns how many it locked.
size_t lock_candidates(Tx& tx, const std::vector<Candidate*>& candidates, int64_t now) {
  if (candidates.empty()) return 0;
  std::vector<JobId> ids;
  for (const Candidate* c : candidates) ids.push_back(c->id);
  // By primary key, whatever the statistics say: a plan over jobs_claim_kind would lock-scan the
  // queued entries after all (the optimizer picks it for small tables).
  Result locked = tx.one(Sql("SELECT ")
                             .raw(kQueuedJobColumns)
                             .raw(" FROM jobs FORCE INDEX (PRIMARY) "
                                  "WHERE id IN (")
                         << id_list(ids) << ") AND status = 'queued' AND run_after_ms <= " << now
                         << " FOR UPDATE SKIP LOCKED");
  std::map<JobId, Job> rows;
  for (const Row& row : locked.rows) {
    Job job = read_job(row);
    rows.emplace(job.id, std::move(job));
  }
  for (Candidate* c : candidates) {
    auto it = rows.find(c->id);
    if (it != rows.end()) c->row = std::move(it->second);
  }
  return rows.size();
}

// Reads of uncapped candidates per claim, at most: the first (`limit` rows), and more past those
// that other claims hold, each twice as long as the one before but at most kMaxClaimWindow rows
// (or `limit`, if more), so that a read stays a few hundred KB. A claim that finds no free job
// that far returns short, and the caller claims again.
constexpr int kClaimReads = 8;
// The rows a claim locks past those it wants, at most, in each slice of a read past held rows.
constexpr size_t kSliceSlack = 32;
constexpr size_t kMaxClaimWindow = 4096;
// A claim's statements that grow with the queue (the reads of the heads of per-key capped kinds,
// one sub-SELECT of about 250 bytes per key with room and priority; the seeks, one per value; the
// uncapped read, one part per kind and priority), and each round trip of them, hold at most this
// much (a statement may hold one part that is longer): well under any max_allowed_packet a server
// would run with (1 MiB at least in practice; 16 MiB by default).
constexpr size_t kHeadBytes = 256u << 10;

// A kind's priorities, ascending, as the server spells them: where its due jobs are.
using KindPriorities = std::map<std::string, std::vector<std::string>>;

// A kind with more priorities than this is read as one range, which steps over its jobs not yet
// due: a statement per priority costs more than that with many sparse priorities.
constexpr size_t kPriorityParts = 8;

// Per priority, a kind's due jobs are the range of jobs_claim_kind (status, kind, priority,
// run_after_ms, id) that ends at the first job not yet due: `prefix` is the statement up to the
// condition on priority ("... WHERE status = 'queued' AND kind = 'k' AND "). One part per
// priority, ascending; past kPriorityParts, one for them all. `limit`: rows per part. `after`:
// only the jobs after it in claim order (reading on past a window; see claim_jobs).
std::vector<std::string> due_parts(const std::string& prefix,
                                   const std::vector<std::string>& priorities, int64_t now,
                                   int64_t limit, const Candidate* after) {
  std::vector<std::string> parts;
  if (priorities.size() > kPriorityParts) {
    Sql part(prefix);
    part << "run_after_ms <= " << now;
    if (after) {
      // (priority, run_after_ms, id) > after's, spelled out so that it is a range of the index.
      part << " AND (priority > " << after->priority << " OR (priority = " << after->priority
           << " AND (run_after_ms > " << after->run_after
           << " OR (run_after_ms = " << after->run_after << " AND id > " << after->id << "))))";
    }
    parts.push_back(part << " ORDER BY priority, run_after_ms, id LIMIT " << limit);
    return parts;
  }
  for (const std::string& p : priorities) {
    const int64_t priority = std::stoll(p);
    if (after && priority < after->priority) continue;
    Sql part(prefix);
    part << "priority = " << p << " AND run_after_ms <= " << now;
    if (after && priority == after->priority) {
      part << " AND (run_after_ms > " << after->run_after
           << " OR (run_after_ms = " << after->run_after << " AND id > " << after->id << "))";
    }
    parts.push_back(part << " ORDER BY run_after_ms, id LIMIT " << limit);
  }
  return parts;
}

// Parts as statements of at most kHeadBytes (a part may be longer), each the rows of its parts
// in claim order, `limit` at most.
std::vector<std::string> unions_of(const std::vector<std::string>& parts, int64_t limit) {
  if (parts.size() == 1) return parts;
  std::vector<std::string> out;
  std::string sql;
  const std::string order = " ORDER BY priority, run_after_ms, id LIMIT " + std::to_string(limit);
  for (const std::string& part : parts) {
    // " UNION ALL (" and ")": 13 bytes.
    if (!sql.empty() && sql.size() + 13 + part.size() + order.size() > kHeadBytes) {
      out.push_back(sql + order);
      sql.clear();
    }
    if (!sql.empty()) sql += " UNION ALL ";
    sql += "(" + part + ")";
  }
  if (!sql.empty()) out.push_back(sql + order);
  return out;
}

// The uncapped kinds' queued jobs in claim order, due at `now`: a plain read, not a locking one.
// Each claim leaves delete-marked entries at the head of the claim index that purge removes only
// later, and a locking scan at READ COMMITTED locks and releases every one of them on its way: on
// this machine that made the claim's SELECT the costliest statement of a W1 run (0.92 s of server
// time per 20 000 jobs, growing from 1 to 9 ms per claim as entries piled up), where the plain
// read and the locking read by primary key below cost 0.08 and 0.09 s. The statements' rows are
// merged by uncapped_of(). None: no kind to read.
std::vector<std::string> uncapped_candidates(int64_t now, const KindPriorities& kinds,
                                             int64_t limit, const Candidate* after = nullptr) {
  std::vector<std::string> parts;
  for (const auto& [kind, priorities] : kinds) {
    const std::string prefix =
        "SELECT id, kind, concurrency_key, priority, run_after_ms FROM jobs WHERE status = "
        "'queued' AND kind = " +
        quote(kind) + " AND ";
    for (std::string& part : due_parts(prefix, priorities, now, limit, after)) {
      parts.push_back(std::move(part));
    }
  }
  return parts.empty() ? std::vector<std::string>{} : unions_of(parts, limit);
}

// Runs `statements` in round trips of at most kHeadBytes (one statement may be longer).
std::vector<Result> run_in_trips(Tx& tx, const std::vector<std::string>& statements) {
  std::vector<Result> out;
  for (size_t at = 0; at < statements.size();) {
    std::vector<std::string> trip;
    size_t bytes = 0;
    while (at < statements.size() &&
           (trip.empty() || bytes + statements[at].size() <= kHeadBytes)) {
      bytes += statements[at].size();
      trip.push_back(statements[at++]);
    }
    for (Result& result : tx.run(trip)) out.push_back(std::move(result));
  }
  return out;
}

// The distinct values of one column among queued jobs (the kinds; a kind's priorities; a capped
// kind's keys), ascending, found by seeking from each to the next: MIN(column) ... AND column > v
// is one index dive at any queue length, where SELECT DISTINCT reads every queued job (MariaDB
// takes a loose index scan for it only with fresh statistics, and for MIN(x) WHERE x >
// (correlated) in a recursive CTE no range at all). A seek starts from what the last claim found
// (`hint`): it dives to the least value and from each hinted one, then from each value found
// whose successor it does not know yet, until the chain from the least value ends at a value
// with none. When the values keep changing, after kSeekRounds rounds it reads them with SELECT
// DISTINCT instead. The values of one round are read in one round trip with every other seek's.
// A value queued while the claim runs, at a kind, priority or key that the claim found none of,
// may be left out of it, like a job enqueued after it.
class Seek {
 public:
  static constexpr int kSeekRounds = 4;

  // `from`: " FROM jobs WHERE status = 'queued' ..."; `text`: the column holds bytes, not numbers.
  // `enough`: past this many values (0: no bound), the rest are not sought: values() then holds
  // the first enough + 1.
  Seek(std::string from, std::string column, bool text, std::vector<std::string> hint,
       size_t enough = 0)
      : from_(std::move(from)),
        column_(std::move(column)),
        text_(text),
        enough_(enough),
        pending_(std::move(hint)) {
    if (enough_ > 0 && pending_.size() > enough_ + 1) pending_.resize(enough_ + 1);
  }

  bool done() const { return done_; }
  const std::vector<std::string>& values() const { return values_; }

  // This round's statements: UNION ALLs of dives, each at most kHeadBytes (or one DISTINCT).
  std::vector<std::string> statements() const {
    if (done_) return {};
    if (rounds_ == kSeekRounds) {
      std::string distinct = "SELECT DISTINCT " + column_ + from_ + " ORDER BY " + column_;
      if (enough_ > 0) distinct += " LIMIT " + std::to_string(enough_ + 1);
      return {distinct};
    }
    std::vector<std::string> out;
    std::string sql;
    const auto add = [&](size_t index, const std::string* after) {
      std::string dive = "SELECT " + std::to_string(index) + ", MIN(" + column_ + ")" + from_;
      if (after) dive += " AND " + column_ + " > " + (text_ ? quote(*after) : *after);
      if (!sql.empty() && sql.size() + 11 + dive.size() > kHeadBytes) {  // " UNION ALL "
        out.push_back(std::move(sql));
        sql.clear();
      }
      if (!sql.empty()) sql += " UNION ALL ";
      sql += dive;
    };
    if (!first_known_) add(0, nullptr);
    for (size_t i = 0; i < pending_.size(); ++i) add(i + 1, &pending_[i]);
    if (!sql.empty()) out.push_back(std::move(sql));
    return out;
  }

  // The results of statements(), in order.
  void read(const std::vector<Result>& results) {
    if (rounds_ == kSeekRounds) {
      for (const Row& row : results.at(0).rows) values_.push_back(to_str(row[0]));
      done_ = true;
      return;
    }
    for (const Result& result : results) {
      for (const Row& row : result.rows) {
        const size_t index = static_cast<size_t>(to_i64(row[0]));
        if (index == 0) {
          first_ = row[1];
          first_known_ = true;
        } else {
          next_[pending_.at(index - 1)] = row[1];
        }
      }
    }
    ++rounds_;
    // Walk the chain; dive next from every value found whose successor is unknown.
    pending_.clear();
    values_.clear();
    bool complete = true;
    for (Cell v = first_; v; v = next_.at(*v)) {
      // Each successor is greater than its value, so the chain ends; a server that compared
      // otherwise (a collation other than the binary one) must not make the claim spin.
      if (values_.size() > next_.size()) {
        throw StorageError("mysql: the seek of " + column_ + " went back to a value it had read");
      }
      values_.push_back(*v);
      if (enough_ > 0 && values_.size() > enough_) break;
      if (!next_.count(*v)) {
        complete = false;
        break;
      }
    }
    done_ = complete;
    if (done_) return;
    std::set<std::string> found;
    if (first_) found.insert(*first_);
    for (const auto& [value, next] : next_) {
      if (next) found.insert(*next);
    }
    for (const std::string& value : found) {
      if (!next_.count(value)) pending_.push_back(value);
    }
    values_.clear();
  }

 private:
  std::string from_;
  std::string column_;
  bool text_;
  size_t enough_;
  std::vector<std::string> pending_;  // the values to dive from this round
  bool first_known_ = false;
  Cell first_;                        // the least value (NULL: none)
  std::map<std::string, Cell> next_;  // a value's successor (NULL: none)
  int rounds_ = 0;
  bool done_ = false;
  std::vector<std::string> values_;
};

// What claims learned of the queue, for the next claim to start from (under a mutex). Each claim
// checks what it uses (Seek; the caps under their locks), so a stale hint costs round trips,
// never a job left out or a cap overrun.
struct ClaimHints {
  std::set<std::string> capped;                                // kinds last seen with caps
  std::vector<std::string> kinds;                              // kinds of queued jobs
  std::map<std::string, std::vector<std::string>> priorities;  // of a kind's queued jobs
  std::map<std::string, std::vector<std::string>> keys;        // of a per-key capped kind's
};

// The claim transaction. Uncapped kinds: their first `limit` due jobs in claim order, read
// plainly, then locked by primary key. Capped kinds: under the kind's job_caps lock, exact
// running counts, then per key its first (cap - running) due jobs (fair share: the least loaded
// keys first, like the SQLite store). The lists are merged in claim order, the first `limit` are
// locked and taken. When other claims hold some of the uncapped ones, the claim reads on past
// them (kClaimReads). Every read of queued jobs is a range per kind (per key) and priority, which
// ends at the first job not yet due; the kinds, priorities and keys come from seeks (Seek),
// started from what the last claim found (`hints`).
//
// Several claim() calls may be merged (ClaimOp, group commit): the claim then takes up to the sum
// of their limits, due at the latest of their clocks, and deals the jobs out in claim order, each
// to a call whose clock has reached the job's run_after and whose limit is not reached.
void claim_jobs(Tx& tx, const std::vector<ClaimOp*>& ops, ClaimHints& hints,
                std::mutex& hint_mutex) {
  ClaimRequest r = ops.front()->request;  // kinds and lease_ms are the same in every op
  r.limit = 0;
  r.now_ms = std::numeric_limits<int64_t>::min();
  for (ClaimOp* op : ops) {
    op->result.clear();  // the body may run again after a deadlock
    // Saturating: limits as large as SIZE_MAX ("as many as there are") must not wrap around.
    r.limit = op->request.limit > SIZE_MAX - r.limit ? SIZE_MAX : r.limit + op->request.limit;
    r.now_ms = std::max(r.now_ms, op->request.now_ms);
  }
  const int64_t now = r.now_ms;
  const int64_t limit = static_cast<int64_t>(std::min<size_t>(r.limit, INT64_MAX));
  const bool any_kind = r.kinds.empty();
  std::string kinds_filter;
  if (!any_kind) kinds_filter = " AND kind IN (" + in_list(r.kinds) + ")";
  ClaimHints hint;  // what this claim needs of them
  {
    std::lock_guard<std::mutex> lock(hint_mutex);
    hint.capped = hints.capped;
    hint.kinds = hints.kinds;
    for (const std::string& kind : any_kind ? hints.kinds : r.kinds) {
      if (auto it = hints.priorities.find(kind); it != hints.priorities.end()) {
        hint.priorities.insert(*it);
      }
      if (auto it = hints.keys.find(kind); it != hints.keys.end()) hint.keys.insert(*it);
    }
    if (any_kind) {  // kinds with no job queued included: they may come back
      hint.priorities = hints.priorities;
      hint.keys = hints.keys;
    }
  }

  std::optional<Seek> kind_seek;
  if (any_kind) kind_seek.emplace(" FROM jobs WHERE status = 'queued'", "kind", true, hint.kinds);
  std::map<std::string, Seek> priority_seeks;
  std::map<std::string, Seek> key_seeks;
  const auto queued_of = [](const std::string& kind) {
    return " FROM jobs WHERE status = 'queued' AND kind = " + quote(kind);
  };
  const auto seek_priorities = [&](const std::string& kind) {
    priority_seeks.try_emplace(kind, queued_of(kind), "priority", false, hint.priorities[kind],
                               kPriorityParts);
  };
  const auto seek_keys = [&](const std::string& kind) {
    key_seeks.try_emplace(kind, queued_of(kind), "concurrency_key", true, hint.keys[kind]);
  };
  // One round trip: `first`, then a round of every seek not done.
  const auto run_seeks = [&](const std::vector<std::string>& first) {
    std::vector<std::string> statements = first;
    std::vector<std::pair<Seek*, size_t>> counts;
    const auto add = [&](Seek& seek) {
      std::vector<std::string> own = seek.statements();
      if (own.empty()) return;
      counts.emplace_back(&seek, own.size());
      for (std::string& s : own) statements.push_back(std::move(s));
    };
    if (kind_seek) add(*kind_seek);
    for (auto& [kind, seek] : priority_seeks) add(seek);
    for (auto& [kind, seek] : key_seeks) add(seek);
    std::vector<Result> results = run_in_trips(tx, statements);
    size_t at = first.size();
    for (const auto& [seek, n] : counts) {
      seek->read(std::vector<Result>(results.begin() + static_cast<std::ptrdiff_t>(at),
                                     results.begin() + static_cast<std::ptrdiff_t>(at + n)));
      at += n;
    }
    results.resize(first.size());
    return results;
  };
  // The uncapped kinds' priorities, as far as `kinds` and the seeks tell.
  const auto uncapped_plan = [&](const std::vector<std::string>& kinds,
                                 const std::set<std::string>& capped, bool settled) {
    KindPriorities plan;
    for (const std::string& kind : kinds) {
      if (capped.count(kind)) continue;
      const std::vector<std::string>& priorities =
          settled ? priority_seeks.at(kind).values() : hint.priorities[kind];
      if (!priorities.empty()) plan[kind] = priorities;
    }
    return plan;
  };

  // One round trip: lock the capped kinds' rows, seek, and read the uncapped kinds' candidates as
  // the hints have them (the kinds believed uncapped, at the priorities last seen). When the seeks
  // or the locked caps tell otherwise, the read runs again below: a stale hint costs a round trip.
  const std::vector<std::string>& guessed_kinds = any_kind ? hint.kinds : r.kinds;
  for (const std::string& kind : guessed_kinds) seek_priorities(kind);
  for (const std::string& kind : hint.capped) {
    if (hint.keys.count(kind) &&
        (any_kind || std::find(r.kinds.begin(), r.kinds.end(), kind) != r.kinds.end())) {
      seek_keys(kind);
    }
  }
  const KindPriorities guessed = uncapped_plan(guessed_kinds, hint.capped, false);
  std::vector<std::string> first_statements = {
      "SELECT id FROM claim_gate WHERE id = 1 LOCK IN SHARE MODE",
      "SELECT kind, per_key_cap, global_cap FROM job_caps WHERE (per_key_cap > 0 OR "
      "global_cap > 0)" +
          kinds_filter + " ORDER BY kind FOR UPDATE"};
  const std::vector<std::string> guessed_read = uncapped_candidates(now, guessed, limit);
  first_statements.insert(first_statements.end(), guessed_read.begin(), guessed_read.end());
  std::vector<Result> first = run_seeks(first_statements);
  std::map<std::string, KindCaps> capped;
  for (const Row& row : first[1].rows) {
    KindCaps& c = capped[to_str(row[0])];
    c.per_key = to_int(row[1]);
    c.global = to_int(row[2]);
  }
  std::set<std::string> capped_kinds;
  for (const auto& [kind, c] : capped) capped_kinds.insert(kind);

  // Seek on until the kinds, their priorities and the per-key capped kinds' keys are known.
  std::vector<std::string> kinds = r.kinds;
  for (;;) {
    if (kind_seek && kind_seek->done()) kinds = kind_seek->values();
    bool done = !kind_seek || kind_seek->done();
    for (const std::string& kind : kinds) seek_priorities(kind);
    for (const auto& [kind, c] : capped) {
      if (c.per_key > 0) seek_keys(kind);
    }
    for (const auto& [kind, seek] : priority_seeks) done = done && seek.done();
    for (const auto& [kind, seek] : key_seeks) done = done && seek.done();
    if (done) break;
    run_seeks({});
  }
  {
    std::lock_guard<std::mutex> lock(hint_mutex);
    if (any_kind) {
      hints.capped = capped_kinds;
      hints.kinds = kinds;
    } else {
      for (const std::string& kind : r.kinds) hints.capped.erase(kind);
      hints.capped.insert(capped_kinds.begin(), capped_kinds.end());
    }
    // A kind's last priorities stay while none of its jobs is queued: a job enqueued at one of
    // them then costs no extra round trip. (They are kept for every kind ever claimed.) A per-key
    // capped kind keeps its entry in keys, so that the next claim seeks its keys in the first round
    // trip.
    for (const auto& [kind, seek] : priority_seeks) {
      if (!seek.values().empty()) hints.priorities[kind] = seek.values();
    }
    for (const std::string& kind : any_kind ? kinds : r.kinds) hints.keys.erase(kind);
    for (const auto& [kind, seek] : key_seeks) {
      const auto c = capped.find(kind);
      if (c != capped.end() && c->second.per_key > 0) {
        hints.keys[kind] = seek.values();
      } else {
        hints.keys.erase(kind);  // sought from the hint, and no longer capped per key
      }
    }
  }

  // The guessed read holds the uncapped kinds' first due jobs when it read no kind that is capped
  // and every priority of the plan's (a priority gone since costs it nothing).
  const KindPriorities plan = uncapped_plan(kinds, capped_kinds, true);
  bool covered = true;
  for (const auto& [kind, priorities] : guessed) covered = covered && !capped_kinds.count(kind);
  for (const auto& [kind, priorities] : plan) {
    const auto g = guessed.find(kind);
    if (g == guessed.end()) {
      covered = false;
    } else if (g->second.size() <= kPriorityParts) {  // else it read the kind as one range
      covered = covered && priorities.size() <= kPriorityParts;
      for (const std::string& p : priorities) {
        covered = covered && std::find(g->second.begin(), g->second.end(), p) != g->second.end();
      }
    }
  }
  std::vector<std::vector<Candidate>> lists;
  std::vector<std::string> read_again;  // the uncapped read, when the guess was wrong
  if (covered) {
    lists.push_back(guessed_read.empty() ? std::vector<Candidate>{}
                                         : uncapped_of(first.begin() + 2, first.end(), r.limit));
  } else {
    read_again = uncapped_candidates(now, plan, limit);
    if (read_again.empty() || !capped.empty()) {
      lists.emplace_back();  // read with the running counts below
    } else {
      const std::vector<Result> read = run_in_trips(tx, read_again);
      lists.push_back(uncapped_of(read.begin(), read.end(), r.limit));
    }
  }

  if (!capped.empty()) {
    std::vector<std::string> reads = {
        // Exact: every claim that could add running jobs of these kinds waits for our locks.
        "SELECT kind, concurrency_key, COUNT(*) FROM jobs WHERE status = 'running' AND kind IN (" +
        in_list(std::vector<std::string>(capped_kinds.begin(), capped_kinds.end())) +
        ") GROUP BY kind, concurrency_key"};
    reads.insert(reads.end(), read_again.begin(), read_again.end());
    std::vector<Result> counts = run_in_trips(tx, reads);
    if (!read_again.empty()) lists[0] = uncapped_of(counts.begin() + 1, counts.end(), r.limit);
    for (const Row& row : counts[0].rows) {
      KindCaps& c = capped[to_str(row[0])];
      int64_t n = to_i64(row[2]);
      c.keys[to_str(row[1])] = n;
      c.total += n;
    }
    // Each kind's heads: per-key capped, the first (cap - running) due jobs of each key with room,
    // one sub-SELECT per key and priority, in statements and round trips of at most kHeadBytes.
    // One statement of them all grew past the server's max_allowed_packet with tens of thousands
    // of keys queued (1153, and no claim of any kind ran again).
    struct KindHeads {
      std::string kind;
      std::vector<std::string> statements;
      std::vector<Row> rows;
    };
    std::vector<KindHeads> heads;
    for (const auto& [kind, c] : capped) {
      int64_t want = limit;
      if (c.global > 0) want = std::min<int64_t>(want, c.global - c.total);
      const auto seek = priority_seeks.find(kind);  // none: no job of the kind is queued
      if (want <= 0 || seek == priority_seeks.end() || seek->second.values().empty()) continue;
      const std::vector<std::string>& priorities = seek->second.values();
      KindHeads h{kind, {}, {}};
      if (c.per_key == 0) {
        h.statements = unions_of(
            due_parts("SELECT id, kind, concurrency_key, priority, run_after_ms, 0 FROM jobs "
                      "WHERE status = 'queued' AND kind = " +
                          quote(kind) + " AND ",
                      priorities, now, want, nullptr),
            want);
      } else {
        std::string sql;
        for (const std::string& key : key_seeks.at(kind).values()) {
          auto it = c.keys.find(key);
          int64_t running = it == c.keys.end() ? 0 : it->second;
          if (running >= c.per_key) continue;
          const std::string prefix =
              Sql("SELECT id, kind, concurrency_key, priority, run_after_ms, ")
              << running << " FROM jobs WHERE status = 'queued' AND kind = " << quote(kind)
              << " AND concurrency_key = " << quote(key) << " AND ";
          for (const std::string& part :
               due_parts(prefix, priorities, now, std::min<int64_t>(c.per_key - running, want),
                         nullptr)) {
            const std::string one = "(" + part + ")";
            if (!sql.empty() && sql.size() + 11 + one.size() > kHeadBytes) {
              h.statements.push_back(std::move(sql));
              sql.clear();
            }
            if (!sql.empty()) sql += " UNION ALL ";
            sql += one;
          }
        }
        if (!sql.empty()) h.statements.push_back(std::move(sql));
        if (h.statements.empty()) continue;
      }
      heads.push_back(std::move(h));
    }
    std::vector<std::string> statements;
    for (const KindHeads& h : heads) {
      statements.insert(statements.end(), h.statements.begin(), h.statements.end());
    }
    std::vector<Result> results = run_in_trips(tx, statements);
    size_t at = 0;
    for (KindHeads& h : heads) {
      for (size_t k = 0; k < h.statements.size(); ++k) {
        for (Row& row : results[at++].rows) h.rows.push_back(std::move(row));
      }
    }
    for (const KindHeads& h : heads) {
      const KindCaps& c = capped[h.kind];
      int64_t want = limit;
      if (c.global > 0) want = std::min<int64_t>(want, c.global - c.total);
      std::vector<Candidate> list = read_candidates(h.rows);
      for (size_t i = 0; i < list.size(); ++i) list[i].load = to_i64(h.rows[i][5]);  // running
      // Fair share applies to per-key caps (load: the key's running jobs, plus the candidates
      // of the key before this one); a global-only cap keeps the claim order. A key's parts
      // (one per priority) may hold more than its room: those past it are left out.
      std::sort(list.begin(), list.end(), claim_order);
      if (c.per_key > 0) {
        std::map<std::string, int64_t> rank;
        std::vector<Candidate> within;
        for (Candidate& candidate : list) {
          candidate.load += rank[candidate.key]++;
          if (candidate.load < c.per_key) within.push_back(std::move(candidate));
        }
        list = std::move(within);
        std::sort(list.begin(), list.end(), fair_order);
      }
      if (static_cast<int64_t>(list.size()) > want) list.resize(static_cast<size_t>(want));
      lists.push_back(std::move(list));
    }
  }
  const bool uncapped_full = lists[0].size() == r.limit;  // more may be queued behind them

  std::vector<Candidate*> chosen = merge_heads(lists, r.limit);
  size_t locked = lock_candidates(tx, chosen, now);
  // Short because other claims hold some of the chosen candidates (read as queued, then skipped by
  // the lock). Their places go to the next free uncapped jobs in claim order: first those read and
  // not chosen (merge_heads gave their places to capped kinds' jobs), then, as those other claims
  // hold the head of the queue, reads past every candidate seen, in longer and longer windows. A
  // locking scan (SKIP LOCKED) would find them too, but it locks and releases every held and
  // delete-marked entry on its way: with three hosts on one server it cost 20 ms a call.
  const auto lock_in_claim_order = [&](const std::vector<Candidate*>& candidates) {
    // In slices in claim order, so that the jobs locked are the first free ones in that order (a
    // lock of the whole window LIMITed took the lowest ids). A slice's free rows past those wanted
    // stay locked, unclaimed, until the commit, and other claims pass them over: a slice grows
    // (twice the last) to at most kSliceSlack rows more than are still wanted.
    size_t slice = r.limit - locked;
    for (size_t at = 0; at < candidates.size() && locked < r.limit;
         at += slice, slice = std::min(slice * 2, r.limit - locked + kSliceSlack)) {
      const std::vector<Candidate*> part(candidates.begin() + static_cast<std::ptrdiff_t>(at),
                                         candidates.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                                  candidates.size(), at + slice)));
      lock_candidates(tx, part, now);
      for (Candidate* c : part) {
        if (!c->row) continue;
        if (locked == r.limit) {
          c->row.reset();
          continue;
        }
        chosen.push_back(c);
        ++locked;
      }
    }
  };
  if (locked < r.limit) {
    const std::set<const Candidate*> taken(chosen.begin(), chosen.end());
    std::vector<Candidate*> passed_over;
    for (Candidate& c : lists[0]) {
      if (!taken.count(&c)) passed_over.push_back(&c);
    }
    lock_in_claim_order(passed_over);
  }
  std::deque<std::vector<Candidate>> more;
  bool full = uncapped_full;
  size_t window = r.limit;
  for (int round = 1; round < kClaimReads && locked < r.limit && full; ++round) {
    window = std::min(window * 2, std::max<size_t>(r.limit, kMaxClaimWindow));
    // After the last job read, not at an OFFSET: the queue's head moves while we claim (jobs
    // enqueued ahead, others' claims committed), and an OFFSET would read some of the jobs of
    // an earlier window again, locked by us already, and hand them out twice.
    const Candidate& last = more.empty() ? lists[0].back() : more.back().back();
    const std::vector<Result> read =
        run_in_trips(tx, uncapped_candidates(now, plan, static_cast<int64_t>(window), &last));
    more.push_back(uncapped_of(read.begin(), read.end(), window));
    full = more.back().size() == window;
    std::vector<Candidate*> next;
    for (Candidate& c : more.back()) next.push_back(&c);
    lock_in_claim_order(next);
  }

  // Deal the locked jobs out, round robin over the calls.
  const std::string prefix = random_hex(16) + ".";
  std::vector<size_t> left;
  for (ClaimOp* op : ops) left.push_back(op->request.limit);
  std::vector<std::pair<JobId, std::string>> owners, expiries, starts;
  std::vector<JobId> ids;
  Writes w;
  size_t next = 0;
  for (Candidate* c : chosen) {
    if (!c->row) continue;
    for (size_t k = 0; k < ops.size(); ++k) {
      size_t i = (next + k) % ops.size();
      const ClaimRequest& request = ops[i]->request;
      if (left[i] == 0 || request.now_ms < c->run_after) continue;
      --left[i];
      next = i + 1;
      Claimed one;
      one.job = std::move(*c->row);
      one.lease_token = prefix + std::to_string(one.job.id);
      one.lease_expires_ms = later_by(request.now_ms, request.lease_ms);
      one.job.status = JobStatus::kRunning;
      one.job.attempts += 1;
      one.job.lease_owner = owner_key(request.owner);
      one.job.lease_token = one.lease_token;
      one.job.lease_expires_ms = one.lease_expires_ms;
      one.job.started_ms = request.now_ms;
      one.job.updated_ms = request.now_ms;
      ids.push_back(one.job.id);
      owners.emplace_back(one.job.id, std::to_string(ops[i]->owner_id));
      expiries.emplace_back(one.job.id, std::to_string(one.lease_expires_ms));
      starts.emplace_back(one.job.id, std::to_string(request.now_ms));
      w.running(one.job.kind, one.job.concurrency_key, 1);
      ops[i]->result.push_back(std::move(one));
      break;
    }
  }
  if (ids.empty()) {
    tx.commit();
    return;
  }
  std::string list = id_list(ids);
  // attempt_no before attempts: it reads attempts before that is assigned, under MySQL's
  // left-to-right and MariaDB's simultaneous assignment alike. No attempt row yet (schema 0002).
  w.push_back(
      "UPDATE jobs SET status = 'running', attempt_no = attempts + 1, "
      "attempts = attempts + 1, owner_id = " +
      per_id("id", owners) + ", lease_token = CONCAT(" + quote(prefix) +
      ", id), lease_expires_ms = " + per_id("id", expiries) +
      ", started_ms = " + per_id("id", starts) + ", updated_ms = " + per_id("id", starts) +
      " WHERE id IN (" + list + ")");
  w.commit(tx);
}

// One complete() call waiting for a group commit. Any two merge.
struct CompleteOp {
  JobId id;
  const std::string& token;
  const std::string& result;
  int64_t now;
  std::exception_ptr error;
  bool done = false;
  size_t bytes() const { return result.size() + token.size() + 64; }
  bool merges_with(const CompleteOp&) const { return true; }
};

// complete_jobs' checks and writes, on rows the caller has locked (`states`). The jobs it
// completes are marked succeeded in `states`, for what the same transaction does next.
void complete_locked(Writes& w, const std::vector<CompleteOp*>& ops,
                     std::map<JobId, JobState>& states) {
  for (CompleteOp* op : ops) op->error = nullptr;  // the body may run again after a deadlock
  std::vector<std::pair<const CompleteOp*, const JobState*>> valid;
  std::set<JobId> taken;
  for (CompleteOp* op : ops) {
    std::string job = "job " + std::to_string(op->id);
    auto it = states.find(op->id);
    if (it == states.end()) {
      op->error = std::make_exception_ptr(LeaseLost(job + " no longer exists"));
    } else if (it->second.status != JobStatus::kRunning || taken.count(op->id)) {
      JobStatus status = taken.count(op->id) ? JobStatus::kSucceeded : it->second.status;
      op->error = std::make_exception_ptr(
          LeaseLost(job + " is " + std::string(to_string(status)) + ", not running"));
    } else if (it->second.token != op->token) {
      op->error =
          std::make_exception_ptr(LeaseLost(job + ": the lease was taken over (token mismatch)"));
    } else {
      taken.insert(op->id);
      valid.emplace_back(op, &it->second);
    }
  }
  if (valid.empty()) return;
  std::vector<JobId> done;
  std::vector<std::pair<JobId, std::string>> results, nows;
  std::map<JobId, std::pair<int, int64_t>> parents;  // children that finished, latest clock
  for (const auto& [op, s] : valid) {
    done.push_back(s->id);
    results.emplace_back(s->id, quote(op->result));
    nows.emplace_back(s->id, std::to_string(op->now));
    w.running(s->kind, s->key, -1);
    if (s->dead_letter_id) {
      w.push_back(Sql("UPDATE dead_letters SET status = 'resolved', updated_ms = ")
                  << op->now << " WHERE id = " << *s->dead_letter_id << " AND status = 'retrying'");
    }
    if (s->parent_id && s->counted_in_parent) {
      auto& [n, latest] = parents[*s->parent_id];
      ++n;
      latest = std::max(latest, op->now);
    }
  }
  std::string list = id_list(done);
  // The attempts' rows, from the job rows before the UPDATE below (see end_attempt).
  w.push_back(attempt_rows(per_id("id", nows), "'succeeded'", "NULL", "id IN (" + list + ")",
                           per_id("id", results)));
  w.push_back("UPDATE jobs SET status = 'succeeded', finished_ms = " + per_id("id", nows) +
              ", updated_ms = " + per_id("id", nows) +
              ", owner_id = 0, lease_token = '', lease_expires_ms = 0, "
              "active_dedupe_key = NULL, counted_in_parent = 0 WHERE id IN (" +
              list + ")");
  for (const auto& [parent, counted] : parents) {
    w.push_back(uncount_children(parent, counted.first, counted.second));
  }
  for (JobId id : done) states[id].status = JobStatus::kSucceeded;
}

// Completes the ops' jobs in one transaction with set-based statements. An op whose lease does
// not hold gets LeaseLost (and changes nothing); the others succeed.
void complete_jobs(Tx& tx, const std::vector<CompleteOp*>& ops) {
  std::vector<JobId> ids;
  for (CompleteOp* op : ops) ids.push_back(op->id);
  std::map<JobId, JobState> states = lock_states(tx, ids);
  Writes w;
  complete_locked(w, ops, states);
  w.commit(tx);
}

// --- producing -----------------------------------------------------------------------------

// Statement size per multi-row INSERT: well under the server's max_allowed_packet (16 MiB by
// default).
constexpr size_t kInsertChunkBytes = 4u << 20;
constexpr size_t kInsertChunkRows = 1000;

// How many of `n` rows (1..kInsertChunkRows) one INSERT takes: all of a full chunk, else the
// largest power of two, so that a session prepares at most 11 INSERT texts.
size_t insert_width(size_t n) {
  if (n >= kInsertChunkRows) return kInsertChunkRows;
  size_t width = 1;
  while (width * 2 <= n) width *= 2;
  return width;
}

// INSERT INTO jobs with `width` rows of '?' (the order of enqueue_jobs' params).
std::string insert_jobs_sql(size_t width) {
  std::string sql =
      "INSERT INTO jobs (kind, concurrency_key, dedupe_key, active_dedupe_key, status, priority, "
      "max_attempts, run_after_ms, parent_id, counted_in_parent, timeout_ms, created_ms, "
      "updated_ms, payload) VALUES ";
  for (size_t i = 0; i < width; ++i) {
    sql += i ? ", (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)"
             : "(?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)";
  }
  return sql;
}

std::vector<EnqueueResult> enqueue_jobs(Tx& tx, const std::vector<JobSpec>& specs, int64_t now) {
  const size_t n = specs.size();
  std::vector<EnqueueResult> results(n);
  std::vector<bool> settled(n, false);
  std::vector<size_t> same_as(n, SIZE_MAX);  // an earlier spec of this batch with the same key

  // 1. Active jobs with the same (kind, dedupe_key), and repeats within the batch.
  std::map<std::pair<std::string, std::string>, size_t> first;
  std::vector<std::string> conditions;
  for (size_t i = 0; i < n; ++i) {
    if (!specs[i].dedupe_key) continue;
    auto [it, inserted] = first.emplace(std::make_pair(specs[i].kind, *specs[i].dedupe_key), i);
    if (!inserted) {
      same_as[i] = it->second;
      continue;
    }
    conditions.push_back(Sql("(kind = ").str(specs[i].kind)
                         << " AND active_dedupe_key = " << quote(*specs[i].dedupe_key) << ")");
  }
  for (size_t begin = 0; begin < conditions.size(); begin += 500) {
    std::string sql = "SELECT id, kind, active_dedupe_key FROM jobs WHERE ";
    for (size_t i = begin; i < std::min(conditions.size(), begin + 500); ++i) {
      if (i > begin) sql += " OR ";
      sql += conditions[i];
    }
    for (const Row& row : tx.one(sql).rows) {
      auto it = first.find({to_str(row[1]), to_str(row[2])});
      if (it == first.end()) continue;
      results[it->second] = {to_i64(row[0]), false};
      settled[it->second] = true;
    }
  }

  // 2. Parents: a child counts in an active parent; a missing parent fails the batch.
  std::map<JobId, int> children;
  for (size_t i = 0; i < n; ++i) {
    if (!settled[i] && same_as[i] == SIZE_MAX && specs[i].parent_id) {
      ++children[*specs[i].parent_id];
    }
  }
  std::set<JobId> counting;
  if (!children.empty()) {
    std::vector<std::string> updates;
    for (const auto& [parent, k] : children) {
      updates.push_back(Sql("UPDATE jobs SET pending_children = pending_children + ")
                        << k << ", updated_ms = " << now << " WHERE id = " << parent
                        << " AND status IN " << kActive);
    }
    std::vector<Result> updated = tx.run(updates);
    std::vector<JobId> inactive;
    size_t i = 0;
    for (const auto& [parent, k] : children) {
      if (updated[i++].affected > 0) {
        counting.insert(parent);
      } else {
        inactive.push_back(parent);
      }
    }
    if (!inactive.empty()) {
      std::set<JobId> existing;
      for (const Row& row :
           tx.one("SELECT id FROM jobs WHERE id IN (" + id_list(inactive) + ")").rows) {
        existing.insert(to_i64(row[0]));
      }
      for (JobId parent : inactive) {
        if (!existing.count(parent)) {
          throw JobNotFound("parent job " + std::to_string(parent) + " not found");
        }
      }
    }
  }

  // 3. The new rows, in multi-row INSERTs, prepared: the payloads go as they are, and the
  // server parses no literal (a text INSERT of 1000 jobs spends about half its time parsing).
  std::vector<size_t> rows;
  for (size_t i = 0; i < n; ++i) {
    if (!settled[i] && same_as[i] == SIZE_MAX) rows.push_back(i);
  }
  // The ids of a multi-row INSERT are insert_id, insert_id + step, ... with this session's
  // auto_increment_increment as the step, when innodb_autoinc_lock_mode is 0 or 1 (in mode 2 they
  // are not guaranteed consecutive, and each row goes alone). Both are read here, not once when
  // the store opened: the step may have changed since (an operator's SET GLOBAL, a Galera cluster
  // resizing), and a session opened later uses the new one; the mode, after a server restart.
  bool consecutive_ids = false;
  int64_t step = 1;
  if (rows.size() > 1) {
    const Row row =
        tx.one("SELECT @@SESSION.auto_increment_increment, @@innodb_autoinc_lock_mode").rows.at(0);
    step = std::max<int64_t>(to_i64(row.at(0)), 1);
    consecutive_ids = to_i64(row.at(1)) != 2;
  }
  std::vector<Param> params;
  size_t at = 0;
  while (at < rows.size()) {
    const size_t begin = at;
    size_t bytes = 0;
    while (at < rows.size() && at - begin < (consecutive_ids ? kInsertChunkRows : 1) &&
           (at == begin || bytes < kInsertChunkBytes)) {
      const JobSpec& s = specs[rows[at]];
      bytes += s.payload.size() + s.kind.size() + s.concurrency_key.size() + 64;
      ++at;
    }
    at = begin + insert_width(at - begin);
    params.clear();
    for (size_t i = begin; i < at; ++i) {
      const JobSpec& s = specs[rows[i]];
      const bool counted = s.parent_id && counting.count(*s.parent_id);
      params.insert(
          params.end(),
          {Param::of(s.kind), Param::of(s.concurrency_key), Param::of(s.dedupe_key),
           Param::of(s.dedupe_key), Param::of(s.priority), Param::of(s.max_attempts),
           Param::of(s.run_after_ms > 0 ? s.run_after_ms : now),
           s.parent_id ? Param::of(*s.parent_id) : Param::null(), Param::of(counted ? 1 : 0),
           Param::of(s.timeout_ms), Param::of(now), Param::of(now), Param::of(s.payload)});
    }
    Result inserted;
    try {
      inserted = tx.execute(insert_jobs_sql(at - begin), params);
    } catch (const mysql::Error& e) {
      // Another transaction made a job with one of our dedupe keys active after our read: start
      // over, and the read will find it.
      if (e.duplicate_key()) throw mysql::RetryTransaction("dedupe race: " + std::string(e.what()));
      throw;
    }
    for (size_t i = begin; i < at; ++i) {
      results[rows[i]] = {
          static_cast<JobId>(inserted.insert_id) + static_cast<JobId>(i - begin) * step, true};
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (same_as[i] != SIZE_MAX) results[i] = {results[same_as[i]].id, false};
  }
  return results;
}

// Adds a retried child to an active parent's count. A missing or finished parent waits for
// nothing: the child simply runs.
bool count_child(Tx& tx, JobId parent, int64_t now) {
  Result r = tx.one(Sql("UPDATE jobs SET pending_children = pending_children + 1, updated_ms = ")
                    << now << " WHERE id = " << parent << " AND status IN " << kActive);
  return r.affected > 0;
}

// --- recovery ------------------------------------------------------------------------------

constexpr int kSweepChunk = 500;
constexpr int kPruneChunk = 1000;

// The expired leases of one sweep (or start-up recovery) pass, and what the pass did.
struct Expiry {
  SweepResult result;
  // Requeued jobs that have a parent: a parent's cancellation later in the same pass may end
  // them, and then they were not requeued after all (see counted()).
  std::vector<JobId> requeued_children;

  // The pass's result, counting as requeued only the jobs it left queued.
  SweepResult counted(Tx& tx, Writes& w) {
    if (!requeued_children.empty()) {
      Result ended = read_after(tx, w,
                                Sql("SELECT COUNT(*) FROM jobs WHERE id IN (")
                                    << id_list(requeued_children) << ") AND status <> 'queued'");
      result.requeued -= to_int(ended.rows.at(0).at(0));
    }
    return result;
  }
};

// An expired lease: the worker crashed or hung. The attempt counts.
void expire_lease(Tx& tx, Writes& w, const JobState& read, int64_t now, Expiry& pass) {
  const JobState s = w.current(read);  // a parent expired before it may have asked it to stop
  const std::string expired = "lease expired (worker crashed or hung)";
  end_attempt(w, s, "lease_expired", expired, now);
  if (s.attempts >= s.max_attempts) {  // would not requeue: dies even if cancel was requested
    mark_dead(
        tx, w, s,
        "lease expired after " + std::to_string(s.attempts) + " attempts (worker crashed or hung)",
        now);
    ++pass.result.dead;
  } else if (s.cancel_requested) {
    mark_cancelled(tx, w, s, 0, expired, now);
  } else {
    requeue(w, s, now, 0, expired, now);
    ++pass.result.requeued;
    if (s.parent_id) pass.requeued_children.push_back(s.id);
  }
}

// --- the store -----------------------------------------------------------------------------

template <class T>
T first_or(const Result& r, T fallback) {
  if (r.rows.empty() || r.rows[0].empty() || !r.rows[0][0]) return fallback;
  if constexpr (std::is_same_v<T, int>) {
    return to_int(r.rows[0][0]);
  } else {
    return static_cast<T>(to_i64(r.rows[0][0]));
  }
}

mysql::Config store_config(const std::string& connection_string) {
  mysql::Config config = mysql::parse_config(connection_string);
  if (config.db.empty()) throw ConfigError("mysql connection string: db= is required");
  return config;
}

// The circuit record `name` (circuit_sql, then read_circuit on its result): closed when absent.
std::string circuit_sql(const std::string& name) {
  return "SELECT state, failures, opened_ms, retry_at_ms, updated_ms FROM circuits WHERE name = " +
         quote(name);
}

CircuitRecord read_circuit(const Result& r) {
  if (r.rows.empty()) return {};
  const Row& row = r.rows[0];
  return {to_str(row[0]), to_int(row[1]), to_i64(row[2]), to_i64(row[3]), to_i64(row[4])};
}

class MysqlStore final : public JobStore {
 public:
  MysqlStore(const std::string& connection_string, size_t pool_size, bool migrate_now)
      : pool_(store_config(connection_string), pool_size),
        pool_size_(std::max<size_t>(pool_size, 1)) {
    if (migrate_now) migrate();
  }

  SchemaVersions apply_migrations() override;
  std::string backend() const override { return "mysql"; }

  EnqueueResult enqueue(const JobSpec& spec, int64_t now_ms) override {
    return enqueue_batch({spec}, now_ms).front();
  }
  std::vector<EnqueueResult> enqueue_batch(const std::vector<JobSpec>& specs,
                                           int64_t now_ms) override {
    check_specs(specs);
    if (specs.empty()) return {};
    using Made = std::vector<EnqueueResult>;
    Made results = transact_settled<Made>(
        "enqueue",
        [&](Tx& tx, std::optional<Made>& done) { done = enqueue_jobs(tx, specs, now_ms); },
        [&](const Made& made) { return enqueued(specs, made, now_ms); });
    notify_runnable();
    return results;
  }

  // Group-committed: concurrent claims with the same kinds and lease length share a transaction.
  std::vector<Claimed> claim(const ClaimRequest& request) override {
    check_lease_ms("claim", request.lease_ms);
    if (request.limit == 0) return {};
    release_unsettled_claims(request.now_ms);
    ClaimOp op{request, owner_id(request.owner), {}, nullptr, false};
    claims_.submit(op, [&](std::vector<ClaimOp*>& batch) {
      // A failed claim changed nothing durable that matters (at worst leases that expire): every
      // op gets the error, and the callers claim again later. One whose COMMIT applied but whose
      // reply was lost returns its jobs: else they would sit leased to nobody until the sweep
      // took them back, counting an attempt that never ran. When that cannot be told (the server
      // is gone), its jobs are released by a later claim.
      try {
        transact("claim", [&](Tx& tx) { claim_jobs(tx, batch, hints_, hint_mutex_); });
      } catch (const mysql::CommitUnknown&) {
        const std::optional<bool> committed = claim_committed(batch);
        if (committed == true) return;
        if (!committed) remember_unsettled(batch);
        for (ClaimOp* o : batch) o->error = std::current_exception();
      } catch (...) {
        for (ClaimOp* o : batch) o->error = std::current_exception();
      }
    });
    if (op.error) std::rethrow_exception(op.error);
    return std::move(op.result);
  }

  // The jobs of claims whose outcome is unknown, to hand back: released under their tokens (no
  // attempt counted) if the claim applied; LeaseLost, and forgotten, if it did not.
  void remember_unsettled(const std::vector<ClaimOp*>& ops) {
    std::lock_guard lock(unsettled_mutex_);
    for (const ClaimOp* op : ops) {
      for (const Claimed& c : op->result) {
        Finish f;
        f.kind = Finish::Kind::kRelease;
        f.id = c.job.id;
        f.token = c.lease_token;
        unsettled_claims_.push_back(std::move(f));
      }
    }
  }
  void release_unsettled_claims(int64_t now_ms) {
    std::vector<Finish> items;
    {
      std::lock_guard lock(unsettled_mutex_);
      items.swap(unsettled_claims_);
    }
    if (items.empty()) return;
    std::vector<Finish> again;
    try {
      std::vector<FinishResult> results = finish(items, now_ms);
      for (size_t i = 0; i < items.size() && i < results.size(); ++i) {
        if (results[i].retryable) again.push_back(std::move(items[i]));
      }
    } catch (const std::exception&) {
      again = std::move(items);
    }
    std::lock_guard lock(unsettled_mutex_);
    for (Finish& f : again) unsettled_claims_.push_back(std::move(f));
  }

  HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                            const std::optional<std::string>& checkpoint, bool progress) override {
    check_lease_ms("heartbeat", lease_ms);
    if (checkpoint) check_text("heartbeat: checkpoint", *checkpoint);
    // A row held through one lock wait (50 s by default, often more than the lease) is not waited
    // for again: the scheduler beats the job again half an interval later, after the others, and a
    // second wait would hold a heartbeat lane and a pooled connection as long again. (A handler's
    // checkpoint gets the error: its attempt fails, to resume from the last checkpoint stored.)
    mysql::RetryLimits once;
    once.lock_waits = 1;
    return transact(
        "heartbeat",
        [&](Tx& tx) {
          JobState s = lock_running(tx, id, token);
          HeartbeatResult result{later_by(now_ms, lease_ms), s.cancel_requested};
          Sql sql("UPDATE jobs SET lease_expires_ms = ");
          sql << result.lease_expires_ms << ", updated_ms = " << now_ms;
          // Progress: the running attempt is the first since it (see JobStore::heartbeat).
          if (checkpoint) sql << ", checkpoint = " << quote(*checkpoint);
          if (checkpoint && progress) sql << ", attempts = 1";
          sql << " WHERE id = " << id;
          tx.commit({std::move(sql)});
          return result;
        },
        once);
  }

  // Group-committed: concurrent completions share a transaction (set-based statements).
  void complete(JobId id, const std::string& token, const std::string& result_json,
                int64_t now_ms) override {
    check_text("complete: result", result_json);
    CompleteOp op{id, token, result_json, now_ms, nullptr, false};
    completions_.submit(op, [&](std::vector<CompleteOp*>& batch) {
      std::vector<CompleteOp*> unsettled = batch;
      settle_unsettled_completions(unsettled);
      complete_batch(unsettled);
    });
    if (op.error) std::rethrow_exception(op.error);
  }

  // Completes `batch` in one transaction. Should that fail, each op alone: the failure may be one
  // op's doing (say, a result too large), and only that one fails. A transaction whose COMMIT
  // applied but whose reply was lost is not run again: the outcomes its body recorded stand.
  void complete_batch(const std::vector<CompleteOp*>& batch) {
    if (batch.empty()) return;
    std::exception_ptr error;
    try {
      transact("complete", [&](Tx& tx) { complete_jobs(tx, batch); });
      return;
    } catch (const mysql::CommitUnknown&) {
      if (committed_after_all(batch, {}, {})) return;
      error = std::current_exception();
    } catch (...) {
      error = std::current_exception();
    }
    if (batch.size() == 1) {
      batch.front()->error = error;
      return;
    }
    for (CompleteOp* o : batch) {
      try {
        if (settled_outcome(o->id, o->token)) continue;  // applied after all
        transact("complete", [&](Tx& tx) { complete_jobs(tx, {o}); });
      } catch (...) {
        o->error = std::current_exception();
      }
    }
  }

  // Completions share one set-based transaction (as concurrent complete() calls do); the other
  // endings, rarer, take one transaction each.
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    std::vector<FinishResult> results(items.size());
    std::vector<CompleteOp> ops;
    std::vector<size_t> op_item;
    ops.reserve(items.size());
    // Each job's first item, when it completes (ops), fails, defers or releases (ends), is
    // batched: those are distinct jobs. The rest -- waiting for children, a job's later items --
    // go one by one afterwards, in order, as they would one call after the other.
    std::vector<Finish> others;
    std::vector<size_t> other_item;
    others.reserve(items.size());  // `ends` points into it
    std::vector<const Finish*> ends;
    std::vector<size_t> end_item;
    std::vector<size_t> rest_item;
    std::set<JobId> seen;
    for (size_t i = 0; i < items.size(); ++i) {
      const Finish& f = items[i];
      if (auto problem = finish_item_problem(f)) {
        results[i].error = *problem;
        continue;
      }
      const bool first = seen.insert(f.id).second;
      if (first && f.kind == Finish::Kind::kComplete) {
        ops.push_back({f.id, f.token, f.result_json, now_ms, nullptr, false});
        op_item.push_back(i);
        continue;
      }
      if (first && f.kind != Finish::Kind::kWaitForChildren) {  // batched below: settled here
        try {
          if (std::optional<JobStatus> applied = settled_outcome(f.id, f.token)) {
            results[i].status = *applied;
            continue;
          }
        } catch (...) {
          results[i] = finish_failure(std::current_exception());
          continue;
        }
      }
      others.push_back(f);
      other_item.push_back(i);
      if (first && f.kind != Finish::Kind::kWaitForChildren) {
        ends.push_back(&others.back());
        end_item.push_back(i);
      } else {
        rest_item.push_back(i);
      }
    }
    std::vector<CompleteOp*> batch;
    for (CompleteOp& op : ops) batch.push_back(&op);
    settle_unsettled_completions(batch);
    std::set<size_t> settled;  // items of `ends` settled by settle_unsettled_ends: they run no more
    std::vector<FinishResult> end_results;
    bool completed = batch.empty();
    bool ended = ends.empty();
    // Both kinds in one transaction when there are both; should it fail, each batch is tried on
    // its own, and then each item.
    if (!completed && !ended) {
      try {
        transact("finish", [&](Tx& tx) { finish_together(tx, batch, ends, end_results, now_ms); });
        completed = ended = true;
      } catch (const mysql::CommitUnknown&) {
        // Committed after all: the outcomes the body recorded stand (re-run, the items would
        // find their jobs ended and report their leases lost).
        completed = ended = committed_after_all(batch, ends, end_results);
        if (!completed) {  // that could not be read: each item is settled before it runs again
          settle_unsettled_completions(batch);
          settle_unsettled_ends(ends, end_item, results, settled);
          completed = batch.empty();
          ended = ends.empty();
        }
      } catch (const std::exception&) {
      }
    }
    if (!completed) complete_batch(batch);
    for (size_t k = 0; k < ops.size(); ++k) {
      FinishResult& r = results[op_item[k]];
      if (ops[k].error) {
        r = finish_failure(ops[k].error);
      } else {
        r.status = JobStatus::kSucceeded;
      }
    }
    if (!ended) {
      try {
        transact("finish", [&](Tx& tx) { end_jobs(tx, ends, end_results, now_ms); });
        ended = true;
      } catch (const mysql::CommitUnknown&) {
        ended = committed_after_all({}, ends, end_results);
        if (!ended) {
          settle_unsettled_ends(ends, end_item, results, settled);
          ended = ends.empty();
        }
      } catch (const std::exception&) {  // each again on its own below, with its own error
      }
    }
    if (ended) {
      for (size_t k = 0; k < ends.size(); ++k) results[end_item[k]] = end_results[k];
      std::vector<Finish> rest;
      for (size_t index : rest_item) rest.push_back(items[index]);
      others = std::move(rest);
      other_item = std::move(rest_item);
    }
    // The other endings take one transaction each; run side by side on the pool's connections
    // so that InnoDB commits them together (its own group commit) instead of one fsync apiece.
    if (!others.empty()) {
      const size_t lanes = std::min(others.size(), pool_size_);
      std::vector<std::vector<Finish>> lane_items(lanes);
      std::vector<std::vector<size_t>> lane_index(lanes);
      for (size_t k = 0; k < others.size(); ++k) {  // a job's items share a lane, in order
        if (settled.count(other_item[k])) continue;
        const size_t lane = static_cast<size_t>(others[k].id) % lanes;
        lane_items[lane].push_back(std::move(others[k]));
        lane_index[lane].push_back(other_item[k]);
      }
      std::vector<std::vector<FinishResult>> lane_results(lanes);
      // A lane's error (the store failing) is rethrown here once every lane is done: thrown in a
      // thread it was std::terminate. A thread that cannot be had runs its lane here.
      std::vector<std::exception_ptr> lane_errors(lanes);
      auto run_lane = [&](size_t lane) {
        try {
          lane_results[lane] = JobStore::finish(lane_items[lane], now_ms);
        } catch (...) {
          lane_errors[lane] = std::current_exception();
        }
      };
      std::vector<std::thread> threads;
      std::vector<size_t> here = {0};
      for (size_t lane = 1; lane < lanes; ++lane) {
        try {
          threads.emplace_back(run_lane, lane);
        } catch (const std::system_error&) {
          here.push_back(lane);
        }
      }
      for (size_t lane : here) run_lane(lane);
      for (std::thread& t : threads) t.join();
      for (const std::exception_ptr& error : lane_errors) {
        if (error) std::rethrow_exception(error);
      }
      for (size_t lane = 0; lane < lanes; ++lane) {
        for (size_t k = 0; k < lane_results[lane].size(); ++k)
          results[lane_index[lane][k]] = std::move(lane_results[lane][k]);
      }
    }
    return results;
  }

  JobStatus fail(JobId id, const std::string& token, const Failure& failure,
                 int64_t now_ms) override {
    return end_attempt_tx("fail", id, token, [&](Tx& tx, Writes& w) {
      return fail_locked(tx, w, lock_running(tx, id, token), failure, now_ms);
    });
  }
  // Runs transaction `what`, whose body ends job `id`'s attempt under lease `token` (its writes
  // in `w`, committed here) and returns where the job went. A COMMIT whose reply was lost is
  // told by the attempt row it wrote: when that is there, the body's outcome stands (run again,
  // the call would find its lease lost).
  template <class Body>
  JobStatus end_attempt_tx(const char* what, JobId id, const std::string& token, Body&& body) {
    if (std::optional<JobStatus> applied = settled_outcome(id, token)) return *applied;
    std::optional<JobStatus> outcome;
    try {
      return transact(what, [&](Tx& tx) {
        outcome.reset();
        Writes w;
        const JobStatus status = body(tx, w);
        outcome = status;
        w.commit(tx);
        return status;
      });
    } catch (const mysql::CommitUnknown&) {
      if (!outcome) throw;
      const std::optional<bool> committed = attempt_ended(id, token);
      if (committed == true) return *outcome;
      if (!committed) {
        std::lock_guard lock(unsettled_mutex_);
        unsettled_endings_.emplace(std::pair(id, token), *outcome);
      }
      throw;
    }
  }
  static JobStatus fail_locked(Tx& tx, Writes& w, const JobState& s, const Failure& failure,
                               int64_t now) {
    end_attempt(w, s, failure.fatal ? "fatal" : "failed", failure.error, now);
    const JobStatus next = after_failure(failure, s.attempts, s.max_attempts, s.cancel_requested);
    if (next == JobStatus::kDead) {
      mark_dead(tx, w, s, failure.error, now);
    } else if (next == JobStatus::kCancelled) {
      mark_cancelled(tx, w, s, 0, failure.error, now);
    } else {
      requeue(w, s, later_by(now, failure.retry_delay_ms), 0, failure.error, now);
    }
    return next;
  }

  void defer(JobId id, const std::string& token, int64_t run_after_ms, const std::string& reason,
             int64_t now_ms) override {
    return_job(id, token, run_after_ms, "deferred", reason, now_ms);
  }
  void release(JobId id, const std::string& token, int64_t now_ms) override {
    return_job(id, token, now_ms, "released", std::nullopt, now_ms);
  }

  void wait_for_children(JobId id, const std::string& token, int64_t deadline_ms,
                         const std::optional<std::string>& checkpoint, int64_t now_ms) override {
    if (checkpoint) check_text("wait_for_children: checkpoint", *checkpoint);
    end_attempt_tx("wait_for_children", id, token, [&](Tx& tx, Writes& w) {
      JobState s = lock_running(tx, id, token);
      if (s.cancel_requested) {
        end_attempt(w, s, "cancelled", std::nullopt, now_ms);
        mark_cancelled(tx, w, s, 1, std::nullopt, now_ms);
        return JobStatus::kCancelled;
      }
      end_attempt(w, s, "waiting", std::nullopt, now_ms);
      // pending_children is read under our lock, and a child's terminal transaction locks this
      // row to decrement it: no wake-up is lost between the two.
      bool wait = s.pending_children > 0;
      Sql sql("UPDATE jobs SET status = ");
      sql << (wait ? "'waiting'" : "'queued'")
          << ", wait_deadline_ms = " << (wait ? deadline_ms : 0) << ", run_after_ms = "
          << (wait ? std::string("run_after_ms") : std::to_string(now_ms))
          // A checkpoint is progress (as in heartbeat()): no attempt before it counts any more.
          << ", attempts = " << (checkpoint ? "0" : "GREATEST(attempts - 1, 0)")
          << ", owner_id = 0, lease_token = '', lease_expires_ms = 0, updated_ms = " << now_ms;
      if (checkpoint) sql << ", checkpoint = " << quote(*checkpoint);
      sql << " WHERE id = " << id;
      w.push_back(std::move(sql));
      return wait ? JobStatus::kWaiting : JobStatus::kQueued;
    });
  }

  SweepResult recover_owner(const std::string& owner, int64_t now_ms) override {
    return transact("recover_owner", [&](Tx& tx) {
      Expiry pass;
      Writes w;
      Result owned =
          read_after(tx, w,
                     Sql("SELECT ")
                             .raw(kStateColumns)
                             .raw(" FROM jobs WHERE status = 'running' AND owner_id = (SELECT "
                                  "id FROM lease_owners WHERE name = ")
                         << quote(owner_key(owner)) << ") ORDER BY id FOR UPDATE");
      for (const Row& row : owned.rows) expire_lease(tx, w, read_state(row), now_ms, pass);
      const SweepResult result = pass.counted(tx, w);
      w.commit(tx);
      return result;
    });
  }

  SweepResult sweep(int64_t now_ms) override {
    return transact("sweep", [&](Tx& tx) {
      Expiry pass;
      Writes w;
      while (true) {
        Result expired =
            read_after(tx, w,
                       Sql("SELECT ")
                               .raw(kStateColumns)
                               .raw(" FROM jobs WHERE status = 'running' AND lease_expires_ms <= ")
                           << now_ms << " ORDER BY lease_expires_ms, id LIMIT " << kSweepChunk
                           << " FOR UPDATE SKIP LOCKED");
        for (const Row& row : expired.rows) expire_lease(tx, w, read_state(row), now_ms, pass);
        if (expired.rows.size() < static_cast<size_t>(kSweepChunk)) break;
      }
      // Waiting parents past their deadline. A plain UPDATE, not SKIP LOCKED: it waits for a
      // concurrent sweep's lock and then re-reads the row, so each parent is woken exactly once
      // and none is left for a later sweep. Every sweep locks parents in the same index order.
      Result woken =
          read_after(tx, w,
                     Sql("UPDATE jobs SET status = 'queued', run_after_ms = ")
                         << now_ms << ", wait_deadline_ms = 0, updated_ms = " << now_ms
                         << " WHERE status = 'waiting' AND wait_deadline_ms <= " << now_ms);
      pass.result.parents_woken = static_cast<int>(woken.affected);
      const SweepResult result = pass.counted(tx, w);
      w.commit(tx);
      return result;
    });
  }

  // Deletes in chunks of kPruneChunk jobs, each its own transaction, so that a large retention
  // pass never holds thousands of row locks or a huge undo log at once.
  using JobStore::prune;
  int64_t prune(int64_t finished_before_ms, int64_t max_jobs) override {
    int64_t total = 0;
    for (int64_t looked_at = 0; looked_at < max_jobs;) {
      const int64_t chunk = std::min<int64_t>(kPruneChunk, max_jobs - looked_at);
      auto [found, deleted] = transact("prune", [&](Tx& tx) {
        // finished_ms > 0 keeps the range off the index's 0 entries, every active job (a
        // terminal job at 0 is never before the cutoff: JobStore::prune).
        Result candidates = tx.one(
            Sql("SELECT j.id FROM jobs j WHERE j.finished_ms > 0 AND j.finished_ms < ")
            << finished_before_ms
            << " AND j.status IN ('succeeded', 'cancelled', 'dead') AND (j.status <> 'dead' OR "
               "NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.job_id = j.id AND d.status IN "
               "('pending', 'retrying'))) ORDER BY j.finished_ms, j.id LIMIT "
            << chunk);
        if (candidates.rows.empty()) return std::pair<size_t, int64_t>{0, 0};
        std::vector<JobId> ids;
        for (const Row& row : candidates.rows) ids.push_back(to_i64(row[0]));
        // Re-checked under the row locks: a dead job retried meanwhile is active again.
        Result locked = tx.one(Sql("SELECT id FROM jobs WHERE id IN (")
                               << id_list(ids)
                               << ") AND status IN ('succeeded', 'cancelled', 'dead') AND "
                                  "finished_ms > 0 AND finished_ms < "
                               << finished_before_ms << " FOR UPDATE");
        std::vector<JobId> doomed;
        for (const Row& row : locked.rows) doomed.push_back(to_i64(row[0]));
        if (!doomed.empty()) {
          // A dead job's letter, re-read now that its row is locked: one that was retried and
          // died again since the read above has a pending letter and stays. (The letter becomes
          // pending only together with a change of the job row, which our lock now excludes.)
          std::set<JobId> open;
          for (const Row& row : tx.one("SELECT job_id FROM dead_letters WHERE job_id IN (" +
                                       id_list(doomed) + ") AND status IN ('pending', 'retrying')")
                                    .rows) {
            open.insert(to_i64(row[0]));
          }
          std::erase_if(doomed, [&](JobId id) { return open.count(id) > 0; });
        }
        if (!doomed.empty()) {
          // Children that stay (still active, or finished after the cutoff) lose their parent,
          // as SQLite's ON DELETE SET NULL does: no parent_id names a job that is gone.
          std::string list = id_list(doomed);
          tx.commit({"DELETE FROM job_attempts WHERE job_id IN (" + list + ")",
                     "DELETE FROM jobs WHERE id IN (" + list + ")",
                     "UPDATE jobs SET parent_id = NULL WHERE parent_id IN (" + list + ")"});
        }
        return std::pair<size_t, int64_t>{ids.size(), static_cast<int64_t>(doomed.size())};
      });
      total += deleted;
      looked_at += static_cast<int64_t>(found);
      if (found < static_cast<size_t>(chunk)) break;
    }
    return total;
  }

  CancelOutcome cancel(JobId id, int64_t now_ms) override {
    return transact("cancel", [&](Tx& tx) {
      Writes w;
      CancelOutcome outcome = cancel_job(tx, w, id, now_ms);
      w.commit(tx);
      return outcome;
    });
  }

  // Every job of the key that is active now ends cancelled or asked to stop (a child may be
  // cancelled through its parent first); the count is theirs.
  int cancel_key(const std::string& concurrency_key, const std::string& kind,
                 int64_t now_ms) override {
    return transact("cancel_key", [&](Tx& tx) {
      Sql sql("SELECT id FROM jobs WHERE concurrency_key = ");
      sql.str(concurrency_key);
      if (!kind.empty()) sql << " AND kind = " << quote(kind);
      sql << " AND status IN " << kActive << " ORDER BY id";
      Result active = tx.one(sql.text());
      Writes w;
      // A job found ended when locked was cancelled here, through its parent, or ended elsewhere
      // since the read (on another host): only the former counts. (A locking read instead would
      // deadlock with those endings, which change the key's index entries it holds.)
      int count = 0;
      for (const Row& row : active.rows) {
        const JobId id = to_i64(row[0]);
        if (cancel_job(tx, w, id, now_ms) != CancelOutcome::kAlreadyFinished ||
            w.cancelled_here(id)) {
          ++count;
        }
      }
      w.commit(tx);
      return count;
    });
  }

  std::optional<Job> get(JobId id) override {
    Result r = read("get", [&](mysql::Connection& c) {
      return c.one(Sql("SELECT ").raw(kJobColumns).raw(" FROM jobs WHERE id = ") << id);
    });
    if (r.rows.empty()) return std::nullopt;
    return read_job(r.rows[0]);
  }

  JobPage list(const JobQuery& query) override {
    if (query.limit == 0) return {};
    Sql sql("SELECT ");
    sql << kJobColumns << " FROM jobs WHERE 1 = 1";
    if (query.status) sql << " AND status = " << status_sql(*query.status);
    if (query.kind) sql << " AND kind = " << quote(*query.kind);
    if (query.concurrency_key) sql << " AND concurrency_key = " << quote(*query.concurrency_key);
    if (query.parent_id) sql << " AND parent_id = " << *query.parent_id;
    if (query.before_id) sql << " AND id < " << *query.before_id;
    // One row more than asked tells whether another page exists.
    sql << " ORDER BY id DESC LIMIT " << page_probe_rows(query.limit);
    Result r = read("list", [&](mysql::Connection& c) { return c.one(sql.text()); });
    JobPage page;
    for (const Row& row : r.rows) page.jobs.push_back(read_job(row));
    if (page.jobs.size() > query.limit) {
      page.jobs.pop_back();
      page.next_before = page.jobs.back().id;
    }
    return page;
  }

  std::vector<Attempt> newest_attempts(JobId id, size_t limit) override {
    Result r = read("attempts", [&](mysql::Connection& c) {
      // The ended attempts, then the running one from the job row (one statement: one
      // snapshot).
      return c.one(Sql("SELECT attempt, owner, started_ms, finished_ms, outcome, error, id AS seq "
                       "FROM job_attempts WHERE job_id = ")
                   << id << " UNION ALL SELECT attempt_no, " << kOwnerName
                   << ", started_ms, 0, 'running', NULL, "
                      "9223372036854775807 FROM jobs WHERE id = "
                   << id << " AND status = 'running' ORDER BY seq DESC LIMIT "
                   << static_cast<uint64_t>(limit));
    });
    std::vector<Attempt> out;
    for (auto row = r.rows.rbegin(); row != r.rows.rend(); ++row) {
      out.push_back({id, to_int((*row)[0]), to_str((*row)[1]), to_i64((*row)[2]), to_i64((*row)[3]),
                     to_str((*row)[4]), (*row)[5]});
    }
    return out;
  }

  std::map<std::string, int64_t> queued_by_kind() override {
    Result r = read("queued_by_kind", [](mysql::Connection& c) {  // a range of jobs_claim_key
      return c.one("SELECT kind, COUNT(*) FROM jobs WHERE status = 'queued' GROUP BY kind");
    });
    std::map<std::string, int64_t> out;
    for (const Row& row : r.rows) out[to_str(row[0])] = to_i64(row[1]);
    return out;
  }

  std::map<std::pair<std::string, JobStatus>, int64_t> counts() override {
    Result r = read("counts", [](mysql::Connection& c) {
      return c.one("SELECT kind, status, COUNT(*) FROM jobs GROUP BY kind, status");
    });
    std::map<std::pair<std::string, JobStatus>, int64_t> out;
    for (const Row& row : r.rows) out[{to_str(row[0]), status_from(row[1])}] = to_i64(row[2]);
    return out;
  }

  void set_checkpoint(JobId id, const std::optional<std::string>& checkpoint,
                      int64_t now_ms) override {
    if (checkpoint) check_text("set_checkpoint: checkpoint", *checkpoint);
    transact("set_checkpoint", [&](Tx& tx) {
      JobState s = lock_existing(tx, id);
      if (s.status == JobStatus::kRunning) {
        throw InvalidTransition("job " + std::to_string(id) +
                                " is running: its checkpoint belongs to the worker");
      }
      tx.commit({Sql("UPDATE jobs SET checkpoint = ")
                 << quote(checkpoint) << ", updated_ms = " << now_ms << " WHERE id = " << id});
    });
  }

  // Waits for the claims in flight (each holds claim_gate in share mode): one of a kind that had
  // no cap locked no job_caps row, and its jobs would not be in the running count of a claim
  // under the new cap. Claims that come later wait for this one and see the cap.
  void set_caps(const std::string& kind, Caps caps) override {
    transact("set_caps", [&](Tx& tx) {
      if (tx.one("SELECT id FROM claim_gate WHERE id = 1 FOR UPDATE").rows.empty()) {
        throw StorageError("mysql: the row of claim_gate is missing (schema 0005)");
      }
      tx.commit({Sql("INSERT INTO job_caps (kind, per_key_cap, global_cap) VALUES (").str(kind)
                 << ", " << std::max(caps.per_key, 0) << ", " << std::max(caps.global, 0)
                 << ") ON DUPLICATE KEY UPDATE per_key_cap = VALUES(per_key_cap), "
                    "global_cap = VALUES(global_cap)"});
    });
  }

  std::map<std::string, Caps> caps() override {
    Result r = read("caps", [](mysql::Connection& c) {
      return c.one("SELECT kind, per_key_cap, global_cap FROM job_caps");
    });
    std::map<std::string, Caps> out;
    for (const Row& row : r.rows) out[to_str(row[0])] = Caps{to_int(row[1]), to_int(row[2])};
    return out;
  }

  int max_running_seen(const std::string& kind, const std::string& concurrency_key) override {
    std::string sql = concurrency_key.empty()
                          ? "SELECT max_running FROM running_totals WHERE kind = " + quote(kind)
                          : "SELECT max_running FROM running_counts WHERE kind = " + quote(kind) +
                                " AND concurrency_key = " + quote(concurrency_key);
    return first_or(read("max_running_seen", [&](mysql::Connection& c) { return c.one(sql); }), 0);
  }

  // The truth (the jobs themselves), not the counters.
  int running(const std::string& kind, const std::string& concurrency_key) override {
    std::string sql =
        "SELECT COUNT(*) FROM jobs WHERE status = 'running' AND kind = " + quote(kind);
    if (!concurrency_key.empty()) sql += " AND concurrency_key = " + quote(concurrency_key);
    return first_or(read("running", [&](mysql::Connection& c) { return c.one(sql); }), 0);
  }

  // Token bucket (token_bucket.h): starts full, refills continuously, never above capacity.
  int64_t take_tokens(const std::string& key, double cost, double capacity, double refill_per_hour,
                      int64_t now_ms) override {
    check_take(cost, capacity, refill_per_hour);
    return transact("take_tokens", [&](Tx& tx) {
      Result r = tx.one("SELECT tokens, updated_ms FROM throttle_buckets WHERE bucket_key = " +
                        quote(key) + " FOR UPDATE");
      std::optional<Bucket> stored;
      if (!r.rows.empty()) stored = Bucket{mysql::to_double(r.rows[0][0]), to_i64(r.rows[0][1])};
      const Take t = take_from(stored, cost, capacity, refill_per_hour, now_ms);
      Sql sql;
      if (r.rows.empty()) {
        // Absent rows cannot be locked at READ COMMITTED: two hosts may both insert; the loser
        // gets a duplicate key and re-runs against the winner's row.
        sql << "INSERT INTO throttle_buckets (bucket_key, tokens, updated_ms) VALUES (";
        sql.str(key) << ", ";
        sql.real(t.bucket.tokens) << ", " << t.bucket.updated_ms << ")";
      } else {
        sql << "UPDATE throttle_buckets SET tokens = ";
        sql.real(t.bucket.tokens) << ", updated_ms = " << t.bucket.updated_ms
                                  << " WHERE bucket_key = " << quote(key);
      }
      commit_retrying_duplicates(tx, sql.text());
      return t.wait_ms;
    });
  }

  // `next` may run more than once when the transaction is re-run after a conflict.
  CircuitRecord update_circuit(
      const std::string& name,
      const std::function<CircuitRecord(const CircuitRecord&)>& next) override {
    return transact("update_circuit", [&](Tx& tx) {
      Result r = tx.one(circuit_sql(name) + " FOR UPDATE");
      CircuitRecord updated = next(read_circuit(r));
      Sql sql(
          "INSERT INTO circuits (name, state, failures, opened_ms, retry_at_ms, updated_ms) "
          "VALUES (");
      sql.str(name) << ", " << quote(updated.state) << ", " << updated.failures << ", "
                    << updated.opened_ms << ", " << updated.retry_at_ms << ", "
                    << updated.updated_ms;
      if (r.rows.empty()) {
        sql << ")";
      } else {
        sql << ") ON DUPLICATE KEY UPDATE state = VALUES(state), failures = VALUES(failures), "
               "opened_ms = VALUES(opened_ms), retry_at_ms = VALUES(retry_at_ms), "
               "updated_ms = VALUES(updated_ms)";
      }
      commit_retrying_duplicates(tx, sql.text());
      return updated;
    });
  }

  CircuitRecord circuit(const std::string& name) override {
    return read_circuit(
        read("circuit", [&](mysql::Connection& c) { return c.one(circuit_sql(name)); }));
  }

  DeadLetterPage list_dead_letters(const DeadLetterQuery& query) override {
    if (query.limit == 0) return {};
    std::string sql = std::string("SELECT ") + kLetterColumns + " FROM dead_letters" +
                      letter_filter(query) + " ORDER BY id DESC LIMIT " +
                      std::to_string(page_probe_rows(query.limit));
    Result r = read("list_dead_letters", [&](mysql::Connection& c) { return c.one(sql); });
    DeadLetterPage page;
    for (const Row& row : r.rows) page.items.push_back(read_letter(row));
    if (page.items.size() > query.limit) {
      page.items.pop_back();
      page.next_before = page.items.back().id;
    }
    return page;
  }

  std::optional<DeadLetter> get_dead_letter(int64_t id) override {
    Result r = read("get_dead_letter", [&](mysql::Connection& c) {
      return c.one(Sql("SELECT ").raw(kLetterColumns).raw(" FROM dead_letters WHERE id = ") << id);
    });
    if (r.rows.empty()) return std::nullopt;
    return read_letter(r.rows[0]);
  }

  std::map<std::pair<std::string, DeadLetterStatus>, int64_t> dead_letter_stats() override {
    Result r = read("dead_letter_stats", [](mysql::Connection& c) {
      return c.one("SELECT kind, status, COUNT(*) FROM dead_letters GROUP BY kind, status");
    });
    std::map<std::pair<std::string, DeadLetterStatus>, int64_t> out;
    for (const Row& row : r.rows) {
      out[{to_str(row[0]), letter_status_from(row[1])}] = to_i64(row[2]);
    }
    return out;
  }

  void retry_dead_letter(int64_t id, int64_t now_ms) override {
    transact_settled<LettersRetried>(
        "retry_dead_letter",
        [&](Tx& tx, std::optional<LettersRetried>& done) {
          Result r = tx.one(Sql("SELECT ").raw(kLetterColumns).raw(" FROM dead_letters WHERE id = ")
                            << id << " FOR UPDATE");
          if (r.rows.empty()) throw JobNotFound("dead letter " + std::to_string(id) + " not found");
          const DeadLetter letter = read_letter(r.rows[0]);
          Writes w;
          retry_letter(tx, w, letter, now_ms);
          done = LettersRetried{1, letter.id, letter.retries};
          commit_retrying_duplicates(tx, w);
        },
        [&](const LettersRetried& done) { return letters_retried(done); });
    notify_runnable();
  }

  int retry_dead_letters(const DeadLetterQuery& query, size_t limit, int64_t now_ms) override {
    if (query.status && *query.status != DeadLetterStatus::kPending) return 0;
    if (limit == 0) return 0;
    DeadLetterQuery pending = query;
    pending.status = DeadLetterStatus::kPending;
    const LettersRetried total = transact_settled<LettersRetried>(
        "retry_dead_letters",
        [&](Tx& tx, std::optional<LettersRetried>& done) {
          // Newest first, a page at a time, until `limit` were retried: a refused letter stays
          // pending and does not count.
          DeadLetterQuery page = pending;
          Writes w;
          LettersRetried retried;
          while (static_cast<size_t>(retried.count) < limit) {
            const size_t want = limit - static_cast<size_t>(retried.count);
            Result r = tx.one(std::string("SELECT ") + kLetterColumns + " FROM dead_letters" +
                              letter_filter(page) + " ORDER BY id DESC LIMIT " +
                              std::to_string(page_probe_rows(want) - 1) + " FOR UPDATE");
            for (const Row& row : r.rows) {
              const DeadLetter letter = read_letter(row);
              try {
                retry_letter(tx, w, letter, now_ms);
                if (retried.count++ == 0) {
                  retried.first = letter.id;
                  retried.first_retries = letter.retries;
                }
              } catch (const InvalidTransition&) {  // e.g. a duplicate is active: stays pending
              } catch (const JobNotFound&) {        // the job was pruned
              }
            }
            if (r.rows.size() < want) break;  // no older pending letter matches
            page.before_id = to_i64(r.rows.back()[0]);
          }
          done = retried;
          commit_retrying_duplicates(tx, w);
        },
        [&](const LettersRetried& done) { return letters_retried(done); });
    if (total.count > 0) notify_runnable();
    return total.count;
  }

  void ignore_dead_letter(int64_t id, int64_t now_ms) override {
    transact("ignore_dead_letter", [&](Tx& tx) {
      Result r = tx.one(Sql("SELECT status FROM dead_letters WHERE id = ") << id << " FOR UPDATE");
      if (r.rows.empty()) throw JobNotFound("dead letter " + std::to_string(id) + " not found");
      DeadLetterStatus status = letter_status_from(r.rows[0][0]);
      if (status == DeadLetterStatus::kIgnored) return;
      if (status != DeadLetterStatus::kPending) {
        throw InvalidTransition("dead letter " + std::to_string(id) + " is " +
                                std::string(to_string(status)));
      }
      tx.commit({Sql("UPDATE dead_letters SET status = 'ignored', updated_ms = ")
                 << now_ms << " WHERE id = " << id});
    });
  }

  int64_t purge_dead_letters(int64_t updated_before_ms) override {
    return transact("purge_dead_letters", [&](Tx& tx) {
      std::vector<Result> r =
          tx.commit({Sql("DELETE FROM dead_letters WHERE status IN ('resolved', 'ignored') AND "
                         "updated_ms < ")
                     << updated_before_ms});
      return static_cast<int64_t>(r[0].affected);
    });
  }

 private:
  // The id of `owner` in lease_owners, added on first use (outside any claim transaction, so
  // that no rollback can take back an id this cache holds). Owners are few: one per process.
  int owner_id(const std::string& owner) {
    const std::string name = owner_key(owner);
    {
      std::lock_guard<std::mutex> lock(owners_mutex_);
      auto it = owner_ids_.find(name);
      if (it != owner_ids_.end()) return it->second;
    }
    int id = read("owner", [&](mysql::Connection& c) {
      std::vector<Result> r =
          c.run("INSERT IGNORE INTO lease_owners (name) VALUES (" + quote(name) +
                "); SELECT id FROM lease_owners WHERE name = " + quote(name));
      return to_int(r[1].rows.at(0)[0]);
    });
    std::lock_guard<std::mutex> lock(owners_mutex_);
    owner_ids_.emplace(name, id);
    return id;
  }

  // Ends each read of the commit checks below. A COMMIT whose reply was lost may still be under
  // way on the server (the client's read timed out during a slow fsync; a proxy dropped the
  // client's side): a plain read at READ COMMITTED sees nothing of it yet, and its caller would
  // run the change again, both then committing. A locking read waits for the rows that COMMIT
  // holds, and reads them once it has ended, either way.
  static constexpr const char* kAwaitCommits = " LOCK IN SHARE MODE";

  // Whether the ending of job `id`'s attempt under lease `token` (one per claim) wrote its row:
  // a sweep that took the lease back writes one under the token too, as "lease_expired", and
  // that one does not count. Throws StorageError when it cannot be read.
  // The job's row first: the attempt's row is written in the COMMIT trip, maybe after a statement
  // that waits (for a dead letter's row, say), and a locking read of a row not there yet does not
  // wait; the job's row that transaction has held since it began, and a locking read of it waits.
  bool attempt_row_exists(JobId id, const std::string& token) {
    return !read("commit check", [&](mysql::Connection& c) {
              c.one(Sql("SELECT id FROM jobs WHERE id = ") << id << kAwaitCommits);
              Sql sql("SELECT 1 FROM job_attempts WHERE job_id = ");
              sql << id << " AND lease_token = " << quote(token)
                  << " AND outcome <> 'lease_expired' LIMIT 1" << kAwaitCommits;
              return c.one(sql);
            }).rows.empty();
  }
  // After a CommitUnknown: whether the transaction that ended job `id`'s attempt under lease
  // `token` committed (it wrote that attempt's row). Unset when the row cannot be read either.
  std::optional<bool> attempt_ended(JobId id, const std::string& token) {
    try {
      return attempt_row_exists(id, token);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  // After a CommitUnknown of a transaction of completions (`ops`) and endings (`ends`, whose
  // outcomes its body left in `end_results`): whether it committed. One item it applied tells,
  // since all or none did; one that applied none changed nothing, and its outcomes (leases lost)
  // hold either way.
  // When that cannot be read either (the server is gone), the answer is no: the caller runs the
  // items again, fenced by their tokens, and the completions among them are remembered (see
  // settle_unsettled_completions).
  bool committed_after_all(const std::vector<CompleteOp*>& ops,
                           const std::vector<const Finish*>& ends,
                           const std::vector<FinishResult>& end_results) {
    std::optional<bool> committed = true;  // nothing applied: nothing changed either way
    bool told = false;
    for (const CompleteOp* op : ops) {
      if (!op->error) {
        committed = attempt_ended(op->id, op->token);
        told = true;
        break;
      }
    }
    for (size_t k = 0; !told && k < ends.size() && k < end_results.size(); ++k) {
      if (end_results[k].status) {
        committed = attempt_ended(ends[k]->id, ends[k]->token);
        told = true;
      }
    }
    if (!committed) {
      std::lock_guard lock(unsettled_mutex_);
      for (const CompleteOp* op : ops) {
        if (!op->error)
          unsettled_endings_.emplace(std::pair(op->id, op->token), JobStatus::kSucceeded);
      }
      for (size_t k = 0; k < ends.size() && k < end_results.size(); ++k) {
        if (end_results[k].status) {
          unsettled_endings_.emplace(std::pair(ends[k]->id, ends[k]->token),
                                     *end_results[k].status);
        }
      }
    }
    return committed.value_or(false);
  }

  // Endings (completions too) whose transaction may have committed without the store learning
  // it (its reply, and then the server, were lost), with the outcome its body computed: sent
  // again, they would find their jobs ended and report their leases lost. Such an ending is
  // settled first, by its attempt's row: present, it applied and its outcome is returned; absent,
  // nothing is returned and it runs as usual. When the row cannot be read this throws, and the
  // ending stays remembered.
  std::optional<JobStatus> settled_outcome(JobId id, const std::string& token) {
    JobStatus outcome;
    {
      std::lock_guard lock(unsettled_mutex_);
      if (unsettled_endings_.empty()) return std::nullopt;
      auto it = unsettled_endings_.find(std::pair(id, token));
      if (it == unsettled_endings_.end()) return std::nullopt;
      outcome = it->second;
    }
    const bool applied = attempt_row_exists(id, token);
    std::lock_guard lock(unsettled_mutex_);
    unsettled_endings_.erase(std::pair(id, token));
    if (applied) return outcome;
    return std::nullopt;
  }
  // settled_outcome() for each ending of `ends` (item `end_item[k]` of `results`): one that
  // applied is taken out of both with its outcome as its result, one whose row cannot be read too,
  // with the error; either goes into `settled`.
  void settle_unsettled_ends(std::vector<const Finish*>& ends, std::vector<size_t>& end_item,
                             std::vector<FinishResult>& results, std::set<size_t>& settled) {
    std::vector<const Finish*> left;
    std::vector<size_t> left_item;
    for (size_t k = 0; k < ends.size(); ++k) {
      FinishResult& result = results[end_item[k]];
      try {
        if (std::optional<JobStatus> applied = settled_outcome(ends[k]->id, ends[k]->token)) {
          result.status = *applied;
          settled.insert(end_item[k]);
          continue;
        }
      } catch (...) {
        result = finish_failure(std::current_exception());
        settled.insert(end_item[k]);
        continue;
      }
      left.push_back(ends[k]);
      left_item.push_back(end_item[k]);
    }
    ends = std::move(left);
    end_item = std::move(left_item);
  }
  // settled_outcome() for each op of `batch`: one that applied is taken out of `batch` (it
  // succeeded), one whose row cannot be read too, with the error.
  void settle_unsettled_completions(std::vector<CompleteOp*>& batch) {
    std::erase_if(batch, [&](CompleteOp* op) {
      try {
        return settled_outcome(op->id, op->token).has_value();
      } catch (...) {
        op->error = std::current_exception();
        return true;
      }
    });
  }

  // After a CommitUnknown of a claim: whether it committed. Its jobs carry its lease tokens (one
  // per claim), so one of them tells; a claim that took nothing changed nothing. Unset when the
  // row cannot be read either.
  std::optional<bool> claim_committed(const std::vector<ClaimOp*>& ops) {
    for (const ClaimOp* op : ops) {
      if (op->result.empty()) continue;
      const Claimed& c = op->result.front();
      try {
        return !read("commit check", [&](mysql::Connection& conn) {
                  return conn.one(Sql("SELECT 1 FROM jobs WHERE id = ")
                                  << c.job.id << " AND status = 'running' AND lease_token = "
                                  << quote(c.lease_token) << kAwaitCommits);
                }).rows.empty();
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
    return true;
  }

  template <class Body>
  auto transact(const char* what, Body&& body, mysql::RetryLimits limits = {})
      -> std::invoke_result_t<Body&, Tx&> {
    return mysql::transact(pool_, what, std::forward<Body>(body), limits);
  }

  // transact() for a change that must not be made twice and that a caller cannot fence (an
  // enqueue without a dedupe key, a retry of dead letters). `body(tx, done)` sets `done` to what
  // it did before it commits (or leaves the commit to transact). Should the COMMIT's reply be
  // lost, `applied(done)` reads back whether that was committed: if so, it is returned; if not,
  // the transaction runs again. Only when that cannot be told (unset: the server is gone) does
  // the caller get the CommitUnknown, an error that says the outcome is unknown.
  template <class R, class Body, class Applied>
  R transact_settled(const char* what, Body&& body, Applied&& applied) {
    for (int attempt = 1;; ++attempt) {
      std::optional<R> done;
      try {
        transact(what, [&](Tx& tx) {
          done.reset();
          body(tx, done);
        });
        return std::move(*done);
      } catch (const mysql::CommitUnknown&) {
        if (!done) throw;
        const std::optional<bool> committed = applied(*done);
        if (committed == true) return std::move(*done);
        if (!committed || attempt >= 3) throw;
      }
    }
  }

  // Whether the enqueue of `specs` whose body returned `made` committed: its first new job is
  // there, as made (an id that a server restarted after a crash hands out again would be another
  // job's). One that made no job changed nothing. Unset when that cannot be read.
  std::optional<bool> enqueued(const std::vector<JobSpec>& specs,
                               const std::vector<EnqueueResult>& made, int64_t now) {
    for (size_t i = 0; i < made.size(); ++i) {
      if (!made[i].created) continue;
      const JobSpec& s = specs[i];
      try {
        // The payload by its length and digest: quoted, a payload dense in quotes and backslashes
        // is up to twice as long, and a statement over the server's max_allowed_packet (which the
        // payload itself was not) would leave the outcome unknown on a server that works.
        Poco::SHA2Engine digest(Poco::SHA2Engine::SHA_256);
        digest.update(s.payload);
        return !read("commit check", [&](mysql::Connection& c) {
                  return c.one(Sql("SELECT 1 FROM jobs WHERE id = ")
                               << made[i].id << " AND kind = " << quote(s.kind)
                               << " AND concurrency_key = " << quote(s.concurrency_key)
                               << " AND created_ms = " << now << " AND LENGTH(payload) = "
                               << s.payload.size() << " AND SHA2(payload, 256) = '"
                               << Poco::DigestEngine::digestToHex(digest.digest()) << "'"
                               << kAwaitCommits);
                }).rows.empty();
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
    return true;
  }

  // What a retry of dead letters did: how many it retried, and the first of them with the
  // number of retries it had before.
  struct LettersRetried {
    int count = 0;
    int64_t first = 0;
    int first_retries = 0;
  };
  // Whether the retry that returned `done` committed: its first letter counts one more retry.
  // One that retried none changed nothing. Unset when that cannot be read (or the letter was
  // purged since).
  std::optional<bool> letters_retried(const LettersRetried& done) {
    if (done.count == 0) return true;
    try {
      const Result r = read("commit check", [&](mysql::Connection& c) {
        return c.one(Sql("SELECT retries FROM dead_letters WHERE id = ")
                     << done.first << kAwaitCommits);
      });
      if (r.rows.empty()) return std::nullopt;
      return to_i64(r.rows[0][0]) > done.first_retries;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  // A read outside any transaction (autocommit, one statement): re-run when the connection was
  // lost, since reading twice is harmless.
  template <class Body>
  auto read(const char* what, Body&& body) -> std::invoke_result_t<Body&, mysql::Connection&> {
    for (int attempt = 1;; ++attempt) {
      try {
        Pool::Lease c = pool_.acquire();
        return body(*c);
      } catch (const mysql::Error& e) {
        if ((e.needs_new_session() || e.lock_conflict()) && attempt < 5) {
          mysql::backoff(attempt, std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
          continue;
        }
        throw StorageError(std::string("mysql: ") + what + ": " + e.what(), e.transient(),
                           e.lock_conflict(), e.interrupted());
      }
    }
  }

  // The commit of a body whose writes may hit a unique key another transaction just took (dedupe
  // key, new bucket or circuit): the whole transaction is re-run and sees the other's row.
  static void commit_retrying_duplicates(Tx& tx, const std::string& statement) {
    Writes w;
    w.push_back(statement);
    commit_retrying_duplicates(tx, w);
  }
  static void commit_retrying_duplicates(Tx& tx, Writes& w) {
    try {
      w.commit(tx);
    } catch (const mysql::Error& e) {
      if (e.duplicate_key() && !tx.commit_unknown()) {
        throw mysql::RetryTransaction(std::string("unique key race: ") + e.what());
      }
      throw;
    }
  }

  void return_job(JobId id, const std::string& token, int64_t run_after, std::string_view outcome,
                  const std::optional<std::string>& reason, int64_t now_ms) {
    end_attempt_tx(outcome == "deferred" ? "defer" : "release", id, token, [&](Tx& tx, Writes& w) {
      return return_locked(tx, w, lock_running(tx, id, token), run_after, outcome, reason, now_ms);
    });
  }
  static JobStatus return_locked(Tx& tx, Writes& w, const JobState& s, int64_t run_after,
                                 std::string_view outcome, const std::optional<std::string>& reason,
                                 int64_t now) {
    if (s.cancel_requested) {
      // Leaving running is where a requested cancellation takes effect.
      end_attempt(w, s, "cancelled", reason, now);
      mark_cancelled(tx, w, s, 1, std::nullopt, now);
      return JobStatus::kCancelled;
    }
    end_attempt(w, s, outcome, reason, now);
    requeue(w, s, run_after, 1, std::nullopt, now);
    return JobStatus::kQueued;
  }

  // fail(), defer() and release() of distinct jobs in one transaction, each as that method would:
  // the rows are locked by one SELECT in id order and each lease is checked before anything is
  // written; an item whose lease does not hold changes nothing. `results` is set anew each time
  // (the body may run again after a deadlock).
  static void end_jobs(Tx& tx, const std::vector<const Finish*>& items,
                       std::vector<FinishResult>& results, int64_t now) {
    std::vector<JobId> ids;
    for (const Finish* f : items) ids.push_back(f->id);
    std::map<JobId, JobState> states = lock_states(tx, ids);
    Writes w;
    end_locked(tx, w, items, results, states, now);
    w.commit(tx);
  }

  // A finish() call's completions and its batched endings (end_jobs) in one transaction: one
  // lock of all their rows in id order, one commit. A job completed here is no longer running
  // for an ending of it that follows (it is refused, as it would be one call after the other).
  static void finish_together(Tx& tx, const std::vector<CompleteOp*>& ops,
                              const std::vector<const Finish*>& ends,
                              std::vector<FinishResult>& end_results, int64_t now) {
    std::vector<JobId> ids;
    for (const CompleteOp* op : ops) ids.push_back(op->id);
    for (const Finish* f : ends) ids.push_back(f->id);
    std::map<JobId, JobState> states = lock_states(tx, ids);
    Writes w;
    complete_locked(w, ops, states);
    end_locked(tx, w, ends, end_results, states, now);
    w.commit(tx);
  }

  static void end_locked(Tx& tx, Writes& w, const std::vector<const Finish*>& items,
                         std::vector<FinishResult>& results,
                         const std::map<JobId, JobState>& states, int64_t now) {
    results.assign(items.size(), FinishResult{});
    std::vector<std::pair<size_t, const JobState*>> retry_items;  // item index, its job's state
    for (size_t k = 0; k < items.size(); ++k) {
      const Finish& f = *items[k];
      auto it = states.find(f.id);
      const JobState* read = it == states.end() ? nullptr : &it->second;
      if (auto problem = lease_problem(f.id, read, f.token)) {
        results[k].lease_lost = true;
        results[k].error = *problem;
        continue;
      }
      // An item before this one may have asked the job to stop (its parent's cancellation).
      const JobState s = w.current(*read);
      switch (f.kind) {
        case Finish::Kind::kFail:
          if (after_failure(f.failure, s.attempts, s.max_attempts, s.cancel_requested) ==
              JobStatus::kQueued) {
            retry_items.emplace_back(k, read);  // fail_locked's requeue, all at once below
            results[k].status = JobStatus::kQueued;
            break;
          }
          results[k].status = fail_locked(tx, w, s, f.failure, now);
          break;
        case Finish::Kind::kDefer:
          results[k].status = return_locked(tx, w, s, f.until_ms, "deferred", f.reason, now);
          break;
        default:  // kRelease
          results[k].status = return_locked(tx, w, s, now, "released", std::nullopt, now);
          break;
      }
    }
    // A retry whose job a later item asked to stop is cancelled instead (the cancellation rule),
    // as it would be were the requeue written before that item.
    std::vector<std::pair<const Finish*, const JobState*>> retries;
    for (const auto& [k, read] : retry_items) {
      const JobState s = w.current(*read);
      if (s.cancel_requested) {
        results[k].status = fail_locked(tx, w, s, items[k]->failure, now);
      } else {
        retries.emplace_back(items[k], read);
      }
    }
    if (!retries.empty()) requeue_failed(w, retries, now);
  }

  // fail_locked() for failures that requeue (not FATAL, attempts left, no cancel request): the
  // attempt rows by one INSERT, the jobs by one UPDATE.
  static void requeue_failed(Writes& w,
                             const std::vector<std::pair<const Finish*, const JobState*>>& retries,
                             int64_t now) {
    std::vector<JobId> ids;
    std::vector<std::pair<JobId, std::string>> errors, run_afters;
    for (const auto& [f, s] : retries) {
      ids.push_back(s->id);
      errors.emplace_back(s->id, quote(clip(f->failure.error)));
      run_afters.emplace_back(s->id, std::to_string(later_by(now, f->failure.retry_delay_ms)));
      w.running(s->kind, s->key, -1);
    }
    const std::string list = id_list(ids);
    w.push_back(attempt_rows(std::to_string(now), "'failed'", per_id("id", errors),
                             "id IN (" + list + ")"));
    w.push_back(Sql("UPDATE jobs SET status = 'queued', run_after_ms = ")
                << per_id("id", run_afters) << ", last_error = " << per_id("id", errors)
                << ", owner_id = 0, lease_token = '', lease_expires_ms = 0, updated_ms = " << now
                << " WHERE id IN (" << list << ")");
  }

  static std::string letter_filter(const DeadLetterQuery& q) {
    std::string sql = " WHERE 1 = 1";
    if (q.status) sql += " AND status = " + quote(to_string(*q.status));
    if (q.kind) sql += " AND kind = " + quote(*q.kind);
    if (q.concurrency_key) sql += " AND concurrency_key = " + quote(*q.concurrency_key);
    if (q.before_id) sql += " AND id < " + std::to_string(*q.before_id);
    return sql;
  }

  // The job goes back to queued with attempts reset (counted again by an active parent). Every
  // check comes before any write, so that a refused letter leaves no trace (the bulk retry skips
  // refused letters inside one transaction).
  static void retry_letter(Tx& tx, Writes& w, const DeadLetter& letter, int64_t now) {
    std::string name = "dead letter " + std::to_string(letter.id);
    if (letter.status != DeadLetterStatus::kPending &&
        letter.status != DeadLetterStatus::kIgnored) {
      throw InvalidTransition(name + " is " + std::string(to_string(letter.status)));
    }
    // The writes of the letter before (a bulk retry) go now: its job's dedupe key, free at its
    // plain read, may have been taken since by a job whose INSERT had not committed then. The
    // whole transaction then runs again, and that read finds the other job.
    try {
      w.flush(tx);
    } catch (const mysql::Error& e) {
      if (e.duplicate_key()) {
        throw mysql::RetryTransaction(std::string("dedupe race: ") + e.what());
      }
      throw;
    }
    std::optional<JobState> s = lock_state(tx, letter.job_id);
    if (!s) throw JobNotFound(name + ": job " + std::to_string(letter.job_id) + " was pruned");
    if (s->status != JobStatus::kDead) {
      throw InvalidTransition(name + ": job " + std::to_string(s->id) + " is " +
                              std::string(to_string(s->status)));
    }
    if (s->dedupe_key) {
      Result other = tx.one(Sql("SELECT id FROM jobs WHERE kind = ").str(s->kind)
                            << " AND active_dedupe_key = " << quote(*s->dedupe_key));
      if (!other.rows.empty()) {
        throw InvalidTransition(name + ": job " + to_str(other.rows[0][0]) +
                                " is active with the same dedupe key");
      }
    }
    bool counted = s->parent_id && count_child(tx, *s->parent_id, now);
    // Its active children that nobody counted (retried or enqueued while it was dead; a bulk
    // retry takes a child that died after its parent first): it waits for them as for the others.
    const uint64_t adopted =
        tx.one(Sql("UPDATE jobs SET counted_in_parent = 1 WHERE parent_id = ")
               << s->id << " AND counted_in_parent = 0 AND status IN " << kActive)
            .affected;
    w.push_back(Sql("UPDATE jobs SET status = 'queued', attempts = 0, run_after_ms = ")
                << now << ", finished_ms = 0, cancel_requested = 0, counted_in_parent = "
                << (counted ? 1 : 0) << ", pending_children = pending_children + " << adopted
                << ", active_dedupe_key = dedupe_key, owner_id = 0, lease_token = '', "
                   "lease_expires_ms = 0, wait_deadline_ms = 0, updated_ms = "
                << now << " WHERE id = " << s->id);
    w.push_back(Sql("UPDATE dead_letters SET status = 'retrying', retries = retries + 1, "
                    "updated_ms = ")
                << now << " WHERE id = " << letter.id);
  }

  Pool pool_;
  size_t pool_size_;
  // One batch in flight per operation: while it runs (statements, then the commit's fsync), the
  // next one fills. Two in flight gave smaller batches and more server CPU per job in the W1
  // measurements, with no clear gain in throughput.
  GroupCommit<ClaimOp> claims_{1, 64, 1u << 20};
  GroupCommit<CompleteOp> completions_{1, 256, 4u << 20};
  // What the last claims found of the queue (see claim_jobs).
  std::mutex hint_mutex_;
  ClaimHints hints_;
  std::mutex owners_mutex_;
  std::map<std::string, int> owner_ids_;  // lease_owners, as far as this store has used them
  std::mutex unsettled_mutex_;
  std::vector<Finish> unsettled_claims_;                                  // see remember_unsettled
  std::map<std::pair<JobId, std::string>, JobStatus> unsettled_endings_;  // see settled_outcome
};

// The session of migrate(): the store's settings without a read timeout, and without the
// server's or the account's statement time limit (MariaDB's max_statement_time; MySQL's
// max_execution_time bounds only SELECTs). A migration's DDL -- an ALTER copying a large jobs
// table -- may run for minutes without a byte coming back. With the pool's read timeout it was
// taken for a lost connection: migrate() ran again on a new session and waited there for the
// migration lock that the old session, its DDL still running on the server, went on holding.
// Its lock waits are lock-wait-timeout's or the server's, no longer cut to read-timeout - 1.
std::unique_ptr<mysql::Connection> migration_session(mysql::Config config) {
  config.read_timeout_s = 0;
  auto c = std::make_unique<mysql::Connection>(config);
  try {
    c->one("SET SESSION max_statement_time = 0");
  } catch (const mysql::Error& e) {
    if (e.code() != 1193) throw;  // 1193: unknown system variable -- MySQL
  }
  return c;
}

// The session holding the named lock `name`, for an error: "connection 42 (u@10.0.0.7:5123,
// Query for 75 s: ALTER TABLE jobs ...)". nullopt when the lock is free. A session of another
// user shows only with the PROCESS privilege.
std::optional<std::string> lock_holder(mysql::Connection& c, const std::string& name) {
  Result r = c.one(
      "SELECT l.id, p.USER, p.HOST, p.COMMAND, p.TIME, LEFT(p.INFO, 200) FROM (SELECT "
      "IS_USED_LOCK(" +
      quote(name) + ") AS id) l LEFT JOIN information_schema.PROCESSLIST p ON p.ID = l.id");
  if (r.rows.empty() || !r.rows[0][0]) return std::nullopt;
  const Row& row = r.rows[0];
  std::string out = "connection " + *row[0];
  if (!row[1]) return out + " (not visible in information_schema.PROCESSLIST)";
  out += " (" + *row[1] + "@" + to_str(row[2]) + ", " + to_str(row[3]) + " for " + to_str(row[4]) +
         " s";
  if (row[5]) {
    std::string statement = *row[5];
    std::replace(statement.begin(), statement.end(), '\n', ' ');
    out += ": " + statement;
  }
  return out + ")";
}

// Takes the migration lock `name` on `c`, waiting while another session holds it (another host
// migrating), at most `wait_s` seconds: a fixed 30 s failed the hosts started together with one
// whose migration took longer, although nothing was wrong. The holder is a live session: the
// server releases the locks of a session that ends.
void take_migration_lock(mysql::Connection& c, const std::string& name, unsigned wait_s) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::seconds(wait_s);
  while (true) {
    const int64_t left = std::max<int64_t>(
        0, std::chrono::ceil<std::chrono::seconds>(deadline - Clock::now()).count());
    Result got = c.one("SELECT GET_LOCK(" + quote(name) + ", " + std::to_string(left) + ")");
    if (first_or(got, 0) == 1) return;
    // Released since the wait ended: tried again.
    std::optional<std::string> holder = lock_holder(c, name);
    if (!holder || Clock::now() < deadline) continue;
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
    throw StorageError("mysql: migrate: waited " + std::to_string(waited.count()) +
                       " s for the migration lock '" + name + "', held by " + *holder +
                       ": another host may still be migrating; let it finish, or give "
                       "migrate-wait=S in the connection string to wait longer");
  }
}

// Applies what is missing of mysql_migrations() under a server-wide named lock, so that hosts
// starting together migrate one at a time and the later ones find the work done. DDL commits on
// its own in MySQL, so a migration is not atomic: its statements are written to be re-run
// (IF NOT EXISTS) after a crash halfway, and schema_migrations records it only once all ran.
// It runs on a session of its own (migration_session), closed at the end.
SchemaVersions MysqlStore::apply_migrations() {
  const std::string lock_name = [&] {
    std::string name = "backhaul_migrate:" + pool_.config().db;
    return name.substr(0, 64);  // the server's limit for lock names
  }();
  std::optional<int> before;  // the version the first try found
  for (int attempt = 1;; ++attempt) {
    try {
      std::unique_ptr<mysql::Connection> c = migration_session(pool_.config());
      take_migration_lock(*c, lock_name, pool_.config().migrate_wait_s);
      struct Release {
        mysql::Connection& c;
        std::string name;
        ~Release() {
          try {
            c.one("SELECT RELEASE_LOCK(" + quote(name) + ")");
          } catch (...) {  // a lost session releases its locks anyway
          }
        }
      } release{*c, lock_name};
      // Read first, created only when missing: a database already migrated opens with a user
      // that may only read and write rows (CREATE ... IF NOT EXISTS needs the CREATE privilege
      // even when the table exists).
      Result recorded;
      try {
        recorded = c->one("SELECT version, name FROM schema_migrations");
      } catch (const mysql::Error& e) {
        if (e.code() != 1146) throw;  // 1146: no such table -- a new database
        c->one(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INT NOT NULL PRIMARY KEY, "
            "name VARCHAR(255) NOT NULL, applied_ms BIGINT NOT NULL) ENGINE = InnoDB DEFAULT "
            "CHARSET = utf8mb4");
        recorded = c->one("SELECT version, name FROM schema_migrations");
      }
      std::map<int, std::string> applied;
      for (const Row& row : recorded.rows) applied.emplace(to_int(row[0]), to_str(row[1]));
      check_history("mysql", applied, mysql_migrations());
      // As found by the first try: a try that failed may have applied and recorded migrations
      // (DDL commits on its own), and the next would take their version for the one found.
      if (!before) before = applied.empty() ? 0 : applied.rbegin()->first;
      SchemaVersions versions;
      versions.before = *before;
      for (const Migration& m : mysql_migrations()) {
        if (applied.count(m.version)) continue;
        for (const std::string& statement : split_sql_statements(m.sql)) {
          try {
            c->one(statement);
          } catch (const mysql::Error& e) {
            // A statement that ran before a crash that left the migration unrecorded (MySQL 8
            // has no IF [NOT] EXISTS for these): 1060, the column an ADD COLUMN adds exists;
            // 1061, the index an ADD INDEX adds exists; 1091, the index a DROP INDEX drops is
            // gone.
            if (e.code() != 1060 && e.code() != 1061 && e.code() != 1091) throw;
          }
        }
        // applied_ms audits when an operator upgraded; it is not job time (no clock here).
        int64_t wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
        c->one(Sql("INSERT INTO schema_migrations (version, name, applied_ms) VALUES (")
               << m.version << ", " << quote(std::string_view(m.name)) << ", " << wall_ms << ")");
      }
      versions.after =
          first_or(c->one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"), 0);
      return versions;
    } catch (const mysql::Error& e) {
      if ((e.needs_new_session() || e.lock_conflict()) && attempt < 5) {
        mysql::backoff(attempt, std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
        continue;
      }
      throw StorageError(std::string("mysql: migrate: ") + e.what());
    }
  }
}

}  // namespace

std::unique_ptr<JobStore> open_mysql_store(const std::string& connection_string, size_t pool_size,
                                           bool migrate) {
  return std::make_unique<MysqlStore>(connection_string, pool_size, migrate);
}

void check_mysql_connection_string(const std::string& connection_string) {
  store_config(connection_string);
}

}  // namespace backhaul::jobs
