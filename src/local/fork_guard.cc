// Fork guard: a fixed table of descriptors, read by a pthread_atfork child handler (which may
// only do async-signal-safe work: no allocation, no locks).
#include "local/fork_guard.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>

#include "util/fork_gate.h"

namespace gpulock {
namespace {

struct Guarded {
  std::atomic<int> fd{-1};
  std::atomic<int> dir_fd{-1};  // -1: close in the child; else reopen `name` there
  const char* name = nullptr;
};

// Each waiting thread guards three descriptors (its ticket, wake FIFO and departures file), a
// dispatcher a fourth (its inotify instance), and each pool one (its acquire mutex). Beyond this
// many descriptors, one process's waiters keep theirs in a forked child.
constexpr std::size_t kSlots = 768;
std::array<Guarded, kSlots> guarded;

// An entry's fd: -1 free, else the descriptor.
constexpr int kFree = -1;

void in_forked_child() {
  for (Guarded& g : guarded) {
    const int fd = g.fd.load();
    if (fd < 0) continue;
    const int dir_fd = g.dir_fd.load();
    if (dir_fd < 0) {
      g.fd.store(kFree);
      ::close(fd);
      continue;
    }
    int fresh = ::openat(dir_fd, g.name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fresh < 0) fresh = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (fresh >= 0) {
      ::dup3(fresh, fd, O_CLOEXEC);
      ::close(fresh);
    }
    // The entry stays: the child's pool keeps the descriptor, and its own children get the same.
  }
}

// Registered when the program is loaded: never under the gate (util/fork_gate.h).
[[maybe_unused]] const bool registered = ::pthread_atfork(nullptr, nullptr, in_forked_child) == 0;

void guard(int fd, int dir_fd, const char* name) {
  // The table changes behind the gate: fork() copies descriptors and memory at different times.
  // So a plain read finds a free entry, and no fork sees it half filled in.
  const ForkGate gate;
  for (Guarded& g : guarded) {
    if (g.fd.load(std::memory_order_relaxed) != kFree) continue;
    g.dir_fd.store(dir_fd);
    g.name = name;
    g.fd.store(fd);
    return;
  }
}

}  // namespace

void close_in_forked_child(int fd) {
  guard(fd, -1, nullptr);
}

void reopen_in_forked_child(int fd, int dir_fd, const char* name) {
  guard(fd, dir_fd, name);
}

void forget_in_forked_child(int fd) {
  const ForkGate gate;
  // Entries change only behind the gate, so a plain read finds ours: the table has 768 entries,
  // and a failed compare-exchange on each would be a locked instruction apiece at every leave.
  for (Guarded& g : guarded) {
    if (g.fd.load(std::memory_order_relaxed) == fd) {
      g.fd.store(kFree);
      return;
    }
  }
}

}  // namespace gpulock
