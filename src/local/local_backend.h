// GpuPool::Impl: the shared state behind a GpuPool, used by its acquire, status and release parts.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/config.hpp"
#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"
#include "backend/holder_record.h"
#include "local/lock_directory.h"
#include "local/queue_directory.h"
#include "queue/schedule.h"
#include "local/wait_channel.h"
#include "util/fd.h"

namespace gpulock {

// What reading a GPU's lock file (read-only, taking nothing) tells.
struct LockProbe {
  bool locked = false;
  std::optional<HolderRecord> record;  // only when locked and the record is readable and valid
  std::string error;                   // the lock file is unusable (planted symlink, ...)
};

// "leased by alice since 12:03:04 (lease 3f…, 'sweep')".
std::string holder_summary(const HolderRecord& record);

// The health filters of a ticket, as a request, to judge devices by.
LeaseRequest health_filters_of(const Ticket& ticket);
// The candidates of a ticket that fail its health filters now, with why (by UUID). `device_of`
// finds a device by UUID, nullptr for one that is gone.
std::map<std::string, std::string> unhealthy_candidates(
    const Ticket& ticket, const std::function<const Device*(const std::string&)>& device_of);
// A request as the queue sees it (a fresh id; registered only if it has to wait).
Ticket ticket_for_request(const LeaseRequest& request, std::size_t needed, const std::string& user);
// A ticket as the planner sees it (without health and fair-share history).
PlanRequest plan_request_for(const Ticket& ticket, const Config& config);

// Throws kUnsatisfiable when the GPUs `own` (display names), held by the lease the caller runs
// under, leave fewer than `needed` of its `candidates`: waiting for them would never end.
void check_enclosing_lease(const std::vector<std::string>& own, std::size_t candidates,
                           std::size_t needed, const std::string& lease_id);

// Holders as `gpulock status` shows them; whether a process is covered by a lease (the holder,
// a member, or a descendant of either), for telling foreign processes apart.
// `on_this_host`: whether the holder process can be checked here (else holder_alive is false).
HolderInfo holder_info(const HolderRecord& record, bool on_this_host = true);
bool covered_by(unsigned pid, const HolderRecord& record);

// The queue planned from the files: the tickets (the plan's requests, in the same order), the
// machine's GPUs as the plan saw them, and the plan.
struct QueueSnapshot {
  std::vector<Ticket> tickets;
  std::vector<PlannedGpu> gpus;
  std::vector<LockProbe> probes;       // parallel to gpus
  std::vector<std::string> gpu_names;  // parallel to gpus: "0", "1:0"
  // Parallel to tickets: why each unhealthy candidate fails that ticket's filters, by UUID.
  std::vector<std::map<std::string, std::string>> unhealthy_reasons;
  Plan plan;
  std::vector<std::string> warnings;

  // Index of a GPU by UUID, or -1.
  int gpu_index(const std::string& uuid) const;
  // One line per obstacle of a waiting ticket, and the summary of its standing, for people.
  std::vector<BlockingGpu> blocking(std::size_t ticket) const;
  std::string blocked_by(std::size_t ticket, const Config& config) const;
  bool health_dependent() const;  // some waiter lacks a GPU only because of its health
  // The queue entry at `position` of the plan's order, as `gpulock queue` shows it.
  QueueEntry entry_at(std::size_t position, const Config& config) const;
};

// kTimedOut for a request that is not served now (no wait) or was not within its timeout, with
// why: its standing, each blocking GPU, its place in the queue.
Error not_served(const QueueSnapshot& snapshot, std::size_t me, bool waited,
                 const std::vector<BlockingGpu>& blocking, const std::string& blocked_by);

// A device's state as `gpulock status` shows it, from its lock's probe. `device_here`: the
// device is this machine's (its processes can be matched to users and leases); `holder_here`:
// the lease's holder runs here (it can be checked and its process tree followed).
GpuStatus gpu_status_of(Device device, const LockProbe& probe, const Config& config,
                        bool device_here, bool holder_here);
// Marks the free GPUs that the queue holds back for a waiting request.
void mark_reservations(PoolStatus& status, const QueueStatus& queue);

class GpuPool::Impl {
 public:
  Impl(std::unique_ptr<DeviceSource> source, PoolOptions options);

  Lease acquire(const LeaseRequest& request, const WaitHooks& hooks);
  // Locks exactly these GPUs and writes the holder records; nullopt if one is locked outside
  // gpulock's protocol, or `replaced` if a lock file was swapped meanwhile.
  // REQUIRES: the acquire mutex is held.
  std::optional<Lease> try_lock(const std::vector<const Device*>& chosen,
                                const LeaseRequest& request, bool& replaced);
  PoolStatus status();
  void release(const std::string& lease_id);
  std::vector<DoctorCheck> doctor();

  LockProbe probe(const std::string& uuid, bool with_record) const;

  // Plans the queue: the live tickets of `listing`, plus `newcomer` (a request not registered
  // yet, placed as if it registered now) when given. `devices` is a fresh inventory.
  QueueSnapshot plan(const std::vector<Device>& devices, const QueueDirectory::Listing& listing,
                     const Ticket* newcomer, bool with_records);
  // The queue as people see it; `devices` when the caller has a fresh inventory already.
  QueueStatus queue_status(const std::vector<Device>* devices = nullptr);
  // The user name of a uid, cached: planning asks for it often.
  const std::string& user_of(uid_t uid);

  // Locks the machine-wide acquire mutex, or throws kTimedOut at `give_up`.
  // REQUIRES: acquire_mutex_ held, acquire_mutex_fd_ open.
  void take_acquire_mutex(std::chrono::steady_clock::time_point give_up);

  // A WaitChannel lent to one waiting acquire() and given back to the pool afterwards.
  // Channels are kept for the pool's lifetime because closing an inotify descriptor blocks for
  // a kernel grace period (milliseconds), which would delay every acquire() that waited.
  class ChannelLoan {
   public:
    explicit ChannelLoan(Impl& pool) : pool_(pool) {}
    ~ChannelLoan();
    ChannelLoan(const ChannelLoan&) = delete;
    ChannelLoan& operator=(const ChannelLoan&) = delete;
    void take();
    explicit operator bool() const { return channel_ != nullptr; }
    WaitChannel* operator->() { return channel_.get(); }

   private:
    Impl& pool_;
    std::unique_ptr<WaitChannel> channel_;
  };

  std::unique_ptr<DeviceSource> source;
  PoolOptions options;
  Config config;
  LockDirectory dir;
  // The queue directory, opened on first use. Without `create`, nullptr while it does not
  // exist (nobody has waited yet, or the lock directory is read-only to us).
  QueueDirectory* queue_dir(bool create);
  // Records that this user was just given GPUs, for fair share's ties (best effort).
  void note_served();
  // Its live tickets; empty when there is no queue directory.
  QueueDirectory::Listing list_queue(bool remove_dead);

 private:
  // Serialises acquisitions: threads of this process via the mutex, all processes of the
  // machine via an OFD lock on the directory's acquire mutex file.
  std::mutex acquire_mutex_;
  UniqueFd acquire_mutex_fd_;
  std::mutex queue_dir_mutex_;
  std::unique_ptr<QueueDirectory> queue_dir_;
  std::mutex channels_mutex_;
  std::vector<std::unique_ptr<WaitChannel>> idle_channels_;
  std::mutex user_names_mutex_;
  std::map<uid_t, std::string> user_names_;
};

}  // namespace gpulock
