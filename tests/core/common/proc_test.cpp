// What core/common/proc.h reads from /proc, checked against this process and a child of it.
#include "core/common/proc.h"

#include <algorithm>
#include <csignal>
#include <thread>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

namespace backhaul {
namespace {

TEST(Proc, ReadsThisProcess) {
  const std::optional<ProcStat> self = read_proc_stat(::getpid());
  ASSERT_TRUE(self);
  EXPECT_EQ(self->ppid, ::getppid());
  EXPECT_EQ(self->state, 'R') << "this thread is running";
  EXPECT_EQ(self->comm, "common_test");
  EXPECT_GT(resident_kb(::getpid()), 0);
}

// A child that has ended is a zombie until it is reaped; then nothing of it is left to read.
TEST(Proc, SeesAChildAsAZombieUntilItIsReaped) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  std::optional<ProcStat> stat;
  for (int i = 0; i < 2000; ++i) {  // until the child has ended: readiness, not timing
    stat = read_proc_stat(child);
    if (stat && stat->state == 'Z') break;
    ::usleep(1000);
  }
  ASSERT_TRUE(stat);
  EXPECT_EQ(stat->state, 'Z');
  EXPECT_EQ(stat->ppid, ::getpid());
  const std::vector<pid_t> children = child_pids(::getpid());
  EXPECT_NE(std::find(children.begin(), children.end(), child), children.end());

  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_FALSE(read_proc_stat(child));
  EXPECT_EQ(resident_kb(child), 0);
  const std::vector<pid_t> after = child_pids(::getpid());
  EXPECT_EQ(std::find(after.begin(), after.end(), child), after.end());
}

// A process reaped while its /proc file is being read reads as gone. The kernel fails a read of a
// file opened before the reap with ESRCH, which an std::ifstream threw as "basic_filebuf::
// underflow error reading the file: No such process" (seen in CI, from a test watching plugin
// workers end). Each child here is killed and reaped by another thread while this one reads it.
TEST(Proc, AProcessReapedDuringAReadReadsAsGone) {
  int gone = 0;
  for (int round = 0; round < 1000; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (;;) ::pause();
    }
    std::thread reaper([child] {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
    });
    bool ended = false;
    for (int i = 0; i < 1'000'000 && !ended; ++i) {
      try {
        ended =
            !read_proc_stat(child) || resident_kb(child) == 0 || !read_proc_file(child, "status");
      } catch (const std::exception& e) {
        ADD_FAILURE() << "reading child " << child << " threw: " << e.what();
        ended = true;
      }
    }
    reaper.join();
    gone += ended;
    EXPECT_FALSE(read_proc_stat(child));
    EXPECT_FALSE(read_proc_file(child, "stat"));
  }
  EXPECT_EQ(gone, 1000);
}

}  // namespace
}  // namespace backhaul
