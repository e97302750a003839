// close_in_background: a detached thread per descriptor, which only closes it.
//
// The descriptors on their way out are listed in a fixed table of slots (fd + 1; 0 is free), so
// that a child forked before a closer reached its descriptor can close the copy it inherited:
// without that, a fork-without-exec child (Python multiprocessing) would hold the parent's
// inotify instance for its whole life. A closer empties its slot just before close(), and
// close() takes the descriptor out of the table at once (the grace period comes after), so a
// child inherits an unlisted copy only if the fork falls between those two steps.
//
// Threads are started with pthread_create, not std::thread: nothing is allocated, so a failure
// is a return code and the descriptor is closed here, never leaked.
#include "util/close_in_background.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "util/signals_blocked.h"

namespace gpulock {
namespace {

std::array<std::atomic<int>, kMaxBackgroundCloses> pending_closes{};  // fd + 1, or 0
// Set once this process has started a closer thread; a child forked after that starts none.
std::atomic<bool> closer_started{false};
// Set in a child forked from a process that had started one: POSIX allows a child of a
// multi-threaded process only async-signal-safe calls, and ThreadSanitizer ends one that
// starts a thread. Whether the closers had finished is not known exactly (a thread that has
// counted itself out may still be exiting), so any earlier start counts.
std::atomic<bool> no_threads_after_fork{false};
std::atomic<int> paused_for_test{0};

void close_inherited_copies_in_child() {
  if (closer_started.load()) no_threads_after_fork.store(true);
  // Only async-signal-safe calls here. Each listed descriptor is a copy the parent's closers
  // will close there; closing it here is not the last reference, so it does not block.
  for (auto& slot : pending_closes) {
    const int listed = slot.exchange(0);
    if (listed > 0) ::close(listed - 1);
  }
}

void* close_slot(void* slot_index) {
  while (paused_for_test.load() > 0) {
    const timespec a_millisecond{0, 1'000'000};
    ::nanosleep(&a_millisecond, nullptr);
  }
  auto& slot = pending_closes[reinterpret_cast<std::uintptr_t>(slot_index)];
  const int listed = slot.exchange(0);
  if (listed > 0) ::close(listed - 1);
  return nullptr;
}

// A free slot's index, now holding `fd`; or -1 where every slot is taken.
int list_pending(int fd) {
  for (std::size_t i = 0; i < pending_closes.size(); ++i) {
    int expected = 0;
    if (pending_closes[i].compare_exchange_strong(expected, fd + 1)) return static_cast<int>(i);
  }
  return -1;
}

bool start_closer(int slot_index) {
  pthread_attr_t attributes;
  if (::pthread_attr_init(&attributes) != 0) return false;
  ::pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  ::pthread_attr_setstacksize(&attributes, 64 * 1024);  // it only closes
  pthread_t closer;
  // The thread inherits the mask: it must not take the signals the program reads itself.
  const SignalsBlocked blocked;
  const bool started =
      ::pthread_create(&closer, &attributes, close_slot,
                       reinterpret_cast<void*>(static_cast<std::uintptr_t>(slot_index))) == 0;
  ::pthread_attr_destroy(&attributes);
  return started;
}

}  // namespace

void close_in_background(UniqueFd fd) {
  if (!fd) return;
  // Registered before the first closer starts; a child inherits the handler.
  static const bool fork_handled =
      ::pthread_atfork(nullptr, nullptr, close_inherited_copies_in_child) == 0;
  if (!fork_handled || no_threads_after_fork.load()) return;  // fd closes here
  const int slot_index = list_pending(fd.get());
  if (slot_index < 0) return;  // every slot taken: fd closes here
  closer_started.store(true);  // before the thread exists, so no fork can miss it
  if (start_closer(slot_index)) {
    fd.release();  // the closer owns it now
    return;
  }
  pending_closes[static_cast<std::size_t>(slot_index)].store(0);  // fd closes here
}

int background_closes_pending() {
  int pending = 0;
  for (const auto& slot : pending_closes) pending += slot.load() > 0 ? 1 : 0;
  return pending;
}

BackgroundClosesPausedForTest::BackgroundClosesPausedForTest() {
  paused_for_test.fetch_add(1);
}
BackgroundClosesPausedForTest::~BackgroundClosesPausedForTest() {
  paused_for_test.fetch_sub(1);
}

}  // namespace gpulock
