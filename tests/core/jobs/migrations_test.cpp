// The check of a database's recorded migrations against this build's (check_history): what it
// refuses, with the version named, before any migration is applied.
#include "core/jobs/migrations.h"

#include <gtest/gtest.h>

#include "core/common/errors.h"

namespace backhaul::jobs {
namespace {

const std::vector<Migration> kKnown = {
    {1, "0001_init", ""}, {2, "0002_more", ""}, {3, "0003_most", ""}};

// The message of the StorageError that check_history throws, or "" when it throws none.
std::string refusal(const std::map<int, std::string>& applied) {
  try {
    check_history("sqlite", applied, kKnown);
    return "";
  } catch (const StorageError& e) {
    return e.what();
  }
}

TEST(MigrationHistory, ANewDatabaseOrAPrefixOfThisBuildsMigrationsIsTaken) {
  EXPECT_EQ(refusal({}), "");
  EXPECT_EQ(refusal({{1, "0001_init"}}), "");
  EXPECT_EQ(refusal({{1, "0001_init"}, {2, "0002_more"}}), "");
  EXPECT_EQ(refusal({{1, "0001_init"}, {2, "0002_more"}, {3, "0003_most"}}), "");
}

TEST(MigrationHistory, AVersionNewerThanThisBuildsIsRefused) {
  EXPECT_EQ(refusal({{1, "0001_init"}, {4, "0004_future"}}),
            "sqlite: the database is at schema version 4, newer than this build's 3: run the newer "
            "backhaul (every process on one store runs the same version)");
}

TEST(MigrationHistory, AVersionRecordedUnderAnotherNameIsRefused) {
  EXPECT_EQ(refusal({{1, "0001_init"}, {2, "0002_other"}}),
            "sqlite: the database records schema migration 2 as '0002_other', but this build's is "
            "'0002_more': another build of backhaul made it");
}

TEST(MigrationHistory, AVersionThisBuildDoesNotHaveIsRefused) {
  const std::vector<Migration> with_gap = {{1, "0001_init", ""}, {3, "0003_most", ""}};
  try {
    check_history("mysql", {{1, "0001_init"}, {2, "0002_branch"}}, with_gap);
    ADD_FAILURE() << "migration 2 was taken";
  } catch (const StorageError& e) {
    EXPECT_STREQ(e.what(),
                 "mysql: the database records schema migration 2 ('0002_branch'), which this "
                 "build does not have: another build of backhaul made it");
  }
}

// Migrations are applied in order and recorded as they go, so a recorded one always has those
// before it; a gap means schema_migrations was edited, and filling it would apply a migration
// after the ones that build on it.
TEST(MigrationHistory, AVersionMissingBelowARecordedOneIsRefused) {
  EXPECT_EQ(refusal({{1, "0001_init"}, {3, "0003_most"}}),
            "sqlite: the database records schema migration 3 but not 2 ('0002_more'), which comes "
            "before it: schema_migrations was edited, and this build does not apply a migration "
            "out of order");
  EXPECT_NE(refusal({{2, "0002_more"}}).find("but not 1 ('0001_init')"), std::string::npos);
}

}  // namespace
}  // namespace backhaul::jobs
