// LocalBackend: leases as kernel OFD locks on one lock file per GPU, in a directory shared by
// the machine's users, and a fair queue of waiters in files beside them. No daemon: whoever
// acquires plans the queue. See docs/design.md.
//
// Its parts: local_acquire.cc (taking GPUs and waiting), local_acquire_shared.cc (shared
// leases: room on a GPU, locking units), local_queue.cc (planning the queue),
// local_status.cc, local_release.cc, local_doctor.cc; the lock directory and files, the queue
// directory and the wait channel are this folder's primitives.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/lease_backend.h"
#include "backend/lock_state.h"
#include "backend/queue_snapshot.h"
#include "gpulock/config.hpp"
#include "gpulock/gpu_pool.hpp"
#include "journal/file_journal.h"
#include "local/acquire_mutex.h"
#include "local/lock_directory.h"
#include "local/queue_directory.h"
#include "local/wait_channel.h"
#include "util/fd.h"

namespace gpulock {

class LocalBackend final : public LeaseBackend {
 public:
  // `options.config` must be set (open_backend() loads it).
  LocalBackend(std::unique_ptr<DeviceSource> source, PoolOptions options);
  ~LocalBackend() override;

  Lease acquire(const LeaseRequest& request, const WaitHooks& hooks) override;
  PoolStatus status() override;
  PoolStatus pool_status() override { return status(); }
  QueueStatus queue() override { return queue_status(); }
  void release(const std::string& lease_id, bool also_run) override;
  std::vector<DoctorCheck> doctor() override;
  void prepare() override;

  std::string name() const override { return "file"; }
  bool spans_hosts() const override { return false; }
  const Config& config() const override { return config_; }
  DeviceSource& device_source() override { return *source_; }
  const std::filesystem::path& lock_dir() const override { return dir_.path(); }
  std::vector<std::string> warnings() const override { return dir_.warnings(); }
  std::shared_ptr<UsageJournal> journal() override { return journal_; }

 private:
  // A round of an acquire (local_acquire.cc), below run_acquire_loop(); nested, so that it
  // reaches the pool's parts.
  class Round;

  // Locks exactly these GPUs and writes the holder records; nullopt if one is locked outside
  // gpulock's protocol, or `replaced` if a lock file was swapped meanwhile.
  // REQUIRES: the acquire mutex is held.
  // `uid`: this process's effective uid, the holder's.
  std::optional<Lease> try_lock(const std::vector<const Device*>& chosen,
                                const LeaseRequest& request, uid_t uid, bool& replaced);
  // Shared leases (request.memory_bytes or request.slots): byte ranges of the GPUs' lock files
  // (local_acquire_shared.cc). They wait in the same queue as exclusive requests.
  // Throws kInvalidArgument for a share out of range.
  void check_shared_request(const LeaseRequest& request) const;
  // The devices that could ever serve a shared request (big enough once the reserve is kept).
  std::vector<const Device*> shared_candidates(const std::vector<Device>& devices,
                                               const LeaseRequest& request,
                                               std::vector<std::string>& never_reasons) const;
  // How a GPU stands for shared leases now: `open` unless an exclusive lease (or a process
  // outside gpulock's protocol) holds it; its memory units, those free for new shared leases
  // (after the reserve and memory used outside gpulock), and its shared leases.
  struct SharedRoom {
    bool open = false;
    off_t total_units = 0;
    off_t free_units = 0;
    unsigned jobs = 0;
  };
  SharedRoom shared_room(const Device& device) const;
  // A shared request served at once when nobody waits: the fitting GPUs, packed or spread.
  // REQUIRES: the acquire mutex is held.
  std::optional<Lease> try_shared_now(const std::vector<const Device*>& candidates,
                                      const LeaseRequest& request);
  // Locks a share of each of `count` GPUs (gpu(i): the device and its memory units) and writes
  // the records; nullopt if one is taken outside gpulock's protocol meanwhile.
  // REQUIRES: the acquire mutex is held.
  std::optional<Lease> try_lock_shared(
      std::size_t count, const std::function<std::pair<const Device*, off_t>(std::size_t)>& gpu,
      const LeaseRequest& request);
  // A GPU's lock file, read without taking anything; its record only if `with_record`.
  LockState probe(const std::string& uuid, bool with_record) const;

  // Plans the queue. `devices` is a fresh inventory. For people (neither `newcomer` nor `own`):
  // the whole queue, from the live tickets of a listing from list(), which move into the
  // snapshot. For an acquire, with plan_head(): from a listing from the index (list_index),
  // plus `newcomer` (a request not registered yet, placed as if it registered now) when given;
  // `own` (our registered ticket, if any) stands in for ours; tickets' details are read as the
  // plan reaches them, and waiters found gone meanwhile are added to `gone`.
  QueueSnapshot plan(const std::vector<Device>& devices, QueueDirectory::Listing& listing,
                     const Ticket* newcomer, const Ticket* own, bool with_records,
                     std::vector<IndexEntry>* gone = nullptr);
  // The plan of an acquire (with `newcomer` or `own`), from the index: the whole queue is
  // ordered from its index slots, but tickets and plan requests are made only for the head of
  // that order, up to where no GPU is open any more, and for ours (see QueueSnapshot's
  // place_in_queue). So a plan's cost beyond one pass over the slots follows the requests
  // ahead of the last free GPU, not the length of the queue.
  class HeadPlan;  // plan_head()'s walk (local_queue.cc)
  QueueSnapshot plan_head(const std::vector<Device>& devices,
                          const QueueDirectory::Listing& listing, const Ticket* newcomer,
                          const Ticket* own, bool with_records, std::vector<IndexEntry>* gone);
  // The machine's GPUs as a plan sees them (held, by whom, room for shared leases).
  void plan_gpus(const std::vector<Device>& devices, bool any_shared, bool with_records,
                 QueueSnapshot& snapshot);
  PlanRequest plan_request(const Ticket& t, const UserLimits& limits,
                           std::int64_t user_last_served) const;
  // The queue as people see it; `devices` when the caller has a fresh inventory already.
  QueueStatus queue_status(const std::vector<Device>* devices = nullptr);
  // `gpulock doctor`'s check of the usage journal's directory.
  DoctorCheck journal_check() const;
  // Whether waiters can announce their departures (LockDirectory::kDeparturesName).
  DoctorCheck departures_check() const;
  // The user name of a uid, cached: planning asks for it often.
  const std::string& user_of(uid_t uid);

  // Takes the machine-wide acquire mutex, or throws kTimedOut at `deadline`, though never
  // before kAcquireMutexGrace after `start`: others hold it for microseconds, and even a request
  // that does not wait gets that long before it blames the mutex's holder. Stops, with
  // kInterrupted, when the caller's hooks ask.
  AcquireMutex::Hold hold_acquire_mutex(std::chrono::steady_clock::time_point deadline,
                                        std::chrono::steady_clock::time_point start,
                                        const WaitHooks& hooks);

  // The queue directory, opened on first use. Without `create`, nullptr while it does not
  // exist (nobody has waited yet, or the lock directory is read-only to us).
  QueueDirectory* queue_dir(bool create);
  // Records that user `uid` (this process's) was just given GPUs, for fair share's ties (best
  // effort).
  void note_served(uid_t uid);
  // Its live tickets; empty when there is no queue directory.
  QueueDirectory::Listing list_queue(bool remove_dead);
  // Clears the index slots of waiters that ended without leaving, and their files where we may.
  // REQUIRES: the acquire mutex is held.
  void sweep_queue();
  // The queue as its index has it (for planning); empty when there is no queue directory.
  // REQUIRES: the acquire mutex is held.
  QueueDirectory::Listing list_queue_index();

  std::unique_ptr<DeviceSource> source_;
  PoolOptions options_;
  Config config_;
  LockDirectory dir_;
  std::shared_ptr<UsageJournal> journal_;
  std::shared_ptr<FileJournal> file_journal_;  // the same, where it is on

  // Serialises acquisitions: threads of this process, and all processes of the machine.
  AcquireMutex acquire_mutex_{dir_};
  std::mutex queue_dir_mutex_;
  std::unique_ptr<QueueDirectory> queue_dir_;
  std::mutex user_names_mutex_;
  std::map<uid_t, std::string> user_names_;
};

}  // namespace gpulock
