// GpuPool: the library's entry point, forwarding each call to the pool's backend.
#include "gpulock/gpu_pool.hpp"

#include "backend/lease_backend.h"
#include "gpulock/error.hpp"
#include "open_backend.h"

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
  return backend_->acquire(request, hooks);
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
