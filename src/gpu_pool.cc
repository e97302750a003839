// GpuPool: opening a pool, and acquiring leases (all-or-nothing, waiting without polling).
#include "gpulock/gpu_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "gpu_pool_impl.h"
#include "gpulock/error.hpp"
#include "gpulock/parse.hpp"
#include "lease_impl.h"
#include "local/gpu_lock_file.h"
#include "local/release_watcher.h"
#include "process/process_identity.h"
#include "selection.h"
#include "util/random_id.h"
#include "util/strings.h"
#include "visible_devices.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;

// One device considered for a request, and what stands in its way.
struct Candidate {
  const Device* device = nullptr;
  std::string never;    // why it can never serve this request ("" if it can)
  std::string unready;  // why it cannot serve it now ("" if healthy)
  bool healthy() const { return unready.empty(); }
};

std::string describe(const Device& d) {
  return "GPU " + d.display_index();
}

// Why a device can never serve a request, whatever happens: "" if it can.
std::string never_reason(const Device& d, const LeaseRequest& r) {
  if (d.mig_enabled.value_or(false))
    return describe(d) + " has MIG enabled: lease its MIG instances instead";
  if (d.compute_mode == ComputeMode::kProhibited)
    return describe(d) + " is in compute mode 'prohibited'";
  if (r.min_free_memory_bytes && d.memory_total_bytes &&
      *d.memory_total_bytes < *r.min_free_memory_bytes)
    return fmt::format("{} has only {} in total", describe(d), format_size(*d.memory_total_bytes));
  return "";
}

// Why a device cannot serve a request now (health filters, foreign processes): "" if it can.
std::string unready_reason(const Device& d, const LeaseRequest& r) {
  if (r.min_free_memory_bytes) {
    if (!d.memory_free_bytes) return describe(d) + ": free memory unknown";
    if (*d.memory_free_bytes < *r.min_free_memory_bytes)
      return fmt::format("{}: {} free, {} needed", describe(d), format_size(*d.memory_free_bytes),
                         format_size(*r.min_free_memory_bytes));
  }
  if (r.max_utilization_percent) {
    if (!d.utilization_percent) return describe(d) + ": utilisation unknown";
    if (*d.utilization_percent > *r.max_utilization_percent)
      return fmt::format("{}: {}% busy, at most {}% allowed", describe(d), *d.utilization_percent,
                         *r.max_utilization_percent);
  }
  if (r.max_power_watts) {
    if (!d.power_draw_watts) return describe(d) + ": power draw unknown";
    if (*d.power_draw_watts > *r.max_power_watts)
      return fmt::format("{}: drawing {:.0f} W, at most {:.0f} W allowed", describe(d),
                         *d.power_draw_watts, *r.max_power_watts);
  }
  if (!r.allow_foreign_processes && !d.processes_known)
    return describe(d) + ": its processes cannot be listed (--allow-foreign to accept it)";
  if (!r.allow_foreign_processes && !d.processes.empty()) {
    std::string pids;
    for (std::size_t i = 0; i < d.processes.size() && i < 4; ++i)
      pids += (i ? ", " : "") + std::to_string(d.processes[i].pid);
    if (d.processes.size() > 4) pids += ", …";
    return fmt::format("{}: used by process{} {} outside gpulock (--allow-foreign to share)",
                       describe(d), d.processes.size() > 1 ? "es" : "", pids);
  }
  return "";
}

// Resolves the request's explicit GPU names to devices. Throws for unknown or ambiguous names.
std::vector<const Device*> resolve_explicit(const std::vector<Device>& devices,
                                            const std::vector<std::string>& names) {
  std::vector<const Device*> out;
  std::set<const Device*> seen;
  for (const auto& name : names) {
    std::vector<const Device*> matches;
    for (const auto& d : devices) {
      if (d.display_index() == name || d.uuid == name) {
        matches = {&d};
        break;
      }
      if (name.size() >= 5 && starts_with_ignoring_case(d.uuid, name)) matches.push_back(&d);
    }
    if (matches.empty()) {
      std::string known;
      for (const auto& d : devices) known += (known.empty() ? "" : ", ") + d.display_index();
      throw Error(ErrorCode::kUnsatisfiable,
                  fmt::format("no GPU '{}' on this machine (GPUs: {})",
                              sanitize_for_display(name, 96), known.empty() ? "none" : known));
    }
    if (matches.size() > 1)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("'{}' matches several GPUs; give more of the UUID",
                              sanitize_for_display(name, 96)));
    if (!seen.insert(matches.front()).second)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("GPU '{}' is named twice", sanitize_for_display(name, 96)));
    out.push_back(matches.front());
  }
  return out;
}

std::string holder_summary(const HolderRecord& r) {
  // "since" a clock time rather than "for" a duration: it stays true while the caller waits.
  const auto started = static_cast<std::time_t>(r.started_at);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&started, &local);
  char when[32];
  std::strftime(when, sizeof when, now - started < 86400 ? "%H:%M:%S" : "%Y-%m-%d %H:%M", &local);
  std::string text = fmt::format("leased by {} since {} (lease {}", r.user, when, r.lease_id);
  if (!r.label.empty()) text += ", '" + r.label + "'";
  return text + ")";
}

// kUnsatisfiable: the headline, then one indented line per reason.
Error unsatisfiable(const std::string& headline, const std::vector<std::string>& reasons) {
  std::string why = headline;
  if (!reasons.empty()) why += ":";
  for (const auto& reason : reasons) why += "\n  " + reason;
  return Error(ErrorCode::kUnsatisfiable, why);
}

void validate(const LeaseRequest& r) {
  if (r.gpus.empty() && r.count == 0)
    throw Error(ErrorCode::kInvalidArgument, "ask for at least one GPU (-n 1 or more)");
  if (r.gpus.empty() && r.count > 4096)
    throw Error(ErrorCode::kUnsatisfiable,
                fmt::format("{} GPUs is more than any machine has", r.count));
  if (r.timeout && r.timeout->count() < 0)
    throw Error(ErrorCode::kInvalidArgument, "the timeout must not be negative");
}

// The kernel queues IN_CLOSE_WRITE just before it drops the closed file's OFD lock, so a waiter
// woken by a release can find the lock still held for a moment. After each wake-up it therefore
// checks again after these short pauses (or at once on a further event) before sleeping long.
constexpr std::chrono::milliseconds kQuickRechecks[] = {
    std::chrono::milliseconds(1), std::chrono::milliseconds(4), std::chrono::milliseconds(20)};

// Others hold the machine-wide acquire mutex for microseconds. Even a request that does not
// wait gets this long before it concludes that something is wrong with the mutex's holder.
constexpr auto kAcquireMutexGrace = std::chrono::seconds(2);

}  // namespace

void GpuPool::Impl::take_acquire_mutex(Clock::time_point give_up) {
  // Polled rather than blocking (F_OFD_SETLKW), so that a process stopped inside its critical
  // section, or one holding the 0666 mutex file's lock on purpose, cannot hang every request:
  // they time out (75) with an explanation instead.
  auto pause = std::chrono::microseconds(50);
  while (!try_lock_exclusive(acquire_mutex_fd_.get())) {
    if (Clock::now() >= give_up) {
      throw Error(ErrorCode::kTimedOut,
                  fmt::format("the machine-wide acquire lock {} is held by another process and "
                              "was not released in time (a stopped or misbehaving process?)",
                              (dir.path() / ".acquire.lock").string()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

GpuPool::Impl::WatcherLoan::~WatcherLoan() {
  if (!watcher_) return;
  std::lock_guard<std::mutex> lock(pool_.watchers_mutex_);
  pool_.idle_watchers_.push_back(std::move(watcher_));
}

void GpuPool::Impl::WatcherLoan::take() {
  {
    std::lock_guard<std::mutex> lock(pool_.watchers_mutex_);
    if (!pool_.idle_watchers_.empty()) {
      watcher_ = std::move(pool_.idle_watchers_.back());
      pool_.idle_watchers_.pop_back();
    }
  }
  if (watcher_) {
    watcher_->discard_pending();  // what happened while it was idle is no news to this caller
  } else {
    watcher_ = std::make_unique<ReleaseWatcher>(pool_.dir.fd());
  }
}

GpuPool::Impl::Impl(std::unique_ptr<DeviceSource> source_in, PoolOptions options_in)
    : source(std::move(source_in)),
      options(std::move(options_in)),
      dir(LockDirectory::open(options.lock_dir.value_or(default_lock_directory()))) {}

LockProbe GpuPool::Impl::probe(const std::string& uuid, bool with_record) const {
  LockProbe result;
  try {
    UniqueFd fd = dir.open_lock_file_for_reading(uuid);
    if (!fd) return result;  // no lock file: nobody has ever locked this GPU
    result.locked = is_locked_elsewhere(fd.get());
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

Lease GpuPool::Impl::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  validate(request);
  const auto start = Clock::now();
  // No deadline is time_point::max(); --no-wait is a deadline of now.
  // A timeout too long for the clock (centuries) is no deadline rather than an overflow.
  const bool bounded =
      request.timeout && *request.timeout < std::chrono::duration_cast<std::chrono::milliseconds>(
                                                Clock::time_point::max() - start);
  const Clock::time_point deadline = !request.wait ? start
                                     : bounded     ? start + *request.timeout
                                                   : Clock::time_point::max();
  WatcherLoan watcher(*this);  // set up on the first failed attempt, if the request waits
  int quick_rechecks = 0;      // left after a wake-up; see kQuickRechecks
  std::string last_progress;

  while (true) {
    const std::vector<Device> devices = source->devices();

    // 1. Which devices could serve this request at all, and which are healthy now.
    std::vector<const Device*> pool;
    if (!request.gpus.empty()) {
      pool = resolve_explicit(devices, request.gpus);
    } else {
      for (const auto& d : devices) pool.push_back(&d);
    }
    const std::size_t needed = request.gpus.empty() ? request.count : request.gpus.size();
    std::vector<Candidate> candidates;
    std::vector<std::string> never_reasons;
    for (const Device* d : pool) {
      Candidate c{d, never_reason(*d, request), ""};
      if (c.never.empty() && request.cuda_visible_devices &&
          !visible_under(*d, *request.cuda_visible_devices)) {
        c.never = fmt::format("{} is outside CUDA_VISIBLE_DEVICES={}", describe(*d),
                              sanitize_for_display(*request.cuda_visible_devices, 128));
      }
      if (!c.never.empty()) {
        // Devices the caller did not name are silently unsuitable; named ones must all be usable.
        if (!request.gpus.empty()) throw Error(ErrorCode::kUnsatisfiable, c.never);
        never_reasons.push_back(c.never);
        continue;
      }
      c.unready = unready_reason(*d, request);
      candidates.push_back(std::move(c));
    }
    if (candidates.size() < needed) {
      throw unsatisfiable(
          fmt::format("{} GPU{} requested but this machine has {} that can serve it", needed,
                      needed == 1 ? "" : "s", candidates.size()),
          never_reasons);
    }

    // 2. Under the machine-wide acquire mutex: take the best free set, all or nothing.
    {
      std::lock_guard<std::mutex> guard(acquire_mutex_);
      if (!acquire_mutex_fd_) acquire_mutex_fd_ = dir.open_acquire_mutex();
      take_acquire_mutex(std::max(deadline, start + kAcquireMutexGrace));
      struct Unlocker {
        int fd;
        ~Unlocker() { unlock(fd); }
      } unlocker{acquire_mutex_fd_.get()};

      std::vector<const Device*> free;
      std::vector<std::string> free_uuids;
      std::size_t unusable = 0;
      for (auto& c : candidates) {
        if (!c.healthy()) continue;
        const LockProbe p = probe(c.device->uuid, false);
        if (!p.error.empty()) {  // e.g. a symlink planted under the lock file's name
          c.never = p.error;
          never_reasons.push_back(c.never);
          ++unusable;
          continue;
        }
        if (p.locked) continue;
        free.push_back(c.device);
        free_uuids.push_back(c.device->uuid);
        // One GPU of any: the first free one in index order is the choice; probe no further.
        if (request.gpus.empty() && needed == 1) break;
      }
      if (unusable > 0 && (!request.gpus.empty() || candidates.size() - unusable < needed)) {
        throw unsatisfiable("cannot serve this request", never_reasons);
      }
      std::optional<std::vector<std::size_t>> chosen;
      if (!request.gpus.empty()) {
        if (free.size() == candidates.size()) {
          chosen.emplace(free.size());
          for (std::size_t i = 0; i < free.size(); ++i) (*chosen)[i] = i;
        }
      } else {
        chosen = choose_gpus(
            free_uuids, needed,
            [this](const std::string& a, const std::string& b) { return source->distance(a, b); });
      }
      if (chosen) {
        auto impl = std::make_unique<Lease::Impl>();
        bool all_locked = true;
        bool replaced = false;
        for (std::size_t position : *chosen) {
          const Device& d = *free[position];
          UniqueFd fd = dir.open_lock_file(d.uuid);
          if (!try_lock_exclusive(fd.get())) {
            all_locked = false;  // a process outside gpulock's protocol holds it; try again later
            break;
          }
          if (!dir.is_current_lock_file(fd.get(), d.uuid)) {
            // Deleted or replaced between our open and our lock: the lock guards nothing.
            all_locked = false;
            replaced = true;
            break;
          }
          impl->raw_fds.push_back(fd.get());
          impl->fds.push_back(std::move(fd));
          impl->gpus.push_back(
              LeasedGpu{d.index, d.display_index(), d.uuid, d.name, d.is_mig_instance()});
        }
        if (all_locked) {
          impl->id = make_lease_id();
          impl->started_at = std::chrono::system_clock::now();
          HolderRecord& record = impl->record;
          record.lease_id = impl->id;
          record.uid = ::geteuid();
          record.user = user_name(record.uid);
          record.host = host_name();
          record.boot_id = boot_id();
          record.kind = HolderKind::kProcess;
          record.holder = self_process_id();
          record.command = request.command;
          record.label = request.label;
          record.started_at =
              std::chrono::duration<double>(impl->started_at.time_since_epoch()).count();
          for (const auto& gpu : impl->gpus) record.gpus.push_back(gpu.uuid);
          impl->write_records();
          return Lease(std::move(impl));
        }
        if (replaced) continue;  // try again at once, with the file now under that name
      }
    }

    // 3. Not served now: explain why, then sleep until a release (or a health re-check).
    if (request.wait && !watcher) {
      // Watch before the next check, so a release between check and sleep is not missed.
      watcher.take();
      continue;
    }
    std::vector<BlockingGpu> blocking;
    std::string signature;  // what blocks, without the ever-changing durations
    bool health_dependent = false;
    std::size_t usable = 0;      // candidates not ruled out for good
    std::string own_lease_gpus;  // held by the lease the caller runs under
    for (const auto& c : candidates) {
      if (!c.never.empty()) continue;
      BlockingGpu b{c.device->display_index(), c.device->uuid, ""};
      const LockProbe p = probe(c.device->uuid, true);
      if (p.locked && p.record && request.enclosing_lease_id &&
          p.record->lease_id == *request.enclosing_lease_id) {
        own_lease_gpus += (own_lease_gpus.empty() ? "" : ", ") + c.device->display_index();
        continue;  // will not be released while the caller runs
      }
      ++usable;
      if (p.locked) {
        b.reason = p.record ? holder_summary(*p.record) : "leased (details unavailable)";
        signature += c.device->uuid + " leased " + (p.record ? p.record->lease_id : "") + "\n";
      } else if (!c.healthy()) {
        b.reason = c.unready;
        signature += c.device->uuid + " " + c.unready + "\n";
        health_dependent = true;
      } else {
        continue;  // free, but not enough free ones together
      }
      blocking.push_back(std::move(b));
    }
    if (usable < needed) {
      throw Error(ErrorCode::kUnsatisfiable,
                  fmt::format("{} GPU{} requested, but GPU {} {} held by the lease this process "
                              "runs under ({}, GPULOCK_LEASE_ID), which cannot end while it "
                              "waits; use those GPUs, or run outside that lease",
                              needed, needed == 1 ? "" : "s", own_lease_gpus,
                              own_lease_gpus.find(',') == std::string::npos ? "is" : "are",
                              *request.enclosing_lease_id));
    }
    if (!request.wait || Clock::now() >= deadline) {
      std::string why = request.wait ? "no GPU became available within the timeout"
                                     : "the requested GPUs are not free now";
      for (const auto& b : blocking) why += "\n  GPU " + b.display_index + ": " + b.reason;
      throw Error(ErrorCode::kTimedOut, why);
    }
    if (hooks.on_progress) {
      if (signature != last_progress) {
        last_progress = signature;
        hooks.on_progress(WaitProgress{Clock::now() - start, blocking});
      }
    }
    auto sleep =
        health_dependent ? options.health_recheck_interval : options.safety_recheck_interval;
    if (hooks.interrupted) sleep = std::min(sleep, hooks.interrupt_poll);
    if (quick_rechecks > 0) {
      sleep = std::min(sleep, kQuickRechecks[std::size(kQuickRechecks) - quick_rechecks]);
      --quick_rechecks;
    }
    if (deadline != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      sleep = std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(0), sleep);
    }
    if (watcher->wait(sleep)) quick_rechecks = static_cast<int>(std::size(kQuickRechecks));
    if (hooks.interrupted && hooks.interrupted())
      throw Error(ErrorCode::kInterrupted, "interrupted while waiting for GPUs");
  }
}

GpuPool GpuPool::open(PoolOptions options) {
  return GpuPool(open_device_source(), std::move(options));
}

GpuPool::GpuPool(std::unique_ptr<DeviceSource> devices, PoolOptions options)
    : impl_(std::make_unique<Impl>(std::move(devices), std::move(options))) {}
GpuPool::GpuPool(GpuPool&&) noexcept = default;
GpuPool& GpuPool::operator=(GpuPool&&) noexcept = default;
GpuPool::~GpuPool() = default;

Lease GpuPool::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  return impl_->acquire(request, hooks);
}
PoolStatus GpuPool::status() {
  return impl_->status();
}
std::vector<Device> GpuPool::devices() {
  return impl_->source->devices();
}
void GpuPool::release(const std::string& lease_id) {
  impl_->release(lease_id);
}
void GpuPool::prepare() {
  std::vector<std::string> uuids;
  for (const auto& device : impl_->source->devices()) uuids.push_back(device.uuid);
  impl_->dir.prepare(uuids);
}
DeviceSource& GpuPool::device_source() {
  return *impl_->source;
}
const std::filesystem::path& GpuPool::lock_dir() const {
  return impl_->dir.path();
}
std::vector<std::string> GpuPool::warnings() const {
  return impl_->dir.warnings();
}

}  // namespace gpulock
