// Helper threads: a fixed table of the kernel thread ids of gpulock's own helpers.
#include "util/helper_threads.h"

#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>

namespace gpulock {
namespace {

constexpr int kFree = 0;
constexpr int kStarting = -1;  // reserved: the thread is being created and has no id yet

struct Slot {
  std::atomic<int> tid{kFree};  // kFree, kStarting, or the thread's kernel id
  std::atomic<bool> blocked{false};
};
std::array<Slot, kMaxHelperThreads> slots;

// Whether thread `tid` of this process still exists (without /proc, it cannot be told, and
// counts as gone: nothing is waited for).
bool thread_exists(int tid) {
  char path[64];
  const int n = ::snprintf(path, sizeof path, "/proc/self/task/%d", tid);
  struct stat st {};
  return n > 0 && static_cast<std::size_t>(n) < sizeof path && ::stat(path, &st) == 0;
}

// In a forked child: none of the parent's helpers came along.
void forget_all_in_child() {
  for (auto& slot : slots) {
    slot.blocked.store(false);
    slot.tid.store(kFree);
  }
}

// Registered when the program is loaded: never under the ForkGate (util/fork_gate.h).
[[maybe_unused]] const bool fork_handled =
    ::pthread_atfork(nullptr, nullptr, forget_all_in_child) == 0;

// Frees `slot` if its thread is gone; true if it is free or freed.
bool reclaim(Slot& slot) {
  int tid = slot.tid.load();
  if (tid == kFree) return true;
  if (tid == kStarting || thread_exists(tid)) return false;
  return slot.tid.compare_exchange_strong(tid, kFree) || slot.tid.load() == kFree;
}

int take_free_slot() {
  for (int i = 0; i < kMaxHelperThreads; ++i) {
    int expected = kFree;
    if (slots[static_cast<std::size_t>(i)].tid.compare_exchange_strong(expected, kStarting))
      return i;
  }
  return -1;
}

}  // namespace

int reserve_helper_thread() {
  const int slot = take_free_slot();
  if (slot >= 0) return slot;
  for (auto& s : slots) reclaim(s);
  return take_free_slot();
}

void helper_thread_started(int slot) {
  if (slot < 0 || slot >= kMaxHelperThreads) return;
  Slot& s = slots[static_cast<std::size_t>(slot)];
  s.blocked.store(false);
  s.tid.store(static_cast<int>(::syscall(SYS_gettid)));
}

void helper_thread_not_started(int slot) {
  if (slot < 0 || slot >= kMaxHelperThreads) return;
  slots[static_cast<std::size_t>(slot)].tid.store(kFree);
}

HelperThreadBlocked::HelperThreadBlocked(int slot)
    : slot_(slot >= 0 && slot < kMaxHelperThreads ? slot : -1) {
  if (slot_ >= 0) slots[static_cast<std::size_t>(slot_)].blocked.store(true);
}

HelperThreadBlocked::~HelperThreadBlocked() {
  if (slot_ >= 0) slots[static_cast<std::size_t>(slot_)].blocked.store(false);
}

bool wait_for_helper_threads(std::chrono::milliseconds patience) {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  while (true) {
    bool all_gone = true;
    for (auto& slot : slots)
      if (!slot.blocked.load() && !reclaim(slot)) all_gone = false;
    if (all_gone) return true;
    if (std::chrono::steady_clock::now() >= give_up) return false;
    const timespec a_millisecond{0, 1'000'000};
    ::nanosleep(&a_millisecond, nullptr);
  }
}

int helper_threads_listed() {
  int listed = 0;
  for (auto& slot : slots)
    if (!reclaim(slot)) ++listed;
  return listed;
}

}  // namespace gpulock
