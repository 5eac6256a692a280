#include "core/common/seal.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/common/unique_fd.h"
#include <sys/mman.h>
#include <unistd.h>

namespace backhaul {
namespace {

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

// A memfd of one page, mapped writable and shared: F_SEAL_WRITE fails with EBUSY until the
// mapping is gone, as it does while the kernel holds one of the file's pages.
struct MappedMemfd {
  UniqueFd fd{::memfd_create("seal-test", MFD_CLOEXEC | MFD_ALLOW_SEALING)};
  void* map = MAP_FAILED;
  size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

  MappedMemfd() {
    EXPECT_TRUE(fd) << std::strerror(errno);
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0) << std::strerror(errno);
    map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    EXPECT_NE(map, MAP_FAILED) << std::strerror(errno);
  }
  void unmap() {
    if (map != MAP_FAILED) ::munmap(map, size);
    map = MAP_FAILED;
  }
  ~MappedMemfd() { unmap(); }
};

TEST(AddSealsTest, ABusyFileIsTriedAgainAfterAPauseUntilItCanBeSealed) {
  MappedMemfd file;
  std::vector<int> pauses;
  const int error = add_seals(file.fd.get(), kSeals, 8, [&](int retry) {
    pauses.push_back(retry);
    if (retry == 2) file.unmap();
  });
  EXPECT_EQ(error, 0) << std::strerror(error);
  EXPECT_EQ(pauses, (std::vector<int>{1, 2}));
  EXPECT_EQ(::fcntl(file.fd.get(), F_GET_SEALS) & kSeals, kSeals);
  EXPECT_EQ(::write(file.fd.get(), "x", 1), -1) << "a sealed file took a write";
}

TEST(AddSealsTest, AFileThatStaysBusyReportsEbusyAfterTheLastTry) {
  MappedMemfd file;
  int pauses = 0;
  EXPECT_EQ(add_seals(file.fd.get(), kSeals, 3, [&](int) { ++pauses; }), EBUSY);
  EXPECT_EQ(pauses, 2) << "3 tries, 2 pauses between them";
  EXPECT_EQ(::fcntl(file.fd.get(), F_GET_SEALS) & F_SEAL_WRITE, 0);
}

TEST(AddSealsTest, AnErrorOtherThanBusyIsNotTriedAgain) {
  UniqueFd fd(::memfd_create("seal-test", MFD_CLOEXEC));  // without MFD_ALLOW_SEALING
  ASSERT_TRUE(fd) << std::strerror(errno);
  int pauses = 0;
  EXPECT_EQ(add_seals(fd.get(), kSeals, 8, [&](int) { ++pauses; }), EPERM);
  EXPECT_EQ(pauses, 0);
}

}  // namespace
}  // namespace backhaul
