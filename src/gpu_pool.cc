// GpuPool: the library's entry point, forwarding each call to the pool's backend.
#include "gpulock/gpu_pool.hpp"

#include <chrono>

#include "backend/lease_backend.h"
#include "backend/lease_state.h"
#include "gpulock/error.hpp"
#include "journal/lease_journal.h"
#include "open_backend.h"
#include "util/unix_time.h"

namespace gpulock {

GpuPool GpuPool::open(PoolOptions options) {
  return GpuPool(open_device_source(), std::move(options));
}

GpuPool::GpuPool(std::unique_ptr<DeviceSource> devices, PoolOptions options)
    : backend_(open_backend(std::move(devices), std::move(options))) {}
GpuPool::GpuPool(GpuPool&&) noexcept = default;
GpuPool& GpuPool::operator=(GpuPool&&) noexcept = default;
GpuPool::~GpuPool() = default;

Lease GpuPool::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  if ((request.memory_bytes || request.slots) && backend_->name() != "file")
    throw Error(ErrorCode::kUnsatisfiable,
                "shared leases (--mem, --slots) are only supported on the local backend so far");
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
  const PoolStatus status = backend_->pool_status();
  LiveLeases live;
  if (backend_->name() == "file") live.host = status.host;
  for (const auto& gpu : status.gpus) {
    if (gpu.state != GpuState::kLeased) continue;
    if (gpu.holder)
      live.lease_ids.insert(gpu.holder->lease_id);
    else
      live.unknown_gpus.insert(gpu.device.uuid);
  }
  infer_missing_ends(contents, live, *journal, unix_seconds(std::chrono::system_clock::now()));
  return contents;
}

UsageReport GpuPool::usage(double since, double until, UsageGrouping grouping) {
  const JournalContents contents = journal();
  UsageReport report = summarize_usage(pair_journal_records(contents.records), since, until,
                                       grouping, unix_seconds(std::chrono::system_clock::now()));
  report.warnings = contents.warnings;
  if (!contents.available)
    report.warnings.push_back("no usage journal at " + contents.location +
                              " (`gpulock init` makes it; docs/operations.md)");
  return report;
}

std::string GpuPool::journal_location() const {
  return backend_->journal()->location();
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
  backend_->release(lease_id);
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
