// LeaseRequest: what a caller asks for (which GPUs, how healthy) and how long it will wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/queue.hpp"

namespace gpulock {

struct LeaseRequest {
  // Either a count of any suitable GPUs, or explicit GPUs by index ("0", "0:1" for a MIG
  // instance) or UUID (a unique prefix is enough). With explicit GPUs, count is ignored.
  unsigned count = 1;
  std::vector<std::string> gpus;

  // A shared lease: this much of each GPU's memory (rounded up to 256 MiB units) instead of the
  // whole GPU. Shared leases coexist on a GPU while their reservations, the memory used there by
  // processes outside gpulock and the configured reserve fit; an exclusive lease excludes them
  // all. The limit is cooperative: see docs/design.md, "Shared leases".
  std::optional<std::uint64_t> memory_bytes;
  // Shared leases only: at most this many shared leases on a GPU (with this one); the stricter
  // of this and the config's max_jobs_per_gpu applies. Without memory_bytes, a lease takes
  // 1/slots of the GPU's memory.
  std::optional<unsigned> slots;
  // Shared leases only: prefer the GPUs with the most free memory (default: the least that
  // fits, so that partly used GPUs fill up first and whole GPUs stay free).
  bool spread = false;

  // Health filters: a GPU qualifies only if its readings are within these bounds. A reading
  // the device cannot provide fails the filter (no guessing).
  std::optional<std::uint64_t> min_free_memory_bytes;
  std::optional<unsigned> max_utilization_percent;
  std::optional<double> max_power_watts;
  // GPUs running compute processes that hold no gpulock lease count as busy unless this is set.
  bool allow_foreign_processes = false;

  // Redis backend: the hosts whose GPUs may serve the request. Empty: this host only; "any":
  // every host of the pool; else host names. A lease on another host is a reservation: the
  // caller starts the work there (Lease::host() names it).
  std::vector<std::string> hosts;

  // Candidates are limited to this CUDA_VISIBLE_DEVICES value when set (normally the caller's
  // own environment; see visible_devices.hpp). Entries are indices or UUIDs (prefixes allowed).
  std::optional<std::string> cuda_visible_devices;
  // The lease the caller already runs under, if any (GPULOCK_LEASE_ID in the CLI's environment).
  // GPUs held by it cannot be granted again, so a request that only they could serve fails at
  // once (kUnsatisfiable) instead of waiting for its own parent to finish.
  std::optional<std::string> enclosing_lease_id;

  // Waiting: wait == false fails at once (ErrorCode::kTimedOut) if the GPUs are not free now;
  // otherwise wait up to timeout (forever when unset).
  bool wait = true;
  std::optional<std::chrono::milliseconds> timeout;

  // Low priority requests are served after every normal one (background sweeps).
  Priority priority = Priority::kNormal;

  // Shown by `gpulock status`.
  std::string label;
  std::string command;  // what the lease is for, e.g. the command line of `gpulock run`
};

// Why a waiting request is not served yet: one entry per candidate GPU that is not usable.
struct BlockingGpu {
  std::string display_index;
  std::string uuid;
  std::string
      reason;  // "leased by alice (lease 3f…, 2h 05m, label 'sweep')", "foreign process 4711"
  // Held by a detached lease (`gpulock acquire`): the process it is held for (--for-pid), or
  // the session it is held for; 0 otherwise.
  int held_for_pid = 0;
  int held_for_session = 0;
};

struct WaitProgress {
  std::chrono::steady_clock::duration waited{};
  std::vector<BlockingGpu> blocking;
  // The request's place in the machine's queue (1 = next), and how many requests wait in all.
  int position = 0;
  int queue_length = 0;
  QueueStanding standing = QueueStanding::kWaiting;
  std::string blocked_by;  // one line: what the request waits for
};

struct WaitHooks {
  // Called when the wait starts and whenever what blocks the request (or its place) changes.
  std::function<void(const WaitProgress&)> on_progress;
  // When set, the waiter also refreshes its progress this often (a live display's clock),
  // re-reading its place in the queue.
  std::optional<std::chrono::milliseconds> progress_refresh;
  // Polled at least every `interrupt_poll` while waiting, and at once when a signal handler
  // has run in the waiting thread; returning true stops the wait with ErrorCode::kInterrupted
  // (used by the Python binding for Ctrl-C).
  std::function<bool()> interrupted;
  std::chrono::milliseconds interrupt_poll{100};
  // A descriptor that turns readable when `interrupted` may have changed (the read end of a
  // pipe a signal handler writes to), or -1. The local backend's waits watch it, which closes
  // the race of a signal that lands just before a sleep: with it, `interrupt_poll` can be long
  // and a thousand waiters sleep undisturbed. It is never read; the caller drains it.
  int interrupt_fd = -1;
};

}  // namespace gpulock
