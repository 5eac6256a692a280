// Versioned schema migrations (SPEC D14), embedded from schemas/sql/<backend>/NNNN_name.sql at
// build time. Append-only: a released migration is never edited; a change is a new file.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace backhaul::jobs {

struct Migration {
  int version;
  const char* name;
  const char* sql;  // one or more statements separated by ";" at line ends
};

const std::vector<Migration>& sqlite_migrations();
const std::vector<Migration>& mysql_migrations();

// Checks the migrations a database records (`applied`: version -> name) against this build's,
// before any is applied. Throws StorageError naming the version when one is newer than this
// build's latest (a newer build upgraded the database, and this one would misread it: every
// process on a store runs one version), when one is unknown or recorded under another name (made
// by another build), or when one is missing below a recorded one (the history was edited: this
// build would apply it out of order).
void check_history(const char* backend, const std::map<int, std::string>& applied,
                   const std::vector<Migration>& known);

// Splits a migration into statements (on ";" at the end of a line; "--" comment lines dropped).
std::vector<std::string> split_sql_statements(const std::string& sql);

}  // namespace backhaul::jobs
