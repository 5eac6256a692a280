// The plugin as a file: what it exports, what its descriptor says, and its config contract.
#include <cstdio>
#include <ostream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "vercel_test_support.h"

namespace backhaul::vercel::testing {
namespace {

using nlohmann::json;

// Output of a shell command, and whether it exited with status 0.
struct CommandResult {
  std::string output;
  bool succeeded = false;
};

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe)) result.output += buffer;
  result.succeeded = pclose(pipe) == 0;
  return result;
}

TEST(VercelPluginFile, ExportsOnlyTheEntrySymbol) {
  const CommandResult nm = run_command("nm -D --defined-only '" + kPluginPath.string() + "' 2>&1");
  ASSERT_TRUE(nm.succeeded) << "nm failed (is binutils installed?): " << nm.output;
  std::set<std::string> symbols;
  std::istringstream lines(nm.output);
  for (std::string line; std::getline(lines, line);) {
    // "000000000009f960 D backhaul_entry": the name is the last field.
    const size_t space = line.find_last_of(' ');
    if (!line.empty()) symbols.insert(line.substr(space + 1));
  }
  EXPECT_EQ(symbols, std::set<std::string>{"backhaul_entry"}) << nm.output;
}

TEST_F(VercelTest, DescriptorDescribesTheVercelConnector) {
  const plugins::PluginInfo& info = plugin_.info();
  EXPECT_EQ(info.id, "vercel");
  EXPECT_EQ(info.version, "1.0.0");
  EXPECT_EQ(info.display_name, "Vercel");
  EXPECT_FALSE(info.description.empty());
  EXPECT_EQ(info.entity_types, std::vector<std::string>{"deployment"});
  EXPECT_EQ(info.default_entity_types, std::vector<std::string>{"deployment"});
  EXPECT_EQ(info.abi_version.major, BACKHAUL_ABI_VERSION_MAJOR);
}

TEST_F(VercelTest, ConfigSchemaIsTheOneInSchemasDirectory) {
  const json schema = json::parse(plugin_.info().config_schema_json);
  EXPECT_EQ(schema, read_json(kSchemaPath));
  EXPECT_EQ(schema.at("type"), "object");
  EXPECT_EQ(schema.at("additionalProperties"), false);
  std::set<std::string> keys;
  for (const auto& [key, value] : schema.at("properties").items()) keys.insert(key);
  EXPECT_EQ(keys, (std::set<std::string>{"base_url", "team_id", "limit", "timeout_ms"}));
  EXPECT_EQ(schema["properties"]["base_url"]["default"], "https://api.vercel.com");
  EXPECT_EQ(schema["properties"]["limit"]["default"], 100);
  EXPECT_EQ(schema["properties"]["limit"]["maximum"], 100);
  EXPECT_EQ(schema["properties"]["timeout_ms"]["default"], 30000);
}

// --- config ----------------------------------------------------------------------------------

TEST_F(VercelTest, AcceptsEmptyAndCompleteConfigs) {
  EXPECT_NO_THROW(plugin_.validate_config(""));
  EXPECT_NO_THROW(plugin_.validate_config("{}"));
  EXPECT_NO_THROW(plugin_.validate_config(R"({"base_url":"https://api.vercel.com/",
      "team_id":"team_a1B2c3","limit":1,"timeout_ms":5000})"));
  EXPECT_NO_THROW(plugin_.validate_config(R"({"base_url":"http://127.0.0.1:8089","limit":100})"));
  EXPECT_NO_THROW(connector(R"({"team_id":"team_a1B2c3"})"));
}

struct BadConfig {
  const char* json;
  const char* names;  // the message must contain this
};

void PrintTo(const BadConfig& config, std::ostream* out) { *out << config.json; }

class VercelBadConfigTest : public VercelTest, public ::testing::WithParamInterface<BadConfig> {};

TEST_P(VercelBadConfigTest, IsRejectedNamingTheField) {
  const BadConfig& bad = GetParam();
  const plugins::ConnectorFailure from_validate =
      failure_of([&] { plugin_.validate_config(bad.json); });
  EXPECT_EQ(from_validate.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(from_validate.what()).find(bad.names), std::string::npos)
      << from_validate.what();
  // The constructor shares the parser: same status, same message.
  const plugins::ConnectorFailure from_create = failure_of([&] { connector(bad.json); });
  EXPECT_EQ(from_create.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_STREQ(from_create.what(), from_validate.what());
}

INSTANTIATE_TEST_SUITE_P(
    Config, VercelBadConfigTest,
    ::testing::Values(
        BadConfig{R"({"base_ur":"https://api.vercel.com"})", "base_ur"},
        BadConfig{R"({"teamId":"team_1"})", "teamId"}, BadConfig{R"({"base_url":5})", "base_url"},
        BadConfig{R"({"base_url":"ftp://api.vercel.com"})", "base_url"},
        BadConfig{R"({"base_url":"api.vercel.com"})", "base_url"},
        BadConfig{R"({"base_url":"https://"})", "base_url"},
        BadConfig{R"({"base_url":"https://api.vercel.com?x=1"})", "base_url"},
        BadConfig{R"({"team_id":7})", "team_id"}, BadConfig{R"({"team_id":""})", "team_id"},
        BadConfig{R"({"team_id":null})", "team_id"}, BadConfig{R"({"limit":"100"})", "limit"},
        BadConfig{R"({"limit":2.5})", "limit"}, BadConfig{R"({"limit":0})", "limit"},
        BadConfig{R"({"limit":101})", "limit"},
        BadConfig{R"({"limit":18446744073709551615})", "limit"},
        BadConfig{R"({"timeout_ms":"30s"})", "timeout_ms"},
        BadConfig{R"({"timeout_ms":-1})", "timeout_ms"},
        BadConfig{R"({"timeout_ms":true})", "timeout_ms"}, BadConfig{R"({"limit":)", "JSON"},
        BadConfig{R"([{"limit":10}])", "object"}));

TEST_F(VercelTest, TrailingSlashInBaseUrlIsTolerated) {
  reply("https://vercel.example.test/api/v6/deployments?projectId=prj_1&limit=100", 200,
        R"({"deployments":[],"pagination":null})");
  const plugins::Page page =
      connector(R"({"base_url":"https://vercel.example.test/api//"})").fetch_page(params("prj_1"));
  EXPECT_EQ(page.size(), 0u);
  EXPECT_TRUE(transport_.unmatched().empty());
}

TEST_F(VercelTest, RequestTimeoutComesFromConfig) {
  reply(list_url("prj_1"), 200, R"({"deployments":[]})");
  connector().fetch_page(params("prj_1"));
  connector(R"({"timeout_ms":1234})").fetch_page(params("prj_1"));
  const std::vector<http::Request> asked = requests();
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[0].timeout.count(), 30000);
  EXPECT_EQ(asked[1].timeout.count(), 1234);
}

}  // namespace
}  // namespace backhaul::vercel::testing
