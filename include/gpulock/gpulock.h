/* gpulock's C API: plain functions and opaque handles over the C++ library, for C programs and
 * for any language's foreign-function interface (link with -lgpulock_c, or dlopen
 * libgpulock_c.so).
 *
 *   gpulock_pool* pool = NULL;
 *   gpulock_request* request = gpulock_request_new();
 *   gpulock_lease* lease = NULL;
 *   gpulock_request_set_count(request, 2);
 *   if (gpulock_pool_open(NULL, &pool) != GPULOCK_OK ||
 *       gpulock_acquire(pool, request, &lease) != GPULOCK_OK) {
 *     fprintf(stderr, "gpulock: %s\n", gpulock_last_error());
 *     return 1;
 *   }
 *   setenv("CUDA_VISIBLE_DEVICES", gpulock_lease_cuda_visible_devices(lease), 1);
 *   ...
 *   gpulock_lease_free(lease);   (releases the GPUs)
 *   gpulock_request_free(request);
 *   gpulock_pool_free(pool);
 *
 * Conventions:
 *  - Functions that can fail return a gpulock_status; GPULOCK_OK is 0. On failure,
 *    gpulock_last_error() returns a message for people, kept per thread until the next failing
 *    call on that thread. Output parameters are set only on success.
 *  - Strings passed in are UTF-8 (or plain bytes) and are copied; strings returned by accessors
 *    stay valid as long as the handle they came from. Strings returned through `char**` are
 *    the caller's, to free with gpulock_free().
 *  - Handles are not shared between threads without the caller's own locking, except a pool,
 *    which several threads may use at once.
 *  - A lease is held by this process. A child made by fork() shares it: the GPUs stay leased
 *    until the last process holding it ends or releases it. Its descriptors are close-on-exec.
 */
#ifndef GPULOCK_GPULOCK_H
#define GPULOCK_GPULOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPULOCK_C_API_VERSION 1

typedef enum gpulock_status {
  GPULOCK_OK = 0,
  GPULOCK_INVALID_ARGUMENT = 1,  /* a malformed request or argument (CLI exit 64) */
  GPULOCK_UNSATISFIABLE = 2,     /* can never be served: too many GPUs, unknown GPU (69) */
  GPULOCK_ENVIRONMENT = 3,       /* no driver, unusable lock directory (69) */
  GPULOCK_PERMISSION_DENIED = 4, /* e.g. releasing another user's lease (69) */
  GPULOCK_NOT_FOUND = 5,         /* e.g. no such lease (69) */
  GPULOCK_TIMED_OUT = 6,         /* not served in time, or not at once without waiting (75) */
  GPULOCK_INTERRUPTED = 7,       /* the interrupt callback asked to stop waiting (75) */
  GPULOCK_INTERNAL = 8,          /* a bug or an unexpected system failure (70) */
  GPULOCK_CONFIG = 9,            /* the administrator's config file is invalid (78) */
  GPULOCK_NO_MEMORY = 10         /* out of memory (70) */
} gpulock_status;

typedef struct gpulock_pool gpulock_pool;
typedef struct gpulock_request gpulock_request;
typedef struct gpulock_lease gpulock_lease;

/* The library's version, e.g. "0.1.0". */
const char* gpulock_version(void);

/* The last failure's message on this thread; "" if none. */
const char* gpulock_last_error(void);
/* A status's name: "ok", "invalid_argument", "timed_out", ... */
const char* gpulock_status_name(gpulock_status status);
/* The exit status the gpulock CLI uses for a status (0, 64, 69, 70, 75 or 78). */
int gpulock_exit_code(gpulock_status status);

/* Frees a string returned through a `char**` parameter. NULL is accepted. */
void gpulock_free(char* string);

/* ---- Pools: the GPUs of this machine and the leases on them ---------------------------- */

/* Opens the machine's pool: devices from NVML (or GPULOCK_FAKE_GPUS), the lock directory from
 * `lock_dir` (NULL: GPULOCK_DIR or the default; "" is refused), and the administrator's config. */
gpulock_status gpulock_pool_open(const char* lock_dir, gpulock_pool** pool);
void gpulock_pool_free(gpulock_pool* pool);

/* `gpulock status --json`, `gpulock gpus --json` and `gpulock queue --json` as strings
 * (docs/json.md, schema version 1). Free the result with gpulock_free(). */
gpulock_status gpulock_pool_status_json(gpulock_pool* pool, char** json);
gpulock_status gpulock_pool_gpus_json(gpulock_pool* pool, char** json);
gpulock_status gpulock_pool_queue_json(gpulock_pool* pool, char** json);

/* Ends a detached lease (one taken by `gpulock acquire`), as `gpulock release` does. */
gpulock_status gpulock_pool_release(gpulock_pool* pool, const char* lease_id);

/* ---- Requests: what to lease and how long to wait --------------------------------------- */

/* A request for 1 GPU of any kind, waiting as long as it takes. NULL if out of memory. */
gpulock_request* gpulock_request_new(void);
void gpulock_request_free(gpulock_request* request);

/* How many GPUs (any suitable ones); at least 1. */
gpulock_status gpulock_request_set_count(gpulock_request* request, unsigned count);
/* Exactly these GPUs: a comma-separated list of indices ("0,2", "0:1" for a MIG instance) or
 * UUIDs (unique prefixes allowed), as the CLI's --gpus. NULL or "" clears it. */
gpulock_status gpulock_request_set_gpus(gpulock_request* request, const char* gpus);
/* Health filters. A reading the device cannot provide fails the filter. */
gpulock_status gpulock_request_set_min_free_memory(gpulock_request* request, uint64_t bytes);
/* A shared lease: this many bytes of each GPU's memory instead of whole GPUs (either backend;
 * rounded up to 256 MiB units). Cooperative: nothing stops a job from using more. */
gpulock_status gpulock_request_set_memory(gpulock_request* request, uint64_t bytes);
/* A shared lease on a GPU with at most `slots` shared leases; without a memory size, 1/slots
 * of its memory. */
gpulock_status gpulock_request_set_slots(gpulock_request* request, unsigned slots);
/* Shared leases: prefer the emptiest GPUs (default 0: fill partly used ones first). */
gpulock_status gpulock_request_set_spread(gpulock_request* request, int spread);
gpulock_status gpulock_request_set_max_utilization(gpulock_request* request, unsigned percent);
gpulock_status gpulock_request_set_max_power(gpulock_request* request, double watts);
gpulock_status gpulock_request_set_allow_foreign(gpulock_request* request, int allow);
/* wait = 0: fail at once (GPULOCK_TIMED_OUT) unless the GPUs are free now. */
gpulock_status gpulock_request_set_wait(gpulock_request* request, int wait);
/* Wait at most this long; a negative value waits forever (the default). */
gpulock_status gpulock_request_set_timeout_ms(gpulock_request* request, int64_t timeout_ms);
/* 0: normal (the default); 1: low, served after every normal request. */
gpulock_status gpulock_request_set_low_priority(gpulock_request* request, int low);
/* Shown by `gpulock status` and `gpulock queue`. */
gpulock_status gpulock_request_set_label(gpulock_request* request, const char* label);
/* Redis backend: the hosts whose GPUs may serve the request, comma-separated, or "any"; NULL
 * or "" means this host only (the default). */
gpulock_status gpulock_request_set_hosts(gpulock_request* request, const char* hosts);
gpulock_status gpulock_request_set_command(gpulock_request* request, const char* command);
/* Limit the candidates to a CUDA_VISIBLE_DEVICES value (NULL: no limit, the default; the C API
 * does not read the environment on its own). */
gpulock_status gpulock_request_set_visible_devices(gpulock_request* request, const char* value);
/* The lease this program already runs under, if any (GPULOCK_LEASE_ID in the environment of a
 * command started by `gpulock run`; NULL or "" for none, the default; the C API does not read
 * the environment on its own). Its GPUs cannot free up while the request waits, so a request
 * that only they could serve fails at once with GPULOCK_UNSATISFIABLE instead of waiting. */
gpulock_status gpulock_request_set_enclosing_lease(gpulock_request* request, const char* lease_id);
/* Called about every `poll_ms` (at least 1) while waiting; returning non-zero stops the wait
 * with GPULOCK_INTERRUPTED. Called on the waiting thread. NULL removes it. */
gpulock_status gpulock_request_set_interrupt(gpulock_request* request,
                                             int (*interrupted)(void* user_data), void* user_data,
                                             unsigned poll_ms);

/* ---- Leases ----------------------------------------------------------------------------- */

/* Leases GPUs as `request` asks, waiting as it allows. */
gpulock_status gpulock_acquire(gpulock_pool* pool, const gpulock_request* request,
                               gpulock_lease** lease);

/* The accessors below describe the lease as it was acquired, also after
 * gpulock_lease_release(); their strings stay valid until the handle is freed. */
/* The lease's id (16 hex digits), as `gpulock status` shows it. */
const char* gpulock_lease_id(const gpulock_lease* lease);
size_t gpulock_lease_gpu_count(const gpulock_lease* lease);
/* The i-th GPU's NVML index, display index ("0", "0:1") and UUID; NULL / 0 if out of range. */
unsigned gpulock_lease_gpu_index(const gpulock_lease* lease, size_t i);
const char* gpulock_lease_gpu_display_index(const gpulock_lease* lease, size_t i);
const char* gpulock_lease_gpu_uuid(const gpulock_lease* lease, size_t i);
/* The value for CUDA_VISIBLE_DEVICES (indices, or UUIDs for MIG instances); use it with
 * CUDA_DEVICE_ORDER=PCI_BUS_ID. */
const char* gpulock_lease_cuda_visible_devices(const gpulock_lease* lease);
/* Redis backend (GPULOCK_BACKEND=redis://...): the lease's fencing token, strictly increasing
 * per pool (0 with the local backend), and the host whose GPUs these are ("" locally). */
uint64_t gpulock_lease_fencing_token(const gpulock_lease* lease);
/* A shared lease: the bytes it reserves on each GPU; 0 for whole GPUs. */
uint64_t gpulock_lease_memory_bytes(const gpulock_lease* lease);
const char* gpulock_lease_host(const gpulock_lease* lease);
/* Redis backend: 1 once the lease expired before it could be renewed, or was released by
 * someone else (its GPUs may then be given to others); always 0 with the local backend. */
int gpulock_lease_lost(const gpulock_lease* lease);
/* Confirms with the backend, in one round trip, that the lease still holds every one of its GPUs,
 * and stores its fencing token in *token (0 with the local backend, which asks nothing: the
 * kernel holds the lease). GPULOCK_NOT_FOUND when the lease is lost (gpulock_lease_lost() is 1
 * from then on), GPULOCK_ENVIRONMENT when Redis cannot be asked, GPULOCK_INVALID_ARGUMENT after
 * gpulock_lease_release(). For a job about to make a write that a lost lease must not make. */
gpulock_status gpulock_lease_verify(gpulock_lease* lease, uint64_t* token);
/* 1 while the lease is held by this process, 0 after gpulock_lease_release(). */
int gpulock_lease_active(const gpulock_lease* lease);
/* Releases the GPUs now; the handle stays valid until freed. */
void gpulock_lease_release(gpulock_lease* lease);
/* Releases the GPUs (if still held) and frees the handle. NULL is accepted. */
void gpulock_lease_free(gpulock_lease* lease);

#ifdef __cplusplus
}
#endif

#endif /* GPULOCK_GPULOCK_H */
