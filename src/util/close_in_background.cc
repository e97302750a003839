// close_in_background: a detached thread per descriptor, which only closes it.
#include "util/close_in_background.h"

#include <pthread.h>

#include <atomic>
#include <system_error>
#include <thread>

#include "util/signals_blocked.h"

namespace gpulock {
namespace {

std::atomic<int> closers_running{0};
// Set in a child forked while a closer ran: that child starts no thread of its own.
std::atomic<bool> no_threads_after_fork{false};

void note_fork_in_child() {
  if (closers_running.load() > 0) no_threads_after_fork.store(true);
  closers_running.store(0);  // they did not come along
}

}  // namespace

void close_in_background(UniqueFd fd) {
  if (!fd) return;
  // Registered before the first closer starts, so a child forked while one runs knows it; a
  // child inherits the handler.
  static const bool fork_noted = ::pthread_atfork(nullptr, nullptr, note_fork_in_child) == 0;
  // A child forked while a closer ran (its parent multi-threaded by us) closes in place: POSIX
  // allows such a child only async-signal-safe calls, and ThreadSanitizer ends a process that
  // starts a thread there.
  if (!fork_noted || no_threads_after_fork.load()) return;  // fd closes here
  const int raw = fd.release();
  closers_running.fetch_add(1);
  try {
    // The thread inherits the mask: it must not take the signals the program reads itself.
    const SignalsBlocked blocked;
    std::thread([raw] {
      { UniqueFd closing(raw); }
      closers_running.fetch_sub(1);
    }).detach();
  } catch (const std::system_error&) {
    closers_running.fetch_sub(1);
    UniqueFd closing(raw);  // out of threads: close it here, late rather than never
  }
}

}  // namespace gpulock
