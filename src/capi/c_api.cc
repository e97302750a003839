// The C API (include/gpulock/gpulock.h): opaque handles that own C++ objects, and a boundary
// that turns every C++ exception into a status code and a per-thread message.
#include "gpulock/gpulock.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"
#include "gpulock/json_output.hpp"
#include "gpulock/parse.hpp"
#include "gpulock/version.hpp"

struct gpulock_pool {
  gpulock::GpuPool pool;
};

struct gpulock_request {
  gpulock::LeaseRequest request;
  int (*interrupted)(void*) = nullptr;
  void* interrupt_data = nullptr;
  unsigned interrupt_poll_ms = 100;
};

struct gpulock_lease {
  gpulock::Lease lease;
  // Copies taken at acquisition: the accessors return these, so the strings they return stay
  // valid until the handle is freed, also after gpulock_lease_release() (which frees the
  // Lease's own state).
  std::string id;
  std::vector<gpulock::LeasedGpu> gpus;
  std::string cuda_visible_devices;
  std::uint64_t fencing_token = 0;
  std::string host;
  std::uint64_t memory_bytes = 0;
};

namespace {

thread_local std::string last_error;

gpulock_status status_of(gpulock::ErrorCode code) {
  using gpulock::ErrorCode;
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return GPULOCK_INVALID_ARGUMENT;
    case ErrorCode::kUnsatisfiable:
      return GPULOCK_UNSATISFIABLE;
    case ErrorCode::kEnvironment:
      return GPULOCK_ENVIRONMENT;
    case ErrorCode::kPermissionDenied:
      return GPULOCK_PERMISSION_DENIED;
    case ErrorCode::kNotFound:
      return GPULOCK_NOT_FOUND;
    case ErrorCode::kTimedOut:
      return GPULOCK_TIMED_OUT;
    case ErrorCode::kInterrupted:
      return GPULOCK_INTERRUPTED;
    case ErrorCode::kInternal:
      return GPULOCK_INTERNAL;
    case ErrorCode::kConfig:
      return GPULOCK_CONFIG;
  }
  return GPULOCK_INTERNAL;
}

gpulock_status fail(gpulock_status status, const char* message) {
  try {
    last_error = message;
  } catch (...) {
    // No memory even for the message: the status still says what happened.
  }
  return status;
}

// Runs `body`, turning whatever it throws into a status. Nothing may escape into C.
template <typename Body>
gpulock_status guarded(Body&& body) noexcept {
  try {
    body();
    return GPULOCK_OK;
  } catch (const gpulock::Error& error) {
    return fail(status_of(error.code()), error.what());
  } catch (const std::bad_alloc&) {
    return fail(GPULOCK_NO_MEMORY, "out of memory");
  } catch (const std::exception& error) {
    return fail(GPULOCK_INTERNAL, error.what());
  } catch (...) {
    return fail(GPULOCK_INTERNAL, "unexpected failure");
  }
}

gpulock_status null_argument(const char* function, const char* parameter) noexcept {
  try {
    last_error = std::string(function) + ": " + parameter + " is NULL";
  } catch (...) {
    // As in fail(): the status still says what happened.
  }
  return GPULOCK_INVALID_ARGUMENT;
}

// A malloc'd copy, for strings the caller frees with gpulock_free().
char* copy_for_caller(const std::string& text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) throw std::bad_alloc();
  std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

const gpulock::LeasedGpu* gpu_at(const gpulock_lease* lease, size_t i) {
  if (lease == nullptr || i >= lease->gpus.size()) return nullptr;
  return &lease->gpus[i];
}

}  // namespace

extern "C" {

const char* gpulock_version(void) {
  return GPULOCK_VERSION_STRING;
}

const char* gpulock_last_error(void) {
  return last_error.c_str();
}

const char* gpulock_status_name(gpulock_status status) {
  switch (status) {
    case GPULOCK_OK:
      return "ok";
    case GPULOCK_INVALID_ARGUMENT:
      return "invalid_argument";
    case GPULOCK_UNSATISFIABLE:
      return "unsatisfiable";
    case GPULOCK_ENVIRONMENT:
      return "environment";
    case GPULOCK_PERMISSION_DENIED:
      return "permission_denied";
    case GPULOCK_NOT_FOUND:
      return "not_found";
    case GPULOCK_TIMED_OUT:
      return "timed_out";
    case GPULOCK_INTERRUPTED:
      return "interrupted";
    case GPULOCK_INTERNAL:
      return "internal";
    case GPULOCK_CONFIG:
      return "config";
    case GPULOCK_NO_MEMORY:
      return "no_memory";
  }
  return "unknown";
}

int gpulock_exit_code(gpulock_status status) {
  using gpulock::ErrorCode;
  switch (status) {
    case GPULOCK_OK:
      return 0;
    case GPULOCK_INVALID_ARGUMENT:
      return gpulock::exit_status_for(ErrorCode::kInvalidArgument);
    case GPULOCK_UNSATISFIABLE:
      return gpulock::exit_status_for(ErrorCode::kUnsatisfiable);
    case GPULOCK_ENVIRONMENT:
      return gpulock::exit_status_for(ErrorCode::kEnvironment);
    case GPULOCK_PERMISSION_DENIED:
      return gpulock::exit_status_for(ErrorCode::kPermissionDenied);
    case GPULOCK_NOT_FOUND:
      return gpulock::exit_status_for(ErrorCode::kNotFound);
    case GPULOCK_TIMED_OUT:
      return gpulock::exit_status_for(ErrorCode::kTimedOut);
    case GPULOCK_INTERRUPTED:
      return gpulock::exit_status_for(ErrorCode::kInterrupted);
    case GPULOCK_CONFIG:
      return gpulock::exit_status_for(ErrorCode::kConfig);
    case GPULOCK_INTERNAL:
    case GPULOCK_NO_MEMORY:
      return gpulock::exit_status_for(ErrorCode::kInternal);
  }
  return gpulock::exit_status_for(ErrorCode::kInternal);
}

void gpulock_free(char* string) {
  std::free(string);
}

gpulock_status gpulock_pool_open(const char* lock_dir, gpulock_pool** pool) {
  if (pool == nullptr) return null_argument("gpulock_pool_open", "pool");
  return guarded([&] {
    gpulock::PoolOptions options;
    if (lock_dir != nullptr) {
      if (*lock_dir == '\0')
        throw gpulock::Error(gpulock::ErrorCode::kInvalidArgument,
                             "gpulock_pool_open: lock_dir is empty (pass NULL for the default)");
      options.lock_dir = lock_dir;
    }
    *pool = new gpulock_pool{gpulock::GpuPool::open(std::move(options))};
  });
}

void gpulock_pool_free(gpulock_pool* pool) {
  delete pool;
}

gpulock_status gpulock_pool_status_json(gpulock_pool* pool, char** json) {
  if (pool == nullptr) return null_argument("gpulock_pool_status_json", "pool");
  if (json == nullptr) return null_argument("gpulock_pool_status_json", "json");
  return guarded([&] { *json = copy_for_caller(gpulock::status_to_json(pool->pool.status())); });
}

gpulock_status gpulock_pool_gpus_json(gpulock_pool* pool, char** json) {
  if (pool == nullptr) return null_argument("gpulock_pool_gpus_json", "pool");
  if (json == nullptr) return null_argument("gpulock_pool_gpus_json", "json");
  return guarded([&] {
    auto& source = pool->pool.device_source();
    *json = copy_for_caller(
        gpulock::devices_to_json(pool->pool.devices(), source.description(), source.simulated()));
  });
}

gpulock_status gpulock_pool_queue_json(gpulock_pool* pool, char** json) {
  if (pool == nullptr) return null_argument("gpulock_pool_queue_json", "pool");
  if (json == nullptr) return null_argument("gpulock_pool_queue_json", "json");
  return guarded([&] { *json = copy_for_caller(gpulock::queue_to_json(pool->pool.queue())); });
}

gpulock_status gpulock_pool_release(gpulock_pool* pool, const char* lease_id) {
  if (pool == nullptr) return null_argument("gpulock_pool_release", "pool");
  if (lease_id == nullptr) return null_argument("gpulock_pool_release", "lease_id");
  return guarded([&] { pool->pool.release(lease_id); });
}

gpulock_request* gpulock_request_new(void) {
  return new (std::nothrow) gpulock_request();
}

void gpulock_request_free(gpulock_request* request) {
  delete request;
}

gpulock_status gpulock_request_set_count(gpulock_request* request, unsigned count) {
  if (request == nullptr) return null_argument("gpulock_request_set_count", "request");
  if (count == 0) return fail(GPULOCK_INVALID_ARGUMENT, "the GPU count must be at least 1");
  request->request.count = count;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_gpus(gpulock_request* request, const char* gpus) {
  if (request == nullptr) return null_argument("gpulock_request_set_gpus", "request");
  return guarded([&] {
    request->request.gpus = gpus == nullptr || *gpus == '\0' ? std::vector<std::string>{}
                                                             : gpulock::parse_gpu_list(gpus);
  });
}

gpulock_status gpulock_request_set_min_free_memory(gpulock_request* request, uint64_t bytes) {
  if (request == nullptr) return null_argument("gpulock_request_set_min_free_memory", "request");
  request->request.min_free_memory_bytes = bytes;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_memory(gpulock_request* request, uint64_t bytes) {
  if (request == nullptr) return null_argument("gpulock_request_set_memory", "request");
  if (bytes == 0) return fail(GPULOCK_INVALID_ARGUMENT, "a shared lease needs more than 0 bytes");
  request->request.memory_bytes = bytes;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_slots(gpulock_request* request, unsigned slots) {
  if (request == nullptr) return null_argument("gpulock_request_set_slots", "request");
  if (slots == 0) return fail(GPULOCK_INVALID_ARGUMENT, "slots must be at least 1");
  request->request.slots = slots;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_spread(gpulock_request* request, int spread) {
  if (request == nullptr) return null_argument("gpulock_request_set_spread", "request");
  request->request.spread = spread != 0;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_max_utilization(gpulock_request* request, unsigned percent) {
  if (request == nullptr) return null_argument("gpulock_request_set_max_utilization", "request");
  if (percent > 100) return fail(GPULOCK_INVALID_ARGUMENT, "utilisation is at most 100 percent");
  request->request.max_utilization_percent = percent;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_max_power(gpulock_request* request, double watts) {
  if (request == nullptr) return null_argument("gpulock_request_set_max_power", "request");
  if (!(watts >= 0) || watts > 1e6)
    return fail(GPULOCK_INVALID_ARGUMENT, "the power limit must be between 0 and 1e6 watts");
  request->request.max_power_watts = watts;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_allow_foreign(gpulock_request* request, int allow) {
  if (request == nullptr) return null_argument("gpulock_request_set_allow_foreign", "request");
  request->request.allow_foreign_processes = allow != 0;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_wait(gpulock_request* request, int wait) {
  if (request == nullptr) return null_argument("gpulock_request_set_wait", "request");
  request->request.wait = wait != 0;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_timeout_ms(gpulock_request* request, int64_t timeout_ms) {
  if (request == nullptr) return null_argument("gpulock_request_set_timeout_ms", "request");
  if (timeout_ms < 0) {
    request->request.timeout.reset();
  } else {
    request->request.timeout = std::chrono::milliseconds(timeout_ms);
  }
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_low_priority(gpulock_request* request, int low) {
  if (request == nullptr) return null_argument("gpulock_request_set_low_priority", "request");
  request->request.priority = low != 0 ? gpulock::Priority::kLow : gpulock::Priority::kNormal;
  return GPULOCK_OK;
}

gpulock_status gpulock_request_set_label(gpulock_request* request, const char* label) {
  if (request == nullptr) return null_argument("gpulock_request_set_label", "request");
  return guarded([&] { request->request.label = label == nullptr ? "" : label; });
}

gpulock_status gpulock_request_set_hosts(gpulock_request* request, const char* hosts) {
  if (request == nullptr) return null_argument("gpulock_request_set_hosts", "request");
  return guarded([&] {
    request->request.hosts.clear();
    if (hosts != nullptr && *hosts != '\0') request->request.hosts = gpulock::parse_gpu_list(hosts);
  });
}

gpulock_status gpulock_request_set_command(gpulock_request* request, const char* command) {
  if (request == nullptr) return null_argument("gpulock_request_set_command", "request");
  return guarded([&] { request->request.command = command == nullptr ? "" : command; });
}

gpulock_status gpulock_request_set_visible_devices(gpulock_request* request, const char* value) {
  if (request == nullptr) return null_argument("gpulock_request_set_visible_devices", "request");
  return guarded([&] {
    if (value == nullptr) {
      request->request.cuda_visible_devices.reset();
    } else {
      request->request.cuda_visible_devices = value;
    }
  });
}

gpulock_status gpulock_request_set_enclosing_lease(gpulock_request* request, const char* lease_id) {
  if (request == nullptr) return null_argument("gpulock_request_set_enclosing_lease", "request");
  return guarded([&] {
    if (lease_id == nullptr || *lease_id == '\0') {
      request->request.enclosing_lease_id.reset();
    } else {
      request->request.enclosing_lease_id = lease_id;
    }
  });
}

gpulock_status gpulock_request_set_interrupt(gpulock_request* request,
                                             int (*interrupted)(void* user_data), void* user_data,
                                             unsigned poll_ms) {
  if (request == nullptr) return null_argument("gpulock_request_set_interrupt", "request");
  request->interrupted = interrupted;
  request->interrupt_data = user_data;
  request->interrupt_poll_ms = poll_ms == 0 ? 1 : poll_ms;
  return GPULOCK_OK;
}

gpulock_status gpulock_acquire(gpulock_pool* pool, const gpulock_request* request,
                               gpulock_lease** lease) {
  if (pool == nullptr) return null_argument("gpulock_acquire", "pool");
  if (request == nullptr) return null_argument("gpulock_acquire", "request");
  if (lease == nullptr) return null_argument("gpulock_acquire", "lease");
  return guarded([&] {
    gpulock::WaitHooks hooks;
    if (request->interrupted != nullptr) {
      hooks.interrupted = [request] { return request->interrupted(request->interrupt_data) != 0; };
      hooks.interrupt_poll = std::chrono::milliseconds(request->interrupt_poll_ms);
    }
    auto held = std::make_unique<gpulock_lease>();
    held->lease = pool->pool.acquire(request->request, hooks);
    held->id = held->lease.id();
    held->gpus = held->lease.gpus();
    held->cuda_visible_devices = held->lease.cuda_visible_devices();
    held->fencing_token = held->lease.fencing_token();
    held->memory_bytes = held->lease.memory_bytes();
    held->host = held->lease.host();
    *lease = held.release();
  });
}

const char* gpulock_lease_id(const gpulock_lease* lease) {
  return lease == nullptr ? nullptr : lease->id.c_str();
}

uint64_t gpulock_lease_memory_bytes(const gpulock_lease* lease) {
  return lease == nullptr ? 0 : lease->memory_bytes;
}

uint64_t gpulock_lease_fencing_token(const gpulock_lease* lease) {
  return lease == nullptr ? 0 : lease->fencing_token;
}

const char* gpulock_lease_host(const gpulock_lease* lease) {
  return lease == nullptr ? nullptr : lease->host.c_str();
}

int gpulock_lease_lost(const gpulock_lease* lease) {
  return lease != nullptr && lease->lease.lost() ? 1 : 0;
}

gpulock_status gpulock_lease_verify(gpulock_lease* lease, uint64_t* token) {
  if (lease == nullptr) return null_argument("gpulock_lease_verify", "lease");
  if (token == nullptr) return null_argument("gpulock_lease_verify", "token");
  return guarded([&] { *token = lease->lease.verify(); });
}

size_t gpulock_lease_gpu_count(const gpulock_lease* lease) {
  return lease == nullptr ? 0 : lease->gpus.size();
}

unsigned gpulock_lease_gpu_index(const gpulock_lease* lease, size_t i) {
  const auto* gpu = gpu_at(lease, i);
  return gpu == nullptr ? 0 : gpu->index;
}

const char* gpulock_lease_gpu_display_index(const gpulock_lease* lease, size_t i) {
  const auto* gpu = gpu_at(lease, i);
  return gpu == nullptr ? nullptr : gpu->display_index.c_str();
}

const char* gpulock_lease_gpu_uuid(const gpulock_lease* lease, size_t i) {
  const auto* gpu = gpu_at(lease, i);
  return gpu == nullptr ? nullptr : gpu->uuid.c_str();
}

const char* gpulock_lease_cuda_visible_devices(const gpulock_lease* lease) {
  return lease == nullptr ? nullptr : lease->cuda_visible_devices.c_str();
}

int gpulock_lease_active(const gpulock_lease* lease) {
  return lease != nullptr && lease->lease.active() ? 1 : 0;
}

void gpulock_lease_release(gpulock_lease* lease) {
  if (lease != nullptr) lease->lease.release();
}

void gpulock_lease_free(gpulock_lease* lease) {
  delete lease;
}

}  // extern "C"
