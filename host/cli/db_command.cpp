// `backhaul db migrate --sqlite PATH | --mysql-env VAR`: applies the versioned schema migrations
// (SPEC D14) directly to a store, without a daemon, and prints the schema version.
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "core/common/errors.h"
#include "core/jobs/job_store.h"
#include "core/jobs/sqlite_store.h"
#include "host/cli/cli.h"

namespace backhaul::cli {
namespace {

struct DbOptions {
  std::string sqlite;
  std::string mysql_env;
};

// What a migration did, which the version after does not tell: a path mistyped made a new, empty
// store, and said so only as a version.
std::string migration_outcome(const jobs::SchemaVersions& v) {
  const std::string after = std::to_string(v.after);
  if (v.before == 0) return "created a new store at schema version " + after;
  if (v.before == v.after) return "already at schema version " + after;
  return "migrated from schema version " + std::to_string(v.before) + " to " + after;
}

void migrate(const DbOptions& o) {
  std::unique_ptr<jobs::JobStore> store;
  std::string where;
  if (!o.sqlite.empty()) {
    jobs::SqliteStoreOptions options;
    options.migrate = false;  // migrate() below reports the version
    store = jobs::open_sqlite_store(o.sqlite, options);
    where = o.sqlite;
  } else {
    const char* dsn = std::getenv(o.mysql_env.c_str());
    if (dsn == nullptr || *dsn == '\0') {
      throw ConfigError("environment variable " + o.mysql_env +
                        " (the MySQL connection string) "
                        "is not set");
    }
    store = jobs::open_mysql_store(dsn, 1, /*migrate=*/false);  // as options.migrate above
    where = "$" + o.mysql_env;
  }
  const jobs::SchemaVersions versions = store->apply_migrations();
  std::printf("%s store %s: %s\n", store->backend().c_str(), where.c_str(),
              migration_outcome(versions).c_str());
}

}  // namespace

void add_db_command(CLI::App& app) {
  auto options = std::make_shared<DbOptions>();
  CLI::App* db = app.add_subcommand("db", "the job store's schema");
  db->require_subcommand(1);
  CLI::App* migrate_cmd = db->add_subcommand(
      "migrate",
      "apply pending schema migrations and say what they did: created a new store, migrated it "
      "from one version to another, or found it current");
  auto* sqlite = migrate_cmd->add_option("--sqlite", options->sqlite,
                                         "SQLite database file (created if "
                                         "missing)");
  auto* mysql = migrate_cmd->add_option("--mysql-env", options->mysql_env,
                                        "environment variable holding the MySQL connection string "
                                        "(host=...;port=...;db=...;user=...;password=...)");
  sqlite->excludes(mysql);
  mysql->excludes(sqlite);
  migrate_cmd->callback([options] {
    if (options->sqlite.empty() && options->mysql_env.empty()) {
      throw CLI::ValidationError("db migrate", "give --sqlite PATH or --mysql-env VAR");
    }
    migrate(*options);
  });
}

}  // namespace backhaul::cli
