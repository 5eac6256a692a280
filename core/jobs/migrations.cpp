#include "core/jobs/migrations.h"

#include <sstream>

#include "core/common/errors.h"

namespace backhaul::jobs {

void check_not_newer(const char* backend, const std::set<int>& applied,
                     const std::vector<Migration>& known) {
  const int latest = known.empty() ? 0 : known.back().version;
  if (applied.empty() || *applied.rbegin() <= latest) return;
  throw StorageError(std::string(backend) + ": the database is at schema version " +
                     std::to_string(*applied.rbegin()) + ", newer than this build's " +
                     std::to_string(latest) +
                     ": run the newer backhaul (every process on one store runs the same version)");
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
