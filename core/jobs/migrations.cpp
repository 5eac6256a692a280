#include "core/jobs/migrations.h"

#include <sstream>

#include "core/common/errors.h"

namespace backhaul::jobs {

void check_history(const char* backend, const std::map<int, std::string>& applied,
                   const std::vector<Migration>& known) {
  if (applied.empty()) return;
  const std::string b(backend);
  const int latest = known.empty() ? 0 : known.back().version;
  const int highest = applied.rbegin()->first;
  if (highest > latest) {
    throw StorageError(b + ": the database is at schema version " + std::to_string(highest) +
                       ", newer than this build's " + std::to_string(latest) +
                       ": run the newer backhaul (every process on one store runs the same "
                       "version)");
  }
  std::map<int, const Migration*> by_version;
  for (const Migration& m : known) by_version[m.version] = &m;
  for (const auto& [version, name] : applied) {
    auto it = by_version.find(version);
    if (it == by_version.end()) {
      throw StorageError(b + ": the database records schema migration " + std::to_string(version) +
                         " ('" + name +
                         "'), which this build does not have: another build of backhaul made it");
    }
    if (name != it->second->name) {
      throw StorageError(b + ": the database records schema migration " + std::to_string(version) +
                         " as '" + name + "', but this build's is '" + it->second->name +
                         "': another build of backhaul made it");
    }
  }
  for (const Migration& m : known) {
    if (m.version > highest) break;
    if (!applied.count(m.version)) {
      throw StorageError(b + ": the database records schema migration " + std::to_string(highest) +
                         " but not " + std::to_string(m.version) + " ('" + m.name +
                         "'), which comes before it: schema_migrations was edited, and this "
                         "build does not apply a migration out of order");
    }
  }
}

std::vector<std::string> split_sql_statements(const std::string& sql) {
  std::vector<std::string> statements;
  std::string current;
  std::istringstream in(sql);
  std::string line;
  while (std::getline(in, line)) {
    size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    if (line.compare(first, 2, "--") == 0) continue;
    size_t last = line.find_last_not_of(" \t\r");
    bool ends = line[last] == ';';
    current += line.substr(0, ends ? last : last + 1);
    current += '\n';
    if (ends) {
      statements.push_back(current);
      current.clear();
    }
  }
  if (current.find_first_not_of(" \t\r\n") != std::string::npos) statements.push_back(current);
  return statements;
}

}  // namespace backhaul::jobs
