// Helper threads: the short-lived threads gpulock starts for itself (the background closers,
// the acquire mutex's kernel wait), listed by kernel thread id, so that a fork whose child runs
// on without exec (the detached lease holder) can first wait until they are gone.
//
// A child forked while another thread holds a lock inherits the lock held, by nobody: the
// child's first call that takes it waits forever. A helper that allocates or frees, or is
// exiting (the C library and a sanitizer runtime free the thread's caches then), holds its
// allocator's locks. glibc's malloc takes its own locks across fork(), but GCC 12's
// AddressSanitizer allocator does not (a detached holder hung so, in its first allocation), and
// POSIX promises a child of a threaded process only async-signal-safe calls. A thread is gone
// once /proc/self/task no longer lists it: its last user-space instruction, exit work included,
// has run.
#pragma once

#include <chrono>

namespace gpulock {

inline constexpr int kMaxHelperThreads = 128;

// A slot for a helper thread about to be created, counted as running from now on; -1 if every
// slot is taken (the thread is then not waited for). The thread calls helper_thread_started()
// first; if it cannot be created, the creator calls helper_thread_not_started().
int reserve_helper_thread();
void helper_thread_started(int slot);
void helper_thread_not_started(int slot);

// While one lives, the helper of `slot` is blocked in a kernel call that takes no user-space lock
// (a lock request that may wait for hours): wait_for_helper_threads() does not wait for it.
class HelperThreadBlocked {
 public:
  explicit HelperThreadBlocked(int slot);
  ~HelperThreadBlocked();
  HelperThreadBlocked(const HelperThreadBlocked&) = delete;
  HelperThreadBlocked& operator=(const HelperThreadBlocked&) = delete;

 private:
  int slot_;
};

// Waits until every listed helper thread is gone or blocked, or `patience` has passed; true if
// they were.
bool wait_for_helper_threads(std::chrono::milliseconds patience);

// How many listed helpers are not known to be gone (for tests).
int helper_threads_listed();

}  // namespace gpulock
