// GpuPool::Impl: the shared state behind a GpuPool, used by its acquire, status and release parts.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/gpu_pool.hpp"
#include "local/holder_record.h"
#include "local/lock_directory.h"
#include "local/release_watcher.h"
#include "util/fd.h"

namespace gpulock {

// What reading a GPU's lock file (read-only, taking nothing) tells.
struct LockProbe {
  bool locked = false;
  std::optional<HolderRecord> record;  // only when locked and the record is readable and valid
  std::string error;                   // the lock file is unusable (planted symlink, ...)
};

class GpuPool::Impl {
 public:
  Impl(std::unique_ptr<DeviceSource> source, PoolOptions options);

  Lease acquire(const LeaseRequest& request, const WaitHooks& hooks);
  PoolStatus status();
  void release(const std::string& lease_id);

  LockProbe probe(const std::string& uuid, bool with_record) const;

  // Locks the machine-wide acquire mutex, or throws kTimedOut at `give_up`.
  // REQUIRES: acquire_mutex_ held, acquire_mutex_fd_ open.
  void take_acquire_mutex(std::chrono::steady_clock::time_point give_up);

  // A ReleaseWatcher lent to one waiting acquire() and given back to the pool afterwards.
  // Watchers are kept for the pool's lifetime because closing an inotify descriptor blocks for
  // a kernel grace period (milliseconds), which would delay every acquire() that waited.
  class WatcherLoan {
   public:
    explicit WatcherLoan(Impl& pool) : pool_(pool) {}
    ~WatcherLoan();
    WatcherLoan(const WatcherLoan&) = delete;
    WatcherLoan& operator=(const WatcherLoan&) = delete;
    void take();
    explicit operator bool() const { return watcher_ != nullptr; }
    ReleaseWatcher* operator->() { return watcher_.get(); }

   private:
    Impl& pool_;
    std::unique_ptr<ReleaseWatcher> watcher_;
  };

  std::unique_ptr<DeviceSource> source;
  PoolOptions options;
  LockDirectory dir;

 private:
  // Serialises acquisitions: threads of this process via the mutex, all processes of the
  // machine via an OFD lock on the directory's acquire mutex file.
  std::mutex acquire_mutex_;
  UniqueFd acquire_mutex_fd_;
  std::mutex watchers_mutex_;
  std::vector<std::unique_ptr<ReleaseWatcher>> idle_watchers_;
};

}  // namespace gpulock
