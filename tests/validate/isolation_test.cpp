// run_in_child on its own: results come back, and every way a child can end is told apart.
#include "core/validate/isolation.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace backhaul::validate {
namespace {

using namespace std::chrono_literals;

ChildLimits quick(std::chrono::milliseconds timeout = 2000ms, uint64_t memory = 0) {
  return {timeout, memory};
}

TEST(IsolationTest, ReturnsWhatTheChildReturns) {
  ChildOutcome out = run_in_child([] { return std::string("hello from the child"); }, quick());
  ASSERT_EQ(out.end, ChildEnd::kReturned);
  EXPECT_EQ(out.payload, "hello from the child");
}

TEST(IsolationTest, CarriesResultsLargerThanAPipeBuffer) {
  const std::string big(3 << 20, 'x');
  ChildOutcome out = run_in_child([&] { return big; }, quick());
  ASSERT_EQ(out.end, ChildEnd::kReturned);
  EXPECT_EQ(out.payload.size(), big.size());
}

TEST(IsolationTest, ReportsAnExceptionWithItsMessage) {
  ChildOutcome out =
      run_in_child([]() -> std::string { throw std::runtime_error("no such resource"); }, quick());
  ASSERT_EQ(out.end, ChildEnd::kThrew);
  EXPECT_EQ(out.describe(quick()), "no such resource");
}

TEST(IsolationTest, NamesTheSignalOfACrash) {
  ChildOutcome out = run_in_child(
      []() -> std::string {
        std::raise(SIGSEGV);
        return "unreachable";
      },
      quick());
  ASSERT_EQ(out.end, ChildEnd::kSignaled);
  EXPECT_EQ(out.signal, SIGSEGV);
  EXPECT_NE(out.describe(quick()).find("SIGSEGV"), std::string::npos) << out.describe(quick());
}

TEST(IsolationTest, QuotesStdTerminateOnAnAbort) {
  ChildOutcome out = run_in_child(
      []() -> std::string {
        std::fputs(
            "terminate called after throwing an instance of 'std::logic_error'\n"
            "  what():  broken invariant\n",
            stderr);
        std::abort();
      },
      quick());
  ASSERT_EQ(out.end, ChildEnd::kSignaled);
  const std::string text = out.describe(quick());
  EXPECT_NE(text.find("SIGABRT"), std::string::npos) << text;
  EXPECT_NE(text.find("broken invariant"), std::string::npos) << text;
}

TEST(IsolationTest, ReportsExitBeforeAResult) {
  ChildOutcome out = run_in_child(
      []() -> std::string {
        std::puts("plugin output goes to /dev/null, not into the report");
        std::exit(7);
      },
      quick());
  ASSERT_EQ(out.end, ChildEnd::kExited);
  EXPECT_EQ(out.exit_code, 7);
  EXPECT_NE(out.describe(quick()).find("exited with status 7"), std::string::npos);
}

TEST(IsolationTest, KillsAChildThatRunsPastTheDeadline) {
  const auto limits = quick(200ms);
  ChildOutcome out = run_in_child(
      []() -> std::string {
        volatile uint64_t spin = 0;
        for (;;) spin = spin + 1;
      },
      limits);
  ASSERT_EQ(out.end, ChildEnd::kTimedOut);
  EXPECT_LT(out.elapsed, 2000ms);
  EXPECT_NE(out.describe(limits).find("timed out after 200 ms"), std::string::npos);
}

// RLIMIT_AS makes the allocation fail (bad_alloc); under ASan the resident-set watchdog kills
// the child instead. Either way the child ends, and the parent survives.
TEST(IsolationTest, StopsAChildThatAllocatesWithoutBound) {
  const auto limits = quick(10'000ms, uint64_t{256} << 20);
  ChildOutcome out = run_in_child(
      []() -> std::string {
        std::vector<std::unique_ptr<char[]>> hoard;
        for (;;) {
          hoard.push_back(std::make_unique<char[]>(16 << 20));
          std::memset(hoard.back().get(), 1, 16 << 20);
        }
      },
      limits);
  ASSERT_TRUE(out.end == ChildEnd::kThrew || out.end == ChildEnd::kMemoryExceeded)
      << out.describe(limits);
  if (out.end == ChildEnd::kMemoryExceeded) {
    EXPECT_NE(out.describe(limits).find("memory limit of 256 MB"), std::string::npos);
  }
}

}  // namespace
}  // namespace backhaul::validate
