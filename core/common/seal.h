// Sealing a memfd against change, for the in-memory copies of plugin libraries.
#pragma once

#include <cerrno>
#include <chrono>
#include <functional>
#include <thread>

#include <fcntl.h>

namespace backhaul {

// Adds `seals` to the memfd `fd`; 0, or the errno of the last try. F_SEAL_WRITE fails with EBUSY
// while a page of the file is still referenced from elsewhere: a writable shared mapping, or a
// page the kernel itself holds for a moment (an LRU batch of another CPU, compaction). The kernel
// waits about 150 ms for such pages and then gives up, which a loaded machine can outlast, so an
// EBUSY is tried again, `tries` times in all, calling `pause(n)` before the n-th retry.
inline int add_seals(int fd, int seals, int tries, const std::function<void(int)>& pause) {
  for (int attempt = 1;; ++attempt) {
    if (::fcntl(fd, F_ADD_SEALS, seals) == 0) return 0;
    const int error = errno;
    if (error != EBUSY || attempt >= tries) return error;
    pause(attempt);
  }
}

// As above, waiting 50 ms before the first retry and 50 ms more before each next one: up to about
// 1.4 s of pauses, beside the kernel's own waits.
inline int add_seals(int fd, int seals) {
  return add_seals(fd, seals, 8, [](int retry) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50) * retry);
  });
}

}  // namespace backhaul
