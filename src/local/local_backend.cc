// LocalBackend: opening the lock directory, and what the backend's parts share (the acquire
// mutex, the queue directory, wait channels, lock probes).
#include "local/local_backend.h"

#include "local/fork_guard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "local/gpu_lock_file.h"
#include "local/shared_leases.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

AcquireMutex::Hold LocalBackend::hold_acquire_mutex(Clock::time_point deadline,
                                                    Clock::time_point start,
                                                    const WaitHooks& hooks) {
  constexpr auto kAcquireMutexGrace = std::chrono::seconds(2);
  return acquire_mutex_.hold(std::max(deadline, start + kAcquireMutexGrace), hooks.interrupted,
                             hooks.interrupt_poll);
}

LocalBackend::LocalBackend(std::unique_ptr<DeviceSource> source, PoolOptions options)
    : source_(std::move(source)),
      options_(std::move(options)),
      config_(options_.config ? *options_.config : load_config()),
      dir_(LockDirectory::open(options_.lock_dir.value_or(default_lock_directory()))) {
  // A day at most: beyond, adding it to the clock could overflow, and no waiter waits so long
  // for another to act. Negative: none.
  options_.backup_dispatcher_delay =
      std::clamp(options_.backup_dispatcher_delay, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(std::chrono::hours(24)));
  const bool lock_dir_is_default = !options_.lock_dir && !std::getenv("GPULOCK_DIR");
  const std::string where =
      journal_directory(config_.journal_dir, dir_.path(), lock_dir_is_default);
  if (where == "off") {
    journal_ = std::make_shared<DisabledJournal>();
  } else {
    file_journal_ = std::make_shared<FileJournal>(where, config_.journal_file_size);
    journal_ = file_journal_;
  }
}

LocalBackend::~LocalBackend() = default;

void LocalBackend::prepare() {
  std::vector<std::string> uuids;
  for (const auto& device : source_->devices()) uuids.push_back(device.uuid);
  dir_.prepare(uuids);
  queue_dir(true)->prepare();
  if (file_journal_) {
    try {
      file_journal_->prepare();
    } catch (const Error& error) {
      if (::geteuid() == 0) throw;
      // A user's `gpulock init` of the default set-up cannot make /var/lib/gpulock: the
      // leases do not need it.
      std::fprintf(stderr, "gpulock: warning: %s\n", error.what());
    }
  }
}

QueueDirectory* LocalBackend::queue_dir(bool create) {
  std::lock_guard<std::mutex> lock(queue_dir_mutex_);
  if (!queue_dir_) queue_dir_ = QueueDirectory::open(dir_, create);
  return queue_dir_.get();
}

void LocalBackend::note_served(uid_t uid) {
  try {
    queue_dir(true)->mark_served(uid);
  } catch (const Error&) {
    // A lock directory we may not create the queue in: only fair-share ties are affected.
  }
}

QueueDirectory::Listing LocalBackend::list_queue(bool remove_dead) {
  QueueDirectory* queue = queue_dir(false);
  return queue ? queue->list(remove_dead) : QueueDirectory::Listing{};
}

void LocalBackend::sweep_queue() {
  QueueDirectory* queue = queue_dir(false);
  if (!queue) return;
  for (const IndexEntry& entry : queue->list_index().index) queue->remove_dead(entry);
  queue->list(/*remove_dead=*/true);
}

QueueDirectory::Listing LocalBackend::list_queue_index() {
  QueueDirectory* queue = queue_dir(false);
  return queue ? queue->list_index() : QueueDirectory::Listing{};
}

LockState LocalBackend::probe(const std::string& uuid, bool with_record) const {
  LockState result;
  try {
    struct stat opened {};
    UniqueFd fd = dir_.open_lock_file_for_reading(uuid, &opened);
    if (!fd) return result;  // no lock file: nobody has ever locked this GPU
    // Every lease writes its record into the file as it begins: the mtime says when the last
    // one did (to the kernel's clock tick, a few ms at most).
    result.last_leased_ns = modified_unix_ns(opened);
    result.locked = is_locked_elsewhere(fd.get());
    if (result.locked && held_mode(fd.get()) == LockMode::kShared) {
      // Shared leases: the record at offset 0 is an earlier exclusive lease's, not believed.
      result.shared = true;
      const SharedUsage usage = read_shared_usage(fd.get());
      result.shared_reserved_bytes =
          static_cast<std::uint64_t>(usage.units_held) * kSharedUnitBytes;
      result.shared_jobs = static_cast<unsigned>(usage.slots.size());
      if (with_record)
        for (const off_t slot : usage.slots)
          if (auto record = read_shared_record(fd.get(), slot, uuid))
            result.shared_records.push_back(std::move(*record));
      return result;
    }
    if (result.locked && with_record) {
      result.record = parse_holder_record(read_record_bytes(fd.get()));
      // A record left by an earlier lease, or one not naming this GPU, says nothing about now.
      if (result.record && std::find(result.record->gpus.begin(), result.record->gpus.end(),
                                     uuid) == result.record->gpus.end())
        result.record.reset();
    }
  } catch (const Error& error) {
    result.error = error.what();
  }
  return result;
}

}  // namespace gpulock
