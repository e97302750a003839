// GpuPool: the library's entry point, forwarding each call to the pool's backend.
#include "gpulock/gpu_pool.hpp"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include <fmt/format.h>

#include "backend/lease_backend.h"
#include "backend/lease_state.h"
#include "backend/request_checks.h"
#include "gpulock/error.hpp"
#include "journal/journal_seal.h"
#include "journal/lease_counts.h"
#include "journal/lease_journal.h"
#include "open_backend.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

// The leases that hold GPUs now, as a journal reader needs them (journal/lease_journal.h).
LiveLeases live_leases(LeaseBackend& backend) {
  const PoolStatus status = backend.pool_status();
  LiveLeases live;
  if (!status.spans_hosts) live.host = status.host;
  for (const auto& gpu : status.gpus) {
    if (gpu.state != GpuState::kLeased) continue;
    if (gpu.shared) {
      for (const auto& lease : gpu.shared->leases) live.lease_ids.insert(lease.lease_id);
      // Reservations whose records are unreadable leave their leases unknown.
      if (gpu.shared->leases.size() < gpu.shared->jobs) live.unknown_gpus.insert(gpu.device.uuid);
    } else if (gpu.holder)
      live.lease_ids.insert(gpu.holder->lease_id);
    else
      live.unknown_gpus.insert(gpu.device.uuid);
  }
  return live;
}

}  // namespace

GpuPool GpuPool::open(PoolOptions options) {
  return GpuPool(open_device_source(), std::move(options));
}

GpuPool::GpuPool(std::unique_ptr<DeviceSource> devices, PoolOptions options)
    : backend_(open_backend(std::move(devices), std::move(options))) {}
GpuPool::GpuPool(GpuPool&&) noexcept = default;
GpuPool& GpuPool::operator=(GpuPool&&) noexcept = default;
GpuPool::~GpuPool() = default;

Lease GpuPool::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  const auto asked_at = std::chrono::system_clock::now();
  Lease lease = backend_->acquire(request, hooks);
  if (lease.state_) {
    const double waited = unix_seconds(lease.state_->started_at) - unix_seconds(asked_at);
    journal_lease_start(*lease.state_, backend_->journal(), waited);
  }
  return lease;
}

JournalContents GpuPool::journal() {
  const std::shared_ptr<UsageJournal> journal = backend_->journal();
  // Read before the status: a start read here whose lease is not in the status has ended.
  JournalContents contents = journal->read();
  if (!contents.available) return contents;
  const LiveLeases live = live_leases(*backend_);
  infer_missing_ends(contents, live, *journal, unix_seconds(std::chrono::system_clock::now()));
  return contents;
}

UsageReport GpuPool::usage(double since, double until, UsageGrouping grouping) {
  const JournalContents contents = journal();
  UsageReport report = summarize_usage(pair_journal_records(contents.records), since, until,
                                       grouping, unix_seconds(std::chrono::system_clock::now()));
  report.warnings = contents.warnings;
  if (grouping == UsageGrouping::kGpu) {
    // Beside each UUID, the GPU as people know it now; a GPU gone keeps the journal's index.
    try {
      std::unordered_map<std::string, const Device*> by_uuid;
      const std::vector<Device> devices = backend_->device_source().devices();
      for (const Device& d : devices) by_uuid.emplace(d.uuid, &d);
      for (UsageGroup& g : report.groups)
        if (const auto it = by_uuid.find(g.key); it != by_uuid.end()) {
          g.gpu_index = it->second->display_index();
          g.gpu_name = it->second->name;
        }
    } catch (const Error&) {
      // No devices to ask (no driver now): the journal's indices stand.
    }
  }
  if (!contents.available)
    report.warnings.push_back("no usage journal at " + contents.location +
                              " (`gpulock init` makes it; docs/operations.md)");
  return report;
}

LeaseCounts GpuPool::lease_counts() {
  try {
    const JournalContents contents = journal();
    if (!contents.available) {
      LeaseCounts none;
      none.problem = journal_missing_problem(contents.location);
      return none;
    }
    return count_leases(pair_journal_records(contents.records));
  } catch (const std::exception& e) {
    LeaseCounts none;
    none.problem = e.what();
    return none;
  }
}

const LeaseCounts& GpuPool::follow_lease_counts(LeaseCountFollower& follower) {
  LeaseCountFollower::State& state = *follower.state_;
  try {
    // Read before the status: a start read here whose lease is not in the status has ended.
    bool whole = false;
    const JournalContents appended = backend_->journal()->read_appended(state.cursor, whole);
    state.update(appended, whole, appended.available ? live_leases(*backend_) : LiveLeases{});
  } catch (const std::exception& e) {
    state.counts.available = false;
    state.counts.problem = e.what();
  }
  return state.counts;
}

std::string GpuPool::journal_location() const {
  return backend_->journal()->location();
}
JournalSealReport GpuPool::seal_journal() {
  return backend_->journal()->seal();
}
PoolStatus GpuPool::status() {
  return backend_->status();
}
PoolStatus GpuPool::pool_status() {
  return backend_->pool_status();
}
std::vector<DoctorCheck> GpuPool::doctor() {
  return backend_->doctor();
}
std::string GpuPool::backend_name() const {
  return backend_->name();
}
bool GpuPool::spans_hosts() const {
  return backend_->spans_hosts();
}
QueueStatus GpuPool::queue() {
  return backend_->queue();
}
const Config& GpuPool::config() const {
  return backend_->config();
}
std::vector<Device> GpuPool::devices() {
  return backend_->device_source().devices();
}
void GpuPool::release(const std::string& lease_id) {
  backend_->release(lease_id, /*also_run=*/false);
}

void GpuPool::stop_lease(const std::string& lease_id) {
  backend_->release(lease_id, /*also_run=*/true);
}
std::vector<std::string> GpuPool::leases_holding(const std::vector<std::string>& gpus) {
  const PoolStatus status = backend_->status();
  std::vector<Device> devices;
  for (const auto& gpu : status.gpus) devices.push_back(gpu.device);
  std::vector<std::string> leases;
  for (const Device* device : resolve_explicit(devices, gpus)) {
    const GpuStatus& gpu = status.gpus[static_cast<std::size_t>(device - devices.data())];
    const std::string name = device->display_index();
    if (gpu.shared)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("GPU {} is held by shared leases: name the lease (`gpulock "
                              "status` shows their ids)",
                              name));
    if (gpu.state != GpuState::kLeased || !gpu.holder)
      throw Error(ErrorCode::kNotFound,
                  fmt::format("GPU {} is not leased ({})", name, gpu_state_name(gpu.state)));
    if (std::find(leases.begin(), leases.end(), gpu.holder->lease_id) == leases.end())
      leases.push_back(gpu.holder->lease_id);
  }
  return leases;
}
void GpuPool::prepare() {
  backend_->prepare();
}
DeviceSource& GpuPool::device_source() {
  return backend_->device_source();
}
const std::filesystem::path& GpuPool::lock_dir() const {
  return backend_->lock_dir();
}
std::vector<std::string> GpuPool::warnings() const {
  return backend_->warnings();
}

}  // namespace gpulock
