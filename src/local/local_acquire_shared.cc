// LocalBackend::acquire_shared(): a shared lease (a share of GPUs' memory) as byte-range OFD
// locks in the GPUs' lock files, taken all-or-nothing under the machine-wide acquire mutex.
//
// A shared request does not join the queue's index. It takes memory only while no request waits
// in the queue (the queue holds exclusive requests), so an exclusive request waiting for a GPU
// is never starved by a stream of small jobs: the shared leases drain and it is served. While
// it waits, a shared request sleeps on lease releases and queue departures (inotify), with a
// re-check every second for memory used outside gpulock, which changes without any event.
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "backend/gpu_status.h"
#include "backend/lease_state.h"
#include "backend/request_checks.h"
#include "gpulock/error.hpp"
#include "gpulock/parse.hpp"
#include "local/fork_guard.h"
#include "local/gpu_lock_file.h"
#include "local/local_backend.h"
#include "local/local_lease_keeper.h"
#include "local/shared_leases.h"
#include "process/process_identity.h"
#include "util/random_id.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;

// Memory used outside gpulock (and the admin's reserve) can change without any event.
constexpr std::chrono::milliseconds kSharedRecheck{1000};

// The units a request wants on a GPU of `total_units`.
off_t wanted_units(const LeaseRequest& request, off_t total_units) {
  if (request.memory_bytes) return units_for(*request.memory_bytes);
  return std::max<off_t>(1, total_units / static_cast<off_t>(*request.slots));
}

}  // namespace

Lease LocalBackend::acquire_shared(const LeaseRequest& request, const WaitHooks& hooks) {
  validate_request(request);
  if (request.memory_bytes && *request.memory_bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, "a shared lease's memory (--mem) must be more than 0");
  if (request.slots && *request.slots == 0)
    throw Error(ErrorCode::kInvalidArgument, "slots (--slots) must be at least 1");
  const auto start = Clock::now();
  const Clock::time_point deadline = wait_deadline(request, start);
  const std::size_t needed = request.gpus.empty() ? request.count : request.gpus.size();
  check_gpu_limit(needed, user_of(::geteuid()), config_);
  std::optional<unsigned> cap = config_.max_jobs_per_gpu;
  if (request.slots) cap = cap ? std::min(*cap, *request.slots) : *request.slots;
  // Shared leases may share a GPU with processes outside gpulock: their memory is counted.
  LeaseRequest health = request;
  health.allow_foreign_processes = true;

  ChannelLoan channel(*this);
  std::string last_progress;
  while (true) {
    const std::vector<Device> devices = source_->devices();
    // Devices that could serve it at all: also big enough for the share, once the reserve is
    // kept back.
    const auto too_small = [&](const Device& d) -> std::string {
      const off_t total = static_cast<off_t>(d.memory_total_bytes.value_or(0) / kSharedUnitBytes);
      const off_t reserve = config_.shared_memory_reserve_bytes == 0
                                ? 0
                                : units_for(config_.shared_memory_reserve_bytes);
      if (!d.memory_total_bytes)
        return fmt::format("GPU {}: its memory size is unknown", d.display_index());
      if (total > kSharedMaxUnits)
        return fmt::format("GPU {}: more memory than shared leases support (2 TiB)",
                           d.display_index());
      if (wanted_units(request, total) > total - reserve)
        return fmt::format("GPU {}: {} of memory, {} of it kept in reserve", d.display_index(),
                           format_size(*d.memory_total_bytes),
                           format_size(config_.shared_memory_reserve_bytes));
      return "";
    };
    std::vector<std::string> never_reasons;
    const std::vector<const Device*> candidates =
        candidate_devices(devices, request, config_, never_reasons, too_small);
    if (candidates.size() < needed)
      throw unsatisfiable(fmt::format("{} GPU{} with {} requested but this machine has {} that "
                                      "can serve it",
                                      needed, needed == 1 ? "" : "s",
                                      request.memory_bytes ? format_size(*request.memory_bytes)
                                                           : fmt::format("1/{}", *request.slots),
                                      candidates.size()),
                          never_reasons);

    std::string blocked_by;
    {
      const AcquireMutexHold held = hold_acquire_mutex(deadline, start);

      // The index's slots are only claims: a waiter that died leaves its slot until someone
      // finds it dead. Check each (one fcntl) and clear the dead, so that a dead slot cannot
      // hold shared requests back. The first live one is enough to wait for.
      std::size_t waiting = 0;
      const QueueDirectory::Listing listing = list_queue_index();
      if (QueueDirectory* queue = queue_dir(false))
        for (std::size_t i = 0; i < listing.live.size() && waiting == 0; ++i) {
          if (queue->is_live(listing.live[i].id)) {
            ++waiting;
          } else if (i < listing.index.size()) {
            queue->remove_dead(listing.index[i]);
          }
        }
      if (waiting > 0) {
        blocked_by = "requests for whole GPUs wait in the queue (they go first)";
      } else {
        struct Fitting {
          const Device* device;
          off_t total_units;
          off_t free_units;
        };
        std::vector<Fitting> fitting;
        for (const Device* d : candidates) {
          if (!unready_reason(*d, health).empty()) continue;
          UniqueFd fd;
          try {
            fd = dir_.open_lock_file_for_reading(d->uuid);
          } catch (const Error&) {
            continue;  // an unusable lock file: status explains it
          }
          SharedUsage usage;
          std::uint64_t covered = 0;
          if (fd) {
            const LockMode mode = held_mode(fd.get());
            if (mode == LockMode::kExclusive) continue;
            if (mode == LockMode::kNone && is_locked_elsewhere(fd.get())) continue;  // outsider
            usage = read_shared_usage(fd.get());
            for (const off_t slot : usage.slots)
              if (auto record = read_shared_record(fd.get(), slot, d->uuid))
                for (const GpuProcess& p : d->processes)
                  if (p.used_memory_bytes && covered_by(p.pid, *record))
                    covered += *p.used_memory_bytes;
          }
          const SharedFit fit = shared_fit(*d, usage, config_, covered);
          const off_t wanted = wanted_units(request, fit.total_units);
          if (fit.free_units() < wanted || (cap && fit.jobs >= *cap)) continue;
          fitting.push_back({d, fit.total_units, fit.free_units()});
        }
        if (fitting.size() >= needed) {
          // Pack by default (the least free memory that fits first, so whole GPUs stay whole
          // for exclusive leases); spread with --spread. Ties in index order.
          std::stable_sort(fitting.begin(), fitting.end(), [&](const Fitting& a, const Fitting& b) {
            return request.spread ? a.free_units > b.free_units : a.free_units < b.free_units;
          });
          fitting.resize(needed);
          if (std::optional<Lease> lease = try_lock_shared(
                  fitting.size(),
                  [&](std::size_t i) {
                    return std::make_pair(fitting[i].device, fitting[i].total_units);
                  },
                  request))
            return std::move(*lease);
        }
        blocked_by = fmt::format("not enough free GPU memory ({} needed on {} GPU{})",
                                 request.memory_bytes ? format_size(*request.memory_bytes)
                                                      : fmt::format("1/{}", *request.slots),
                                 needed, needed == 1 ? "" : "s");
      }
    }

    if (!request.wait || Clock::now() >= deadline)
      throw Error(ErrorCode::kTimedOut,
                  fmt::format("{}: {}",
                              request.wait ? "no GPU memory became available within the timeout"
                                           : "the requested GPU memory is not free now",
                              blocked_by));
    if (hooks.on_progress && (blocked_by != last_progress || hooks.progress_refresh)) {
      last_progress = blocked_by;
      hooks.on_progress(
          WaitProgress{Clock::now() - start, {}, 0, 0, QueueStanding::kWaiting, blocked_by});
    }
    channel.take();
    channel->watch_releases(dir_.fd(), true);
    if (QueueDirectory* queue = queue_dir(false)) channel->watch_departures(queue->fd(), true);
    auto slice = kSharedRecheck;
    if (hooks.interrupted) slice = std::min(slice, hooks.interrupt_poll);
    if (hooks.progress_refresh) slice = std::min(slice, *hooks.progress_refresh);
    if (deadline != Clock::time_point::max())
      slice =
          std::min(slice, std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()) +
                              std::chrono::milliseconds(1));
    slice = std::max(slice, std::chrono::milliseconds(0));
    const WaitChannel::Wakeup woke = channel->wait(-1, slice);
    if (hooks.interrupted && hooks.interrupted())
      throw Error(ErrorCode::kInterrupted, "interrupted while waiting for GPU memory");
    // The kernel reports a close just before it drops the lock: give the release a moment.
    if (!woke.timed_out()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::optional<Lease> LocalBackend::try_lock_shared(
    std::size_t count, const std::function<std::pair<const Device*, off_t>(std::size_t)>& gpu,
    const LeaseRequest& request) {
  auto lease = std::make_unique<LeaseState>();
  std::vector<UniqueFd> fds;
  std::vector<off_t> offsets;
  std::vector<nlink_t> links;
  std::uint64_t reserved = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const auto [d, total_units] = gpu(i);
    const off_t wanted = wanted_units(request, total_units);
    reserved = static_cast<std::uint64_t>(wanted) * kSharedUnitBytes;
    struct stat opened {};
    UniqueFd fd = dir_.open_lock_file(d->uuid, &opened);
    const std::optional<off_t> slot = lock_shared_units(fd.get(), total_units, wanted);
    if (!slot) return std::nullopt;  // taken outside gpulock's protocol meanwhile
    const std::optional<nlink_t> current = dir_.links_if_current(opened, d->uuid);
    if (!current) return std::nullopt;  // deleted or replaced meanwhile: the lock guards nothing
    fds.push_back(std::move(fd));
    links.push_back(*current);
    offsets.push_back(kSharedRecordBase + *slot * static_cast<off_t>(kHolderRecordSize));
    lease->gpus.push_back(LeasedGpu{d->index, d->display_index(), d->uuid, d->name,
                                    d->is_mig_instance(), d->memory_total_bytes.value_or(0)});
  }
  lease->keeper =
      std::make_unique<LocalLeaseKeeper>(std::move(fds), std::move(links), std::move(offsets));
  lease->id = make_lease_id();
  lease->started_at = std::chrono::system_clock::now();
  HolderRecord& record = lease->record;
  record.lease_id = lease->id;
  record.uid = ::geteuid();
  record.user = user_of(record.uid);
  record.host = host_name();
  record.boot_id = boot_id();
  record.kind = HolderKind::kProcess;
  record.holder = self_process_id();
  record.command = request.command;
  record.label = request.label;
  record.started_at = unix_seconds(lease->started_at);
  record.memory_bytes = reserved;
  for (const auto& g : lease->gpus) record.gpus.push_back(g.uuid);
  lease->keeper->publish_record(record);
  note_served(record.uid);
  return Lease(std::move(lease));
}

}  // namespace gpulock
