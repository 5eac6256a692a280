// Versioned schema migrations (SPEC D14), embedded from schemas/sql/<backend>/NNNN_name.sql at
// build time. Append-only: a released migration is never edited; a change is a new file.
#pragma once

#include <set>
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

// Throws StorageError when the database records a migration this build does not know: a newer
// build upgraded it, and this one would misread it (all processes on a store run one version).
void check_not_newer(const char* backend, const std::set<int>& applied,
                     const std::vector<Migration>& known);

// Splits a migration into statements (on ";" at the end of a line; "--" comment lines dropped).
std::vector<std::string> split_sql_statements(const std::string& sql);

}  // namespace backhaul::jobs
