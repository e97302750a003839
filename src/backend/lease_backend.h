// LeaseBackend: where leases are kept, behind one interface that GpuPool forwards to.
//
// Two backends implement it: local lock files with kernel OFD locks (local/local_backend.h) and
// a Redis server shared by several hosts (redis/redis_backend.h). open_backend() (open_backend.h)
// chooses one from the settings. Every method has the contract of the GpuPool method of the
// same name (include/gpulock/gpu_pool.hpp); tests/unit/gpu_pool_contract_test.cc checks both.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gpulock/config.hpp"
#include "gpulock/device_source.hpp"
#include "gpulock/doctor.hpp"
#include "gpulock/lease.hpp"
#include "gpulock/queue.hpp"
#include "gpulock/request.hpp"
#include "gpulock/status.hpp"
#include "journal/usage_journal.h"

namespace gpulock {

class LeaseBackend {
 public:
  virtual ~LeaseBackend() = default;

  virtual Lease acquire(const LeaseRequest& request, const WaitHooks& hooks) = 0;
  // This host's GPUs; pool_status(): every host's (the same where there is one host).
  virtual PoolStatus status() = 0;
  virtual PoolStatus pool_status() = 0;
  virtual QueueStatus queue() = 0;
  // Ends a detached lease; with `also_run`, also a lease of `gpulock run` on this host, whose
  // command gets SIGTERM through it (GpuPool::stop_lease).
  virtual void release(const std::string& lease_id, bool also_run) = 0;
  virtual std::vector<DoctorCheck> doctor() = 0;
  // Makes ready at boot what the backend keeps on this machine (`gpulock init`).
  virtual void prepare() = 0;

  // What the pool reports about itself.
  virtual std::string name() const = 0;  // "file" or "redis", for people; branch on what follows
  // Whether the pool holds many hosts' GPUs behind a server that may be unreachable (leases carry
  // their host), or only this machine's (PoolStatus::spans_hosts says the same).
  virtual bool spans_hosts() const = 0;
  virtual const Config& config() const = 0;
  virtual DeviceSource& device_source() = 0;
  virtual const std::filesystem::path& lock_dir() const = 0;  // empty where there is none
  virtual std::vector<std::string> warnings() const = 0;
  // Where lease starts and ends are recorded (never null; a DisabledJournal when turned off).
  virtual std::shared_ptr<UsageJournal> journal() = 0;
};

}  // namespace gpulock
