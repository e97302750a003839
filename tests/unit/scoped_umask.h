// ScopedUmask: sets the process's umask for one scope, for tests of how files are created.
#pragma once

#include <sys/stat.h>

namespace gpulock::test_support {

class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

}  // namespace gpulock::test_support
