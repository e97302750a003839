// The inotify instances this process holds, counted from /proc/self/fd: how tests check that
// only waiters that follow releases hold one (the kernel allows a user 128 by default).
#pragma once

#include <chrono>
#include <filesystem>
#include <system_error>
#include <thread>

namespace gpulock::test_support {

inline int InotifyInstances() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::filesystem::path target = std::filesystem::read_symlink(entry.path(), error);
    if (!error && target.string() == "anon_inode:inotify") ++count;
  }
  return count;
}

// Whether the count falls to `at_most` within `limit`: an instance given back is closed in the
// background (a close waits for a kernel grace period), so it goes a few milliseconds later.
inline bool InotifyInstancesFallTo(int at_most,
                                   std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (InotifyInstances() > at_most) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace gpulock::test_support
