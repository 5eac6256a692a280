// The plugin as the host sees it before any fetch: exported symbols, descriptor, config checks.
#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "github_test_support.h"

namespace backhaul::github_test {
namespace {

using nlohmann::json;

// Output of a shell command; "" when it could not be started.
std::string run(const std::string& command, int* exit_status) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return {};
  std::string out;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe.get())) > 0) out.append(buffer.data(), n);
  *exit_status = pclose(pipe.release());
  return out;
}

TEST(GithubExportsTest, ExportsExactlyBackhaulEntry) {
  int status = -1;
  const std::string out =
      run(std::string("nm -D --defined-only '") + kPluginPath + "' 2>&1", &status);
  ASSERT_EQ(status, 0) << "nm failed or is missing (binutils is required): " << out;

  std::vector<std::string> symbols;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(start, end - start);
    if (!line.empty()) symbols.push_back(line.substr(line.find_last_of(' ') + 1));
    start = end + 1;
  }
  EXPECT_EQ(symbols, std::vector<std::string>{"backhaul_entry"}) << out;
}

using GithubDescriptorTest = GithubPluginTest;

TEST_F(GithubDescriptorTest, DescribesTheGithubConnector) {
  const plugins::PluginInfo& info = plugin().info();
  EXPECT_EQ(info.id, "github");
  EXPECT_EQ(info.version, "1.0.0");
  EXPECT_EQ(info.display_name, "GitHub");
  EXPECT_FALSE(info.description.empty());
  const std::vector<std::string> all = {"pull_request", "issue", "release"};
  EXPECT_EQ(info.entity_types, all);
  EXPECT_EQ(info.default_entity_types, all);
  EXPECT_EQ(info.abi_version.major, BACKHAUL_ABI_VERSION_MAJOR);
}

TEST_F(GithubDescriptorTest, ConfigSchemaEqualsTheInstalledSchemaFile) {
  const json in_plugin = json::parse(plugin().info().config_schema_json);
  const json on_disk =
      read_json(std::filesystem::path(BACKHAUL_SCHEMAS_DIR) / "connectors" / "github.schema.json");
  EXPECT_EQ(in_plugin, on_disk);

  EXPECT_EQ(in_plugin["type"], "object");
  EXPECT_EQ(in_plugin["additionalProperties"], false);
  const json& p = in_plugin["properties"];
  EXPECT_EQ(p["base_url"]["default"], "https://api.github.com");
  EXPECT_EQ(p["user_agent"]["default"], "backhaul-github/1.0");
  EXPECT_EQ(p["per_page"]["default"], 100);
  EXPECT_EQ(p["per_page"]["minimum"], 1);
  EXPECT_EQ(p["per_page"]["maximum"], 100);
  EXPECT_EQ(p["timeout_ms"]["default"], 30000);
}

TEST_F(GithubDescriptorTest, AcceptsDefaultsAndEveryKnownKey) {
  EXPECT_NO_THROW(plugin().validate_config("{}"));
  EXPECT_NO_THROW(plugin().validate_config(""));
  EXPECT_NO_THROW(plugin().validate_config(
      R"({"base_url":"https://ghe.example.com/api/v3/","user_agent":"acme-backfill/2.1",)"
      R"("per_page":1,"timeout_ms":5000})"));
  EXPECT_NO_THROW(
      plugin().validate_config(R"({"per_page":100,"base_url":"http://127.0.0.1:8080"})"));
  EXPECT_NO_THROW(connect(R"({"timeout_ms":4294967295})"));
}

TEST_F(GithubDescriptorTest, RejectsAnUnknownKeyByName) {
  const auto f = failure_of([&] { plugin().validate_config(R"({"per_pages":50})"); });
  EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(f.what()).find("unknown key \"per_pages\""), std::string::npos) << f.what();
}

TEST_F(GithubDescriptorTest, RejectsMalformedDocuments) {
  for (const char* config : {"{", "[]", "null", "42", "\"base_url\"", "{\"per_page\":}"}) {
    const auto f = failure_of([&] { plugin().validate_config(config); });
    EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT) << config;
    EXPECT_NE(std::string(f.what()).find("github config"), std::string::npos) << f.what();
  }
}

TEST_F(GithubDescriptorTest, CreateValidatesExactlyLikeValidateConfig) {
  const std::string config = R"({"per_page":0})";
  const auto validated = failure_of([&] { plugin().validate_config(config); });
  const auto created = failure_of([&] { connect(config); });
  EXPECT_EQ(created.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_STREQ(created.what(), validated.what());
}

struct BadField {
  const char* config;
  const char* field;  // the message must name it
};

void PrintTo(const BadField& bad, std::ostream* os) { *os << bad.config; }

class GithubConfigFieldTest : public GithubPluginTest,
                              public ::testing::WithParamInterface<BadField> {};

TEST_P(GithubConfigFieldTest, NamesTheFieldOfAWrongValue) {
  const auto f = failure_of([&] { plugin().validate_config(GetParam().config); });
  EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(f.what()).find(GetParam().field), std::string::npos)
      << GetParam().config << " -> " << f.what();
}

INSTANTIATE_TEST_SUITE_P(
    WrongTypesAndRanges, GithubConfigFieldTest,
    ::testing::Values(BadField{R"({"per_page":"100"})", "per_page"},
                      BadField{R"({"per_page":0})", "per_page"},
                      BadField{R"({"per_page":101})", "per_page"},
                      BadField{R"({"per_page":10.5})", "per_page"},
                      BadField{R"({"per_page":true})", "per_page"},
                      BadField{R"({"per_page":18446744073709551615})", "per_page"},
                      BadField{R"({"timeout_ms":-1})", "timeout_ms"},
                      BadField{R"({"timeout_ms":0})", "timeout_ms"},
                      BadField{R"({"timeout_ms":4294967296})", "timeout_ms"},
                      BadField{R"({"timeout_ms":"30s"})", "timeout_ms"},
                      BadField{R"({"base_url":5})", "base_url"},
                      BadField{R"({"base_url":"api.github.com"})", "base_url"},
                      BadField{R"({"base_url":"ftp://api.github.com"})", "base_url"},
                      BadField{R"({"base_url":"https://"})", "base_url"},
                      BadField{R"({"base_url":"https://api.github.com?x=1"})", "base_url"},
                      BadField{R"({"user_agent":""})", "user_agent"},
                      BadField{R"({"user_agent":null})", "user_agent"},
                      BadField{R"({"user_agent":"a\r\nX-Injected: 1"})", "user_agent"}));

}  // namespace
}  // namespace backhaul::github_test
