// close_in_background: a detached thread per descriptor, which only closes it.
//
// The descriptors on their way out are listed in a fixed table of slots (fd + 1; 0 is free), so
// that a child forked before a closer reached its descriptor can close the copy it inherited:
// without that, a fork-without-exec child (Python multiprocessing) would hold the parent's
// inotify instance for its whole life. fork() copies the descriptor table before the memory,
// while the parent's other threads run on, so slots are only filled and emptied behind the
// ForkGate (util/fork_gate.h): a listed descriptor is open, and ours, in the child's table too. A
// closer empties its slot just before close(), and close() takes the descriptor out of the table at
// once (the grace period comes after), so a child inherits an unlisted copy only if the fork falls
// between those two steps.
//
// Threads are started with pthread_create, not std::thread: nothing is allocated, so a failure
// is a return code and the descriptor is closed here, never leaked.
#include "util/close_in_background.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>

#include "util/fork_gate.h"
#include "util/helper_threads.h"
#include "util/sanitizers.h"
#include "util/signals_blocked.h"

namespace gpulock {
namespace {

std::array<std::atomic<int>, kMaxBackgroundCloses> pending_closes{};  // fd + 1, or 0
// Closer threads started and not yet finished.
std::atomic<int> closers_running{0};
// Set in a child forked while a closer ran: POSIX allows a child of a multi-threaded process
// only async-signal-safe calls, so it starts no thread and closes in place. (Under
// ThreadSanitizer, which ends a process that starts a thread after such a fork, any closer
// ever started counts: one that has counted itself out may still be exiting.)
std::atomic<bool> no_threads_after_fork{false};
constexpr bool kAnyCloserEverStartedCounts = kUnderThreadSanitizer;
std::atomic<bool> closer_started{false};
std::atomic<int> paused_for_test{0};

void close_inherited_copies_in_child() {
  if (closers_running.load() > 0 || (kAnyCloserEverStartedCounts && closer_started.load()))
    no_threads_after_fork.store(true);
  closers_running.store(0);  // they did not come along
  // Only async-signal-safe calls here. Each listed descriptor is a copy that a closer of the
  // parent's will close there; this close is usually not the last reference, so it rarely
  // waits for a grace period.
  for (auto& slot : pending_closes) {
    const int listed = slot.exchange(0);
    if (listed > 0) ::close(listed - 1);
  }
}

// Empties the slot, behind the gate; returns the descriptor it listed, or -1.
int take_listed(std::size_t slot_index) {
  const ForkGate gate;
  return pending_closes[slot_index].exchange(0) - 1;
}

// A closer's argument: its slot here and its helper-thread slot (util/helper_threads.h).
std::uintptr_t closer_argument(int slot_index, int helper_slot) {
  return static_cast<std::uintptr_t>(slot_index) * kMaxHelperThreads +
         static_cast<std::uintptr_t>(helper_slot);
}

void* close_slot(void* argument) {
  const auto packed = reinterpret_cast<std::uintptr_t>(argument);
  helper_thread_started(static_cast<int>(packed % kMaxHelperThreads));
  while (paused_for_test.load() > 0) {
    const timespec a_millisecond{0, 1'000'000};
    ::nanosleep(&a_millisecond, nullptr);
  }
  const int fd = take_listed(packed / kMaxHelperThreads);
  if (fd >= 0) ::close(fd);
  closers_running.fetch_sub(1);
  return nullptr;
}

// A free slot's index, now holding `fd`; or -1 where every slot is taken. Behind the gate,
// which `unlist_elsewhere` shares.
int list_pending(int fd, void (*unlist_elsewhere)(int)) {
  const ForkGate gate;
  if (unlist_elsewhere) unlist_elsewhere(fd);
  for (std::size_t i = 0; i < pending_closes.size(); ++i) {
    int expected = 0;
    if (pending_closes[i].compare_exchange_strong(expected, fd + 1)) return static_cast<int>(i);
  }
  return -1;
}

// Registered when the program is loaded: never under the gate (util/fork_gate.h).
const bool fork_handled = ::pthread_atfork(nullptr, nullptr, close_inherited_copies_in_child) == 0;

// Closes `fd` here, once the other table no longer lists it (in one step, for a fork).
void close_in_place(UniqueFd fd, void (*unlist_elsewhere)(int)) {
  if (!unlist_elsewhere) return;  // fd closes on return
  const ForkGate gate;
  unlist_elsewhere(fd.get());
  fd.reset();
}

bool start_closer(int slot_index, int helper_slot) {
  void* const argument = reinterpret_cast<void*>(closer_argument(slot_index, helper_slot));
  pthread_attr_t attributes;
  if (::pthread_attr_init(&attributes) != 0) return false;
  ::pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  // It only closes; glibc takes the program's static TLS out of this too.
  ::pthread_attr_setstacksize(&attributes, 256 * 1024);
  pthread_t closer;
  int error = ::pthread_create(&closer, &attributes, close_slot, argument);
  if (error == EINVAL) {
    // A program whose static TLS does not fit: the default stack size.
    pthread_attr_t plain;
    if (::pthread_attr_init(&plain) == 0) {
      ::pthread_attr_setdetachstate(&plain, PTHREAD_CREATE_DETACHED);
      error = ::pthread_create(&closer, &plain, close_slot, argument);
      ::pthread_attr_destroy(&plain);
    }
  }
  ::pthread_attr_destroy(&attributes);
  return error == 0;
}

}  // namespace

void close_in_background(UniqueFd fd, void (*unlist_elsewhere)(int fd)) {
  if (!fd) return;
  if (!fork_handled || no_threads_after_fork.load())
    return close_in_place(std::move(fd), unlist_elsewhere);
  // Every signal blocked: the closer inherits the mask (it must not take the signals the
  // program reads itself).
  const SignalsBlocked blocked;
  // Listed before it exists, so that a fork without exec waits for it to be gone.
  const int helper_slot = reserve_helper_thread();
  if (helper_slot < 0) return close_in_place(std::move(fd), unlist_elsewhere);
  const int slot_index = list_pending(fd.get(), unlist_elsewhere);
  if (slot_index < 0) {  // every slot taken: fd closes here, unlisted already
    helper_thread_not_started(helper_slot);
    return;
  }
  // Counted before the thread exists, so that no fork can miss it.
  closer_started.store(true);
  closers_running.fetch_add(1);
  if (start_closer(slot_index, helper_slot)) {
    fd.release();  // the closer owns it now
    return;
  }
  closers_running.fetch_sub(1);
  helper_thread_not_started(helper_slot);
  take_listed(static_cast<std::size_t>(slot_index));  // fd closes here
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
