// backhaul-bench queue, run as a process on small workloads: the final state it reports is the
// workload's (W1: every job completed once; W2: 99% completed, 1% dead, the handler calls the
// failures imply), its line has the peers' result fields, MySQL runs name the server and count its
// CPU, and options that cannot apply are refused with the reason. Outcomes and fields only: no
// figure here is a speed.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/proc.h"
#include "tests/host/daemon/child_process.h"
#include <unistd.h>

namespace backhaul {
namespace {

namespace fs = std::filesystem;
using daemon::testing::ChildProcess;
using daemon::testing::CommandResult;
using daemon::testing::run_command;
using nlohmann::json;

std::string first_line(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(path.string() +
                             " does not exist: run this test through ctest, whose fixture "
                             "`mariadb` starts the server");
  }
  std::string line;
  std::getline(in, line);
  return line;
}

class QueueBench : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("backhaul-bench-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CommandResult bench(std::vector<std::string> args) {
    args.insert(args.begin(), "queue");
    return run_command(BACKHAUL_BENCH_PATH, args, {}, dir_, std::chrono::seconds(240));
  }

  // The one JSON line of a run that must succeed.
  json line_of(const std::vector<std::string>& args) {
    CommandResult r = bench(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    json line = json::parse(r.out);
    EXPECT_TRUE(line.is_object()) << r.out;
    return line;
  }

  static std::string mysql() {
    return first_line(fs::path(BACKHAUL_MARIADB_DIR) / "connection.txt");
  }
  static std::string server_pid() {
    return first_line(fs::path(BACKHAUL_MARIADB_DIR) / "mysqld.pid");
  }

  fs::path dir_;
};

// The fields of shared/bench's result lines that every one of ours carries too.
void expect_peer_fields(const json& line) {
  for (const char* field : {"peer",
                            "workload",
                            "n",
                            "seconds",
                            "jobs_per_s",
                            "enqueue_s",
                            "enqueue_jobs_per_s",
                            "process_s",
                            "process_jobs_per_s",
                            "worker_start_to_first_claim_s",
                            "server_rss_kb",
                            "client_rss_kb",
                            "server_cpu_s",
                            "client_cpu_s",
                            "ok",
                            "completed",
                            "dead",
                            "handler_calls",
                            "expected_handler_calls",
                            "batch_enqueue",
                            "enqueue_api",
                            "settings",
                            "version",
                            "rep",
                            "config",
                            "server_version",
                            "durability"}) {
    EXPECT_TRUE(line.contains(field)) << field << " missing from " << line.dump();
  }
}

TEST_F(QueueBench, SqliteLifecycleCompletesEveryJobOnce) {
  json line = line_of({"--store", "sqlite", "--jobs", "300", "--claim-batch", "16", "--prefetch",
                       "16", "--rep", "7"});
  expect_peer_fields(line);
  EXPECT_EQ(line["workload"], "W1");
  EXPECT_EQ(line["config"], "sqlite");
  EXPECT_EQ(line["n"], 300);
  EXPECT_EQ(line["rep"], 7);
  EXPECT_TRUE(line["ok"].get<bool>());
  EXPECT_EQ(line["completed"], 300);
  EXPECT_EQ(line["dead"], 0);
  EXPECT_EQ(line["handler_calls"], 300);
  EXPECT_EQ(line["expected_handler_calls"], 300);
  EXPECT_EQ(line["settings"]["claim_batch"], 16);
  EXPECT_EQ(line["settings"]["prefetch"], 16);
  EXPECT_EQ(line["settings"]["max_in_flight"], 8 + 16);
  EXPECT_EQ(line["settings"]["idle_poll_ms"], 5);
  EXPECT_TRUE(line["version"]["backhaul"].is_string()) << line["version"];
  // Taken before the scheduler starts, as the peers take tWorkerStart before their worker.
  EXPECT_GE(line["worker_start_to_first_claim_s"].get<double>(), 0);
  EXPECT_TRUE(line["server_cpu_s"].is_null());  // no server: the store is in the process
  EXPECT_EQ(line["server_version"], "sqlite (embedded)");
  EXPECT_EQ(line["durability"], "synchronous=FULL");
  EXPECT_GT(line["seconds"].get<double>(), 0);
}

TEST_F(QueueBench, SqliteRetriesEndWithTheFailingJobsDead) {
  // 500 jobs: i % 100 == 1 always fails (5 dead after 3 attempts), i % 5 == 0 fails once (100).
  json line = line_of({"--store", "sqlite", "--workload", "retries", "--jobs", "500"});
  expect_peer_fields(line);
  EXPECT_EQ(line["workload"], "W2");
  EXPECT_TRUE(line["ok"].get<bool>());
  EXPECT_EQ(line["completed"], 495);
  EXPECT_EQ(line["dead"], 5);
  EXPECT_EQ(line["handler_calls"], 500 + 100 + 2 * 5);
  EXPECT_EQ(line["expected_handler_calls"], 610);
}

TEST_F(QueueBench, RetriesExpectExactlyWhatThePeersCountForAnyN) {
  // The peers' w2Expected() loops over i: for 150 jobs, i = 1 and 101 die (2, not 150 / 100),
  // 30 fail once; for 1 job, job 0 fails once (i % 5 == 0) and then succeeds.
  json line = line_of({"--store", "sqlite", "--workload", "retries", "--jobs", "150"});
  EXPECT_TRUE(line["ok"].get<bool>()) << line.dump();
  EXPECT_EQ(line["completed"], 148);
  EXPECT_EQ(line["dead"], 2);
  EXPECT_EQ(line["handler_calls"], 150 + 30 + 2 * 2);
  EXPECT_EQ(line["expected_handler_calls"], 184);

  line = line_of({"--store", "sqlite", "--workload", "retries", "--jobs", "1"});
  EXPECT_TRUE(line["ok"].get<bool>()) << line.dump();
  EXPECT_EQ(line["completed"], 1);
  EXPECT_EQ(line["dead"], 0);
  EXPECT_EQ(line["handler_calls"], 2);
  EXPECT_EQ(line["expected_handler_calls"], 2);
}

TEST_F(QueueBench, BadNumbersAreRefusedNamingTheOption) {
  const std::vector<std::vector<std::string>> cases = {
      {"--jobs", "-5"},        {"--jobs", "0"},        {"--claim-batch", "-3"},
      {"--claim-batch", "0"},  {"--concurrency", "0"}, {"--concurrency", "-2"},
      {"--prefetch", "-1"},    {"--keys", "0"},        {"--processes", "0"},
      {"--per-key-cap", "-1"}, {"--global-cap", "-1"}, {"--rep", "0"},
      {"--store", "postgres"}, {"--workload", "w3"}};
  for (const std::vector<std::string>& args : cases) {
    CommandResult r =
        args[0] == "--store" ? bench(args) : bench({"--store", "sqlite", args[0], args[1]});
    EXPECT_NE(r.exit_code, 0) << args[0] << " " << args[1];
    EXPECT_NE(r.err.find(args[0]), std::string::npos) << args[0] << " " << args[1] << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST_F(QueueBench, OptionsTheWorkloadCannotUseAreRefusedNamingThem) {
  const std::vector<std::vector<std::string>> latency = {
      {"--processes", "2"},   {"--keys", "10"},       {"--prefetch", "4"},
      {"--claim-batch", "8"}, {"--per-key-cap", "1"}, {"--global-cap", "1"}};
  for (const std::vector<std::string>& args : latency) {
    CommandResult r =
        bench({"--store", "sqlite", "--workload", "latency", "--jobs", "5", args[0], args[1]});
    EXPECT_NE(r.exit_code, 0) << args[0];
    EXPECT_NE(r.err.find(args[0] + " does not apply to --workload latency"), std::string::npos)
        << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  CommandResult retries = bench({"--store", "sqlite", "--workload", "retries", "--processes", "2"});
  EXPECT_NE(retries.exit_code, 0);
  EXPECT_NE(retries.err.find("--processes is for the lifecycle workload"), std::string::npos)
      << retries.err;
  CommandResult mysql = bench({"--store", "sqlite", "--mysql", "host=127.0.0.1", "--jobs", "5"});
  EXPECT_NE(mysql.exit_code, 0);
  EXPECT_NE(mysql.err.find("--mysql is for --store mysql"), std::string::npos) << mysql.err;
}

// The parent stops its workers with SIGTERM as soon as the handlers have run every job: with 5
// jobs that can come before a worker is ready for it. Every run must still end well.
TEST_F(QueueBench, SqliteWorkerProcessesStoppedEarlyStillEndTheRun) {
  for (int run = 0; run < 8; ++run) {
    json line = line_of({"--store", "sqlite", "--jobs", "5", "--processes", "3"});
    EXPECT_TRUE(line["ok"].get<bool>()) << line.dump();
    EXPECT_EQ(line["handler_calls"], 5);
    // The producer's peak plus every worker's, as the peers' one client process counts both.
    EXPECT_GT(line["client_rss_kb"].get<int64_t>(), line["worker_rss_kb"].get<int64_t>());
  }
}

// A worker that dies mid-run ends the run with an error naming it; the other workers are stopped
// and reaped, and the run's temp SQLite file is removed.
TEST_F(QueueBench, AWorkerThatDiesEndsTheRunAndLeavesNothingBehind) {
  // One key capped at 1: the jobs run one at a time, so the run is still going when a worker dies.
  ChildProcess parent(BACKHAUL_BENCH_PATH,
                      {"queue", "--store", "sqlite", "--jobs", "5000", "--keys", "1",
                       "--per-key-cap", "1", "--processes", "2"},
                      {"TMPDIR=" + dir_.string()}, dir_ / "err.txt", dir_ / "out.txt");
  std::vector<pid_t> workers;
  for (int i = 0; i < 1000 && workers.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    workers = child_pids(parent.pid());
  }
  ASSERT_EQ(workers.size(), 2u) << parent.stderr_text();
  ASSERT_EQ(::kill(workers[0], SIGKILL), 0);
  const int status = parent.wait_exit(std::chrono::seconds(30));
  ASSERT_NE(status, -1) << "the run went on without its worker";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(parent.stderr_text().find("worker process " + std::to_string(workers[0])),
            std::string::npos)
      << parent.stderr_text();
  for (pid_t worker : workers) {
    EXPECT_FALSE(fs::exists("/proc/" + std::to_string(worker))) << "worker " << worker << " left";
  }
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().rfind("backhaul-bench-", 0), std::string::npos)
        << entry.path() << " left behind";
  }
}

TEST_F(QueueBench, MysqlRetriesNameTheServerAndCountItsCpu) {
  json line =
      line_of({"--store", "mysql", "--mysql", mysql(), "--workload", "retries", "--jobs", "500",
               "--claim-batch", "64", "--prefetch", "64", "--server-pid", server_pid()});
  expect_peer_fields(line);
  EXPECT_EQ(line["config"], "mysql");
  EXPECT_TRUE(line["ok"].get<bool>());
  EXPECT_EQ(line["completed"], 495);
  EXPECT_EQ(line["dead"], 5);
  EXPECT_EQ(line["handler_calls"], 610);
  ASSERT_TRUE(line["server_cpu_s"].is_number()) << line.dump();
  EXPECT_GT(line["server_cpu_s"].get<double>(), 0);  // it created a database and ran the jobs
  EXPECT_NE(line["server_version"].get<std::string>().find("MariaDB"), std::string::npos)
      << line["server_version"];
  EXPECT_EQ(line["durability"], "flush_log_at_trx_commit=1");
}

TEST_F(QueueBench, MysqlLifecycleSharedByTwoWorkerProcesses) {
  json line = line_of({"--store", "mysql", "--mysql", mysql(), "--jobs", "400", "--processes", "2",
                       "--claim-batch", "32", "--prefetch", "32"});
  EXPECT_TRUE(line["ok"].get<bool>());
  EXPECT_EQ(line["processes"], 2);
  EXPECT_EQ(line["completed"], 400);
  EXPECT_EQ(line["handler_calls"], 400);        // summed over the workers: each job ran once
  EXPECT_TRUE(line["server_cpu_s"].is_null());  // no --server-pid
}

TEST_F(QueueBench, ServerPidIsRefusedWhereItCannotApply) {
  CommandResult sqlite = bench({"--store", "sqlite", "--server-pid", std::to_string(::getpid())});
  EXPECT_NE(sqlite.exit_code, 0);
  EXPECT_NE(sqlite.err.find("--server-pid is for --store mysql"), std::string::npos) << sqlite.err;
  EXPECT_TRUE(sqlite.out.empty()) << sqlite.out;

  // pid_max itself is never a process's PID.
  const std::string no_process = first_line("/proc/sys/kernel/pid_max");
  CommandResult gone =
      bench({"--store", "mysql", "--mysql", mysql(), "--server-pid", no_process, "--jobs", "10"});
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_NE(gone.err.find("cannot read /proc/" + no_process + "/stat"), std::string::npos)
      << gone.err;
  EXPECT_TRUE(gone.out.empty()) << gone.out;
}

}  // namespace
}  // namespace backhaul
