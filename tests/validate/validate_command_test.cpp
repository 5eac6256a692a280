// The built `backhaul plugin validate` binary: exit status, text lines, and a --json document
// that satisfies schemas/validate-report.schema.json.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/utf8.h"
#include "core/validate/report.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace {

using backhaul::escape_controls;
using nlohmann::json;

struct CliRun {
  int exit_code = -1;
  std::string out;
};

// Runs the CLI with `args` (already shell-quoted where needed); stderr is left to the test log.
CliRun run_cli(const std::string& args) {
  const std::string command = std::string(VALIDATE_BACKHAUL_CLI) + " " + args;
  CliRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return run;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.out.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

json read_json_file(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

// Enough of JSON Schema for the report schema: type, const, enum, required, properties,
// additionalProperties: false, items, $ref to #/$defs, minimum, maximum, pattern. Returns the
// first violation, or "" when `value` conforms.
class MiniSchema {
 public:
  explicit MiniSchema(json root) : root_(std::move(root)) {}
  std::string check(const json& value) const { return check(root_, value, "$"); }

 private:
  static bool has_type(const json& v, const std::string& type) {
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "integer") return v.is_number_integer();
    if (type == "number") return v.is_number();
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    return false;
  }

  std::string check(const json& s, const json& v, const std::string& at) const {
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"].get<std::string>();  // "#/$defs/name"
      return check(root_["$defs"][ref.substr(ref.rfind('/') + 1)], v, at);
    }
    if (s.contains("type")) {
      bool ok = false;
      for (const json& t : s["type"].is_array() ? s["type"] : json::array({s["type"]}))
        ok = ok || has_type(v, t.get<std::string>());
      if (!ok) return at + ": not of type " + s["type"].dump();
    }
    if (s.contains("const") && v != s["const"]) return at + ": not " + s["const"].dump();
    if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
      return at + ": " + v.dump() + " not in " + s["enum"].dump();
    if (v.is_number() && s.contains("minimum") && v < s["minimum"]) return at + ": below minimum";
    if (v.is_number() && s.contains("maximum") && v > s["maximum"]) return at + ": above maximum";
    if (v.is_string() && s.contains("pattern") &&
        !std::regex_search(v.get<std::string>(), std::regex(s["pattern"].get<std::string>())))
      return at + ": does not match " + s["pattern"].get<std::string>();
    if (v.is_object()) return check_object(s, v, at);
    if (v.is_array() && s.contains("items")) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (auto e = check(s["items"], v[i], at + "[" + std::to_string(i) + "]"); !e.empty())
          return e;
      }
    }
    return "";
  }

  std::string check_object(const json& s, const json& v, const std::string& at) const {
    for (const json& key : s.value("required", json::array())) {
      if (!v.contains(key.get<std::string>())) return at + ": missing " + key.dump();
    }
    const json properties = s.value("properties", json::object());
    for (const auto& [key, member] : v.items()) {
      if (properties.contains(key)) {
        if (auto e = check(properties[key], member, at + "." + key); !e.empty()) return e;
      } else if (s.value("additionalProperties", true) == false) {
        return at + ": unexpected member " + key;
      }
    }
    return "";
  }

  json root_;
};

TEST(ValidateCommandTest, GithubConnectorPassesWithJsonReport) {
  CliRun run = run_cli(std::string("plugin validate ") + VALIDATE_GITHUB_PLUGIN + " --fixtures " +
                       VALIDATE_CONNECTOR_FIXTURES + "/github --json --timeout-ms 60000");
  EXPECT_EQ(run.exit_code, 0) << run.out;
  json report = json::parse(run.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << "stdout is not one JSON document:\n" << run.out;
  EXPECT_EQ(MiniSchema(read_json_file(VALIDATE_REPORT_SCHEMA)).check(report), "");
  EXPECT_EQ(report["result"], "PASS");
  EXPECT_EQ(report["plugin"]["id"], "github");
  EXPECT_EQ(report["strictness"], 10);
  EXPECT_EQ(report["summary"]["failed"], 0);
  EXPECT_EQ(report["summary"]["total"], report["checks"].size());
  for (const json& check : report["checks"]) EXPECT_EQ(check["status"], "PASS") << check.dump();
}

TEST(ValidateCommandTest, PluginThatSegfaultsInEveryCallExitsOne) {
  CliRun run = run_cli(std::string("plugin validate ") + VALIDATE_PLUGIN_DIR +
                       "/broken_segv_always.so --fixtures " + VALIDATE_REFERENCE_FIXTURES +
                       " --timeout-ms 5000");
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find("FAIL  lifecycle    config_accepted"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("killed by SIGSEGV (Segmentation fault) in create()"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("PASS  static       loader_accepts"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find(" failed, 0 skipped (strictness 10)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.rfind(": FAIL\n"), std::string::npos) << run.out;
}

TEST(ValidateCommandTest, JsonReportOfAFailingPluginMatchesTheSchema) {
  CliRun run = run_cli(std::string("plugin validate ") + VALIDATE_PLUGIN_DIR +
                       "/broken_wrong_abi.so --json");
  EXPECT_EQ(run.exit_code, 1) << run.out;
  json report = json::parse(run.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << run.out;
  EXPECT_EQ(MiniSchema(read_json_file(VALIDATE_REPORT_SCHEMA)).check(report), "");
  EXPECT_EQ(report["result"], "FAIL");
  EXPECT_TRUE(report["plugin"]["id"].is_null());
  EXPECT_EQ(report["fixtures"], nullptr);
}

// A fixtures file the validator cannot read is an error of the run (exit 2) naming the file, not
// a failed check (exit 1): a field of the wrong type escaped as nlohmann's type_error, exit 1.
//
// Review: a fixture nested 200 000 deep (a body, or validate.json's config) ended the validator
// with SIGSEGV, dumped back to text recursively; a *.json that is a symbolic link to itself
// escaped as a std::filesystem_error, exit 1. Each is refused, naming the file.
TEST(ValidateCommandTest, UnreadableFixturesExitTwo) {
  const std::string exchange_head = R"({"exchanges":[{"request":)";
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  struct Case {
    std::string file;
    std::string text;  // empty: a symbolic link to itself
    std::string why;
  };
  const std::vector<Case> cases = {
      {"broken.json", "{not json", "not valid JSON"},
      {"broken.json",
       exchange_head + R"({"method":null,"url":"https://x/"},"response":{"status":200}}]})",
       "request.method must be a string"},
      {"broken.json",
       exchange_head +
           R"({"url":"https://x/"},"response":{"status":200,"headers":{"link":[1]}}}]})",
       "headers.link must hold strings"},
      {"broken.json",
       exchange_head + R"({"url":"https://x/"},"response":{"status":200,"url":5}}]})",
       "response.url must be a string"},
      {"broken.json",
       exchange_head + R"({"url":"https://x/"},"response":{"status":200,"body":)" + deep + "}}]}",
       ": nests 200004 levels deep, more than 256"},
      {"validate.json", R"({"config":)" + deep + "}", ": nests 200001 levels deep, more than 256"},
      {"loop.json", "", ": Too many levels of symbolic links"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].file + ": " + cases[i].text.substr(0, 80));
    const std::string dir = ::testing::TempDir() + "validate_bad_fixtures_" + std::to_string(i);
    std::filesystem::create_directories(dir);
    const std::string file = dir + "/" + cases[i].file;
    if (cases[i].text.empty()) {
      std::filesystem::create_symlink(cases[i].file, file);
    } else {
      std::ofstream(file) << cases[i].text;
    }
    CliRun run = run_cli(std::string("plugin validate ") + VALIDATE_PLUGIN_DIR +
                         "/reference.so --fixtures " + dir + " 2>&1");
    EXPECT_EQ(run.exit_code, 2) << run.out;
    EXPECT_NE(run.out.find(file), std::string::npos) << run.out;
    EXPECT_NE(run.out.find(cases[i].why), std::string::npos) << run.out;
    std::filesystem::remove_all(dir);
  }
  // A directory that does not exist is one too (CLI11's own check exited 105).
  const CliRun missing = run_cli(std::string("plugin validate ") + VALIDATE_PLUGIN_DIR +
                                 "/reference.so --fixtures /nonexistent/fixtures 2>&1");
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("/nonexistent/fixtures"), std::string::npos) << missing.out;
  // So is a plugin file that does not exist, as a plugin id found nowhere is (it exited 1, as if
  // checks had failed).
  const CliRun no_plugin = run_cli("plugin validate /nonexistent/plugin.so 2>&1");
  EXPECT_EQ(no_plugin.exit_code, 2) << no_plugin.out;
  EXPECT_NE(no_plugin.out.find("plugin file '/nonexistent/plugin.so' does not exist"),
            std::string::npos)
      << no_plugin.out;
}

// Review: a report that could not be written (a full disk: /dev/full) exited 0, as if the plugin
// had passed. The run could not validate: exit 2, and a message on stderr.
TEST(ValidateCommandTest, AReportThatCannotBeWrittenExitsTwo) {
  for (const char* format : {" --json", ""}) {
    SCOPED_TRACE(format);
    const CliRun run = run_cli(std::string("plugin validate ") + VALIDATE_PLUGIN_DIR +
                               "/reference.so --strictness 1" + format + " 2>&1 >/dev/full");
    EXPECT_EQ(run.exit_code, 2) << run.out;
    EXPECT_NE(run.out.find("error: writing the output: No space left on device"),
              std::string::npos)
        << run.out;
  }
}

// A connector that bundles a library (found through $ORIGIN): `plugin info` names it with its
// hash, for an allow-list, and `plugin validate` loads it as the daemon does.
TEST(ValidateCommandTest, APluginThatBundlesALibraryIsLoadedAndItsLibraryListed) {
  const std::filesystem::path plugin = VALIDATE_ORIGIN_PLUGIN;
  const std::string library = (plugin.parent_path() / "libbhtestdep.so").string();
  CliRun info = run_cli("plugin info " + plugin.string() + " --json 2>/dev/null");
  ASSERT_EQ(info.exit_code, 0) << info.out;
  json described = json::parse(info.out, nullptr, false);
  ASSERT_FALSE(described.is_discarded()) << info.out;
  ASSERT_EQ(described["bundledLibraries"].size(), 1u) << info.out;
  EXPECT_EQ(described["bundledLibraries"][0]["path"], library);
  EXPECT_TRUE(std::regex_match(described["bundledLibraries"][0]["sha256"].get<std::string>(),
                               std::regex("[0-9a-f]{64}")))
      << info.out;
  CliRun text = run_cli("plugin info " + plugin.string() + " 2>/dev/null");
  EXPECT_NE(text.out.find("bundled library:      " + library + " (sha256 "), std::string::npos)
      << text.out;

  CliRun validate = run_cli("plugin validate " + plugin.string() + " 2>/dev/null");
  EXPECT_NE(validate.out.find("PASS  static       loader_accepts"), std::string::npos)
      << validate.out;
}

// Review: `plugin info` printed a plugin's name and description as they were, so a plugin could
// rewrite what the operator's terminal shows: an escape sequence and "\r" over the id line, a
// forged "sha256:" line after a newline, C1 controls, bidi overrides. They are escaped now.
TEST(ValidateCommandTest, PluginInfoShowsAPluginsTerminalControlsEscaped) {
  CliRun info =
      run_cli(std::string("plugin info ") + VALIDATE_HOSTILE_TEXT_PLUGIN + " 2>/dev/null");
  ASSERT_EQ(info.exit_code, 0) << info.out;
  EXPECT_NE(info.out.find("name:                 E\\x1b[2K\\rid: github\n"), std::string::npos)
      << info.out;
  EXPECT_NE(info.out.find("description:          fine\\nsha256: forged \\u009b2J "
                          "\\u202edesrever\n"),
            std::string::npos)
      << info.out;
  // The schema, indented, its characters outside ASCII as JSON escapes.
  EXPECT_NE(info.out.find("config schema:\n  {\n    \"description\": \"\\u202e\\u001b[2J\",\n"
                          "    \"type\": \"object\"\n  }\n"),
            std::string::npos)
      << info.out;
  for (const char* raw : {"\033", "\r", "\xC2\x9B", "\xE2\x80\xAE"})
    EXPECT_EQ(info.out.find(raw), std::string::npos) << "a raw control got through";
  size_t sha_lines = 0;
  for (size_t at = info.out.find("\nsha256:"); at != std::string::npos;
       at = info.out.find("\nsha256:", at + 1))
    ++sha_lines;
  EXPECT_EQ(sha_lines, 1u) << info.out;
}

TEST(EscapeControlsTest, C1ControlsAndBidiOverridesAreEscapedAndOtherTextKept) {
  // (Literals split where a hex escape would run on into the next letter.)
  EXPECT_EQ(escape_controls("a\xC2\x85"
                            "b\xE2\x80\xAA"
                            "c\xE2\x81\xA9"
                            "d"),
            "a\\u0085b\\u202ac\\u2069d");
  EXPECT_EQ(escape_controls("caf\xC3\xA9 \xE2\x80\x94 \xC2\xA0"),
            "caf\xC3\xA9 \xE2\x80\x94 \xC2\xA0");
  EXPECT_EQ(escape_controls("cut \xC2"), "cut \xC2");  // a lone lead byte is no control
  EXPECT_EQ(escape_controls("\xE2\x80\x8F"
                            "x\xE2\x80\xA8"
                            "y\xD8\x9C"
                            "z"),
            "\\u200fx\\u2028y\\u061cz");
}

// `plugin info` runs the plugin's init() and deinit() in-process: one that never returns ends
// the command after --timeout-ms with status 1 and a message saying so, instead of holding it.
// `plugin validate` (in children) says where its loader_accepts child hung.
TEST(ValidateCommandTest, APluginWhoseDeinitHangsEndsInfoAfterItsTimeoutAndFailsValidation) {
  CliRun info = run_cli(std::string("plugin info ") + VALIDATE_DEINIT_HANGS_PLUGIN +
                        " --timeout-ms 500 2>&1");
  EXPECT_EQ(info.exit_code, 1) << info.out;
  EXPECT_NE(info.out.find("id:                   deinithangs"), std::string::npos)
      << "printed before the unload: " << info.out;
  EXPECT_NE(info.out.find("was not loaded and unloaded within 500 ms"), std::string::npos)
      << info.out;

  CliRun validate = run_cli(std::string("plugin validate ") + VALIDATE_DEINIT_HANGS_PLUGIN +
                            " --timeout-ms 500 2>/dev/null");
  EXPECT_EQ(validate.exit_code, 1) << validate.out;
  EXPECT_TRUE(std::regex_search(
      validate.out,
      std::regex("FAIL  static +loader_accepts +timed out after 500 ms in deinit\\(\\) "
                 "\\(init\\(\\) had succeeded\\)")))
      << validate.out;
}

// `plugin info` and `fetch` run the plugin in-process: one that crashes ends the command with
// status 1 and a line naming the plugin and the signal, and where to look further, rather than
// the shell's bare "Aborted" (status 134).
TEST(ValidateCommandTest, APluginThatCrashesEndsInfoAndFetchWithALineSayingSo) {
  const std::string aborts = VALIDATE_INIT_ABORTS_PLUGIN;
  CliRun info = run_cli("plugin info " + aborts + " 2>&1");
  EXPECT_EQ(info.exit_code, 1) << info.out;
  EXPECT_EQ(info.out, "plugin info: " + aborts +
                          ": the plugin crashed while loading or unloading: killed by SIGABRT "
                          "(Aborted)\n`backhaul plugin validate " +
                          aborts + "` runs it in child processes and says where\n");

  const std::string fake = VALIDATE_FAKE_PLUGIN;
  CliRun fetch = run_cli("fetch --plugin " + fake +
                         R"( --config '{"fail": "abort"}' --token t --resource-id 9 2>&1)");
  EXPECT_EQ(fetch.exit_code, 1) << fetch.out;
  EXPECT_NE(fetch.out.find("fetch: the plugin " + fake + " crashed: killed by SIGABRT (Aborted)\n"),
            std::string::npos)
      << fetch.out;

  const std::string segv = std::string(VALIDATE_PLUGIN_DIR) + "/broken_segv_always.so";
  CliRun fault = run_cli("fetch --plugin " + segv + " --token t --resource-id 9 2>&1");
  EXPECT_EQ(fault.exit_code, 1) << fault.out;
  EXPECT_NE(fault.out.find("fetch: the plugin " + segv +
                           " crashed: killed by SIGSEGV (Segmentation fault)\n`backhaul plugin "
                           "validate " +
                           segv + "` runs it in child processes and says where\n"),
            std::string::npos)
      << fault.out;
}

// A crash with no frame of the plugin's code on the crashed thread's stack is the command's own:
// `fetch` says so, naming the plugin only as loaded. Here the signal comes from outside, while
// `fetch` waits on a gateway that takes the connection and never answers: the command's code, not
// the plugin's, is on the stack.
TEST(ValidateCommandTest, ACrashOutsideThePluginsCodeIsNotBlamedOnThePlugin) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string fake = VALIDATE_FAKE_PLUGIN;
  const std::string gateway = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port));

  int output[2];
  ASSERT_EQ(::pipe2(output, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, output[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, output[1], STDERR_FILENO);
  std::vector<std::string> args = {VALIDATE_BACKHAUL_CLI, "fetch", "--plugin",     fake,
                                   "--gateway",           gateway, "--connection", "c-1",
                                   "--resource-id",       "9",     "--timeout-ms", "60000"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(output[1]);

  pollfd waiting{listener, POLLIN, 0};  // the plugin is loaded, and fetch asks the gateway
  ASSERT_EQ(::poll(&waiting, 1, 30'000), 1);
  const int connection = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(connection, 0);
  // A SIGSEGV as a fault in the command's own code raises it: not sent by a process (kill()
  // would be reported as such), but given to its main thread with a fault's siginfo
  // (SEGV_MAPERR at address 0), through ptrace.
  ASSERT_EQ(::ptrace(PTRACE_SEIZE, pid, nullptr, nullptr), 0) << std::strerror(errno);
  ASSERT_EQ(::syscall(SYS_tgkill, pid, pid, SIGSEGV), 0);
  int stop = 0;
  ASSERT_EQ(::waitpid(pid, &stop, __WALL), pid);
  ASSERT_TRUE(WIFSTOPPED(stop) && WSTOPSIG(stop) == SIGSEGV) << stop;
  siginfo_t fault{};
  ASSERT_EQ(::ptrace(PTRACE_GETSIGINFO, pid, nullptr, &fault), 0);
  fault.si_code = SEGV_MAPERR;
  fault.si_addr = nullptr;
  ASSERT_EQ(::ptrace(PTRACE_SETSIGINFO, pid, nullptr, &fault), 0);
  ASSERT_EQ(::ptrace(PTRACE_DETACH, pid, nullptr, reinterpret_cast<void*>(SIGSEGV)), 0);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(output[0], buffer, sizeof buffer)) > 0) out.append(buffer, n);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(output[0]);
  ::close(connection);
  ::close(listener);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("fetch: crashed outside the code of the plugin " + fake +
                     ", which was loaded: killed by SIGSEGV (Segmentation fault)\nthat is a bug "
                     "in backhaul, not in the plugin: please report it\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("the plugin " + fake + " crashed"), std::string::npos) << out;
}

}  // namespace
