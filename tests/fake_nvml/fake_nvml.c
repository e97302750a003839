/* fake_nvml.c: a stand-in for libnvidia-ml.so.1 with canned GPUs, so the real NVML code path of
 * gpulock (src/devices/nvml_*.cc) runs in CI without a GPU.
 *
 * Built twice from this file (tests/fake_nvml/CMakeLists.txt):
 *   libfake_nvml_full.so  exports current entry points (nvmlInit_v2, _v2/_v3 variants, MIG,
 *                         topology, NVLink) next to the old unversioned ones, as real drivers do.
 *   libfake_nvml_old.so   -DFAKE_NVML_OLD_DRIVER: only unversioned entry points, with the old
 *                         struct layouts (16-byte process entries, 52-byte PCI info); no MIG, no
 *                         topology, no NVLink, no enforced power limit, no NVML version.
 * and once more with -DFAKE_NVML_NO_UUID (no nvmlDeviceGetUUID) to test a required symbol.
 * Everything is compiled with -fvisibility=hidden; only FAKE_EXPORT functions are visible, so the
 * loader's symbol lookup and fallbacks are really exercised.
 *
 * The struct layouts are declared here independently of src/devices/nvml_api.h, from NVIDIA's
 * public NVML API reference; versioned structs are checked and a wrong version is answered with
 * NVML_ERROR_ARGUMENT_VERSION_MISMATCH (and counted, see fake_nvml_call_count).
 *
 * Environment:
 *   FAKE_NVML_INIT_FAIL=N   nvmlInit returns N.
 *   FAKE_NVML_CONFIG=PATH   the machine to pretend to be (read at the first nvmlInit, forgotten
 *                           at the last nvmlShutdown); unset: two idle GPUs.
 *
 * Config file: one item per line, "kind key=value ...", values with spaces in double quotes,
 * '#' starts a comment. Unknown kinds or keys make nvmlInit fail (NVML_ERROR_UNKNOWN) with a
 * message on stderr, so a typo in a test cannot pass silently.
 *   system driver=550.54.15 nvml=12.550.54
 *   gpu uuid=GPU-... name="NVIDIA H100 80GB HBM3" bus=00000000:3B:00.0 total_mib=81920
 *       used_mib=1024 util=37 power_mw=71000 limit_mw=700000 mode=0 mig=0 switch=1 numa=0
 *   proc gpu=0 pid=1234 used_mib=500|na [gi=1 ci=0]
 *   mig gpu=1 uuid=MIG-... [name=...] total_mib=10240 [used_mib=..] gi=1 [ci=0] [slot=N]
 *   topo a=0 b=2 level=20               (otherwise: same switch 10, same numa 40, else 50)
 *   nvlink a=1 b=3 [oneway=1]           (an active link; oneway: only a reports it)
 *   fail func=nvmlDeviceGetPowerUsage code=3 [gpu=N] [target=gpu|mig]
 *                                       (func matches with or without a _vN suffix)
 *   quirk v3_stride=16|24|32            (entry size _v3 writes; NVIDIA documents 24)
 *   quirk stale_count=1                 (the count query reports one process too few)
 *   quirk thread=1                      (nvmlInit starts a helper thread that lives on, as the
 *                                       real driver's does; it sleeps and takes the signals its
 *                                       mask lets through, by their default action)
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

/* ---- NVML ABI, from the public reference --------------------------------------------------- */

typedef int nvmlReturn_t;
enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_UNKNOWN = 999
};

typedef struct fake_handle* nvmlDevice_t;

typedef struct {
  unsigned long long total, free, used;
} fake_memory_v1;

typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} fake_memory_v2;
#define FAKE_MEMORY_V2_VERSION ((unsigned int)sizeof(fake_memory_v2) | (2U << 24))

typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} fake_pci;

typedef struct {
  char busId[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  unsigned int reserved[4];
} fake_pci_legacy;

typedef struct {
  unsigned int gpu, memory;
} fake_utilization;

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
  unsigned long long usedGpuCcProtectedMemory;
} fake_process_v3; /* v1 is its first 16 bytes, v2 its first 24 */

_Static_assert(sizeof(fake_memory_v1) == 24, "nvmlMemory_t");
_Static_assert(sizeof(fake_memory_v2) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(fake_pci) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(fake_pci_legacy) == 52, "legacy nvmlPciInfo_t");
_Static_assert(sizeof(fake_process_v3) == 32, "nvmlProcessInfo_v3_t");
_Static_assert(offsetof(fake_process_v3, gpuInstanceId) == 16, "v2 prefix");

#define NO_INSTANCE 0xFFFFFFFFU
#define VALUE_NOT_AVAILABLE (~0ULL)
#define NVLINK_MAX_LINKS 18
#define MIB (1024ULL * 1024ULL)

/* ---- The pretend machine ------------------------------------------------------------------- */

#define MAX_GPUS 16
#define MAX_MIGS 64
#define MAX_PROCS 512
#define MAX_RULES 64
#define MAX_TOPO 64
#define MAX_NVLINKS 64
#define MAX_COUNTERS 96
#define TEXT 96

struct fake_handle {
  int is_mig;
  int index; /* into gpus[] or migs[] */
};

struct gpu {
  struct fake_handle handle;
  char uuid[TEXT], name[TEXT], bus[32];
  unsigned long long total_mib, used_mib;
  unsigned int util, power_mw, limit_mw;
  int mode, mig, pci_switch, numa;
};

struct mig {
  struct fake_handle handle;
  int gpu, slot;
  char uuid[TEXT], name[TEXT];
  unsigned long long total_mib, used_mib;
  unsigned int gi, ci;
};

struct proc {
  int gpu;
  unsigned int pid;
  unsigned long long used; /* bytes or VALUE_NOT_AVAILABLE */
  unsigned int gi, ci;
};

struct rule {
  char func[64];
  int code, gpu, target; /* gpu -1: any; target 0 any, 1 GPU handles, 2 MIG handles */
};

struct topo {
  int a, b, level;
};

struct nvlink {
  int a, b, oneway;
};

struct counter {
  char name[64];
  unsigned long calls;
};

static struct {
  int refcount;
  char driver[80], nvml[80];
  int ngpus, nmigs, nprocs, nrules, ntopo, nnvlinks;
  struct gpu gpus[MAX_GPUS];
  struct mig migs[MAX_MIGS];
  struct proc procs[MAX_PROCS];
  struct rule rules[MAX_RULES];
  struct topo topo[MAX_TOPO];
  struct nvlink nvlinks[MAX_NVLINKS];
  size_t v3_stride;
  int stale_count;
  int thread;
} S;

static struct counter counters[MAX_COUNTERS];
static int ncounters;

static void count_call(const char* name) {
  for (int i = 0; i < ncounters; ++i) {
    if (strcmp(counters[i].name, name) == 0) {
      counters[i].calls++;
      return;
    }
  }
  if (ncounters < MAX_COUNTERS) {
    snprintf(counters[ncounters].name, sizeof counters[ncounters].name, "%s", name);
    counters[ncounters++].calls = 1;
  }
}

/* How many times an entry point was called since the last first nvmlInit; also counts
 * "version_mismatch" (versioned structs rejected). A test hook, not part of NVML. */
FAKE_EXPORT unsigned long fake_nvml_call_count(const char* name) {
  for (int i = 0; i < ncounters; ++i)
    if (strcmp(counters[i].name, name) == 0) return counters[i].calls;
  return 0;
}

static void copy_text(char* dst, size_t size, const char* src) {
  snprintf(dst, size, "%s", src);
}

static void add_gpu_defaults(struct gpu* g, int index) {
  memset(g, 0, sizeof *g);
  g->handle.is_mig = 0;
  g->handle.index = index;
  snprintf(g->uuid, sizeof g->uuid, "GPU-fa4e0000-0000-4000-8000-%012d", index);
  copy_text(g->name, sizeof g->name, "Fake NVIDIA GPU");
  snprintf(g->bus, sizeof g->bus, "00000000:%02X:00.0", 0x01 + index);
  g->total_mib = 81920;
  g->power_mw = 60000;
  g->limit_mw = 700000;
  g->pci_switch = -1;
}

static void reset_machine(void) {
  memset(&S.gpus, 0, sizeof S.gpus);
  S.ngpus = S.nmigs = S.nprocs = S.nrules = S.ntopo = S.nnvlinks = 0;
  copy_text(S.driver, sizeof S.driver, "550.54.15");
  copy_text(S.nvml, sizeof S.nvml, "12.550.54");
  S.v3_stride = sizeof(fake_process_v3) - 8; /* the documented v2 layout */
  S.stale_count = 0;
}

/* ---- Config parsing ------------------------------------------------------------------------ */

static int config_error(const char* path, int line, const char* what, const char* detail) {
  fprintf(stderr, "fake_nvml: %s:%d: %s '%s'\n", path, line, what, detail);
  return -1;
}

/* Splits "key=value" / key="quoted value" pairs off *cursor. Returns 0 at end of line. */
static int next_pair(char** cursor, char** key, char** value) {
  char* p = *cursor;
  while (*p == ' ' || *p == '\t') ++p;
  if (*p == '\0' || *p == '#') return 0;
  *key = p;
  while (*p != '\0' && *p != '=' && *p != ' ' && *p != '\t') ++p;
  if (*p != '=') {
    *value = NULL; /* a bare word: reported by the caller */
    if (*p != '\0') *p++ = '\0';
    *cursor = p;
    return 1;
  }
  *p++ = '\0';
  if (*p == '"') {
    *value = ++p;
    while (*p != '\0' && *p != '"') ++p;
  } else {
    *value = p;
    while (*p != '\0' && *p != ' ' && *p != '\t') ++p;
  }
  if (*p != '\0') *p++ = '\0';
  *cursor = p;
  return 1;
}

static unsigned long long number(const char* text, int* ok) {
  char* end = NULL;
  unsigned long long value = strtoull(text, &end, 0);
  if (end == text || *end != '\0') *ok = 0;
  return value;
}

static int parse_line(char* line, const char* path, int lineno) {
  char* cursor = line;
  while (*cursor == ' ' || *cursor == '\t') ++cursor;
  if (*cursor == '\0' || *cursor == '#') return 0;
  char* kind = cursor;
  while (*cursor != '\0' && *cursor != ' ' && *cursor != '\t') ++cursor;
  if (*cursor != '\0') *cursor++ = '\0';

  struct gpu* g = NULL;
  struct mig* m = NULL;
  struct proc* p = NULL;
  struct rule* r = NULL;
  struct topo* t = NULL;
  struct nvlink* l = NULL;
  int explicit_slot = 0;
  if (strcmp(kind, "gpu") == 0) {
    if (S.ngpus == MAX_GPUS) return config_error(path, lineno, "too many", kind);
    g = &S.gpus[S.ngpus];
    add_gpu_defaults(g, S.ngpus);
    S.ngpus++;
  } else if (strcmp(kind, "mig") == 0) {
    if (S.nmigs == MAX_MIGS) return config_error(path, lineno, "too many", kind);
    m = &S.migs[S.nmigs];
    memset(m, 0, sizeof *m);
    m->handle.is_mig = 1;
    m->handle.index = S.nmigs;
    snprintf(m->uuid, sizeof m->uuid, "MIG-fa4e0000-0000-4000-8000-%012d", S.nmigs);
    m->total_mib = 10240;
    m->gi = NO_INSTANCE;
    S.nmigs++;
  } else if (strcmp(kind, "proc") == 0) {
    if (S.nprocs == MAX_PROCS) return config_error(path, lineno, "too many", kind);
    p = &S.procs[S.nprocs++];
    memset(p, 0, sizeof *p);
    p->gi = p->ci = NO_INSTANCE;
  } else if (strcmp(kind, "fail") == 0) {
    if (S.nrules == MAX_RULES) return config_error(path, lineno, "too many", kind);
    r = &S.rules[S.nrules++];
    memset(r, 0, sizeof *r);
    r->gpu = -1;
  } else if (strcmp(kind, "topo") == 0) {
    if (S.ntopo == MAX_TOPO) return config_error(path, lineno, "too many", kind);
    t = &S.topo[S.ntopo++];
    memset(t, 0, sizeof *t);
  } else if (strcmp(kind, "nvlink") == 0) {
    if (S.nnvlinks == MAX_NVLINKS) return config_error(path, lineno, "too many", kind);
    l = &S.nvlinks[S.nnvlinks++];
    memset(l, 0, sizeof *l);
  } else if (strcmp(kind, "system") != 0 && strcmp(kind, "quirk") != 0) {
    return config_error(path, lineno, "unknown kind", kind);
  }

  char* key;
  char* value;
  while (next_pair(&cursor, &key, &value)) {
    if (value == NULL) return config_error(path, lineno, "expected key=value, got", key);
    int ok = 1;
    if (strcmp(kind, "system") == 0 && strcmp(key, "driver") == 0) {
      copy_text(S.driver, sizeof S.driver, value);
    } else if (strcmp(kind, "system") == 0 && strcmp(key, "nvml") == 0) {
      copy_text(S.nvml, sizeof S.nvml, value);
    } else if (strcmp(kind, "quirk") == 0 && strcmp(key, "v3_stride") == 0) {
      S.v3_stride = (size_t)number(value, &ok);
      if (S.v3_stride != 16 && S.v3_stride != 24 && S.v3_stride != 32) ok = 0;
    } else if (strcmp(kind, "quirk") == 0 && strcmp(key, "stale_count") == 0) {
      S.stale_count = (int)number(value, &ok);
    } else if (strcmp(kind, "quirk") == 0 && strcmp(key, "thread") == 0) {
      S.thread = (int)number(value, &ok);
    } else if (g && strcmp(key, "uuid") == 0) {
      copy_text(g->uuid, sizeof g->uuid, value);
    } else if (g && strcmp(key, "name") == 0) {
      copy_text(g->name, sizeof g->name, value);
    } else if (g && strcmp(key, "bus") == 0) {
      copy_text(g->bus, sizeof g->bus, value);
    } else if (g && strcmp(key, "total_mib") == 0) {
      g->total_mib = number(value, &ok);
    } else if (g && strcmp(key, "used_mib") == 0) {
      g->used_mib = number(value, &ok);
    } else if (g && strcmp(key, "util") == 0) {
      g->util = (unsigned)number(value, &ok);
    } else if (g && strcmp(key, "power_mw") == 0) {
      g->power_mw = (unsigned)number(value, &ok);
    } else if (g && strcmp(key, "limit_mw") == 0) {
      g->limit_mw = (unsigned)number(value, &ok);
    } else if (g && strcmp(key, "mode") == 0) {
      g->mode = (int)number(value, &ok);
    } else if (g && strcmp(key, "mig") == 0) {
      g->mig = (int)number(value, &ok);
    } else if (g && strcmp(key, "switch") == 0) {
      g->pci_switch = (int)number(value, &ok);
    } else if (g && strcmp(key, "numa") == 0) {
      g->numa = (int)number(value, &ok);
    } else if (m && strcmp(key, "gpu") == 0) {
      m->gpu = (int)number(value, &ok);
    } else if (m && strcmp(key, "uuid") == 0) {
      copy_text(m->uuid, sizeof m->uuid, value);
    } else if (m && strcmp(key, "name") == 0) {
      copy_text(m->name, sizeof m->name, value);
    } else if (m && strcmp(key, "total_mib") == 0) {
      m->total_mib = number(value, &ok);
    } else if (m && strcmp(key, "used_mib") == 0) {
      m->used_mib = number(value, &ok);
    } else if (m && strcmp(key, "gi") == 0) {
      m->gi = (unsigned)number(value, &ok);
    } else if (m && strcmp(key, "ci") == 0) {
      m->ci = (unsigned)number(value, &ok);
    } else if (m && strcmp(key, "slot") == 0) {
      m->slot = (int)number(value, &ok);
      explicit_slot = 1;
    } else if (p && strcmp(key, "gpu") == 0) {
      p->gpu = (int)number(value, &ok);
    } else if (p && strcmp(key, "pid") == 0) {
      p->pid = (unsigned)number(value, &ok);
    } else if (p && strcmp(key, "used_mib") == 0) {
      p->used = strcmp(value, "na") == 0 ? VALUE_NOT_AVAILABLE : number(value, &ok) * MIB;
    } else if (p && strcmp(key, "gi") == 0) {
      p->gi = (unsigned)number(value, &ok);
    } else if (p && strcmp(key, "ci") == 0) {
      p->ci = (unsigned)number(value, &ok);
    } else if (r && strcmp(key, "func") == 0) {
      copy_text(r->func, sizeof r->func, value);
    } else if (r && strcmp(key, "code") == 0) {
      r->code = (int)number(value, &ok);
    } else if (r && strcmp(key, "gpu") == 0) {
      r->gpu = (int)number(value, &ok);
    } else if (r && strcmp(key, "target") == 0) {
      if (strcmp(value, "gpu") == 0)
        r->target = 1;
      else if (strcmp(value, "mig") == 0)
        r->target = 2;
      else
        ok = 0;
    } else if (t && strcmp(key, "a") == 0) {
      t->a = (int)number(value, &ok);
    } else if (t && strcmp(key, "b") == 0) {
      t->b = (int)number(value, &ok);
    } else if (t && strcmp(key, "level") == 0) {
      t->level = (int)number(value, &ok);
    } else if (l && strcmp(key, "a") == 0) {
      l->a = (int)number(value, &ok);
    } else if (l && strcmp(key, "b") == 0) {
      l->b = (int)number(value, &ok);
    } else if (l && strcmp(key, "oneway") == 0) {
      l->oneway = (int)number(value, &ok);
    } else {
      return config_error(path, lineno, "unknown key", key);
    }
    if (!ok) return config_error(path, lineno, "bad value for", key);
  }

  if (m != NULL) {
    if (m->gpu < 0 || m->gpu >= S.ngpus)
      return config_error(path, lineno, "mig before its gpu, or bad gpu=", "gpu");
    if (!explicit_slot) { /* the next slot after this GPU's others */
      m->slot = 0;
      for (int i = 0; i < S.nmigs - 1; ++i)
        if (S.migs[i].gpu == m->gpu && S.migs[i].slot >= m->slot) m->slot = S.migs[i].slot + 1;
    }
    if (m->gi == NO_INSTANCE) m->gi = (unsigned)m->slot + 1;
    if (m->name[0] == '\0')
      snprintf(m->name, sizeof m->name, "%.60s MIG 1g.10gb", S.gpus[m->gpu].name);
  }
  if (r != NULL && (r->func[0] == '\0' || r->code == 0))
    return config_error(path, lineno, "fail needs func= and a non-zero code=", "fail");
  return 0;
}

static int load_config(void) {
  const char* path = getenv("FAKE_NVML_CONFIG");
  if (path == NULL || *path == '\0') {
    add_gpu_defaults(&S.gpus[0], 0);
    add_gpu_defaults(&S.gpus[1], 1);
    S.ngpus = 2;
    return 0;
  }
  FILE* file = fopen(path, "r");
  if (file == NULL) {
    fprintf(stderr, "fake_nvml: cannot read FAKE_NVML_CONFIG=%s\n", path);
    return -1;
  }
  char line[1024];
  int lineno = 0;
  int status = 0;
  while (status == 0 && fgets(line, sizeof line, file) != NULL) {
    ++lineno;
    line[strcspn(line, "\r\n")] = '\0';
    status = parse_line(line, path, lineno);
  }
  fclose(file);
  return status;
}

/* ---- Handles, failure injection ------------------------------------------------------------ */

static struct gpu* as_gpu(nvmlDevice_t device) {
  if (device == NULL || device->is_mig) return NULL;
  if (device->index < 0 || device->index >= S.ngpus) return NULL;
  return device == &S.gpus[device->index].handle ? &S.gpus[device->index] : NULL;
}

static struct mig* as_mig(nvmlDevice_t device) {
  if (device == NULL || !device->is_mig) return NULL;
  if (device->index < 0 || device->index >= S.nmigs) return NULL;
  return device == &S.migs[device->index].handle ? &S.migs[device->index] : NULL;
}

/* The GPU a handle belongs to (itself, or a MIG device's parent); NULL for a bad handle. */
static struct gpu* owner(nvmlDevice_t device) {
  struct mig* m = as_mig(device);
  return m != NULL ? &S.gpus[m->gpu] : as_gpu(device);
}

static int name_matches(const char* rule, const char* name) {
  if (strcmp(rule, name) == 0) return 1;
  size_t n = strlen(rule);
  if (strncmp(rule, name, n) != 0) return 0;
  const char* suffix = name + n; /* "_v2", "_v3" */
  return suffix[0] == '_' && suffix[1] == 'v' && suffix[2] >= '0' && suffix[2] <= '9';
}

static nvmlReturn_t injected(const char* name, nvmlDevice_t device) {
  for (int i = 0; i < S.nrules; ++i) {
    const struct rule* r = &S.rules[i];
    if (!name_matches(r->func, name)) continue;
    if (r->target == 1 && as_gpu(device) == NULL) continue;
    if (r->target == 2 && as_mig(device) == NULL) continue;
    if (r->gpu >= 0) {
      struct gpu* g = owner(device);
      if (g == NULL || g->handle.index != r->gpu) continue;
    }
    return r->code;
  }
  return NVML_SUCCESS;
}

#define ENTER(name, device)                               \
  do {                                                    \
    count_call(name);                                     \
    if (S.refcount == 0) return NVML_ERROR_UNINITIALIZED; \
    nvmlReturn_t forced_ = injected(name, device);        \
    if (forced_ != NVML_SUCCESS) return forced_;          \
  } while (0)

static nvmlReturn_t put_text(char* buffer, unsigned int length, const char* text) {
  if (buffer == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(buffer, text, strlen(text) + 1);
  return NVML_SUCCESS;
}

/* ---- Entry points -------------------------------------------------------------------------- */

/* The real driver's nvmlInit leaves threads of its own behind (seen with driver 580 on an H100):
 * they inherit the caller's signal mask, and a process-directed signal that the caller blocks to
 * read it from a signalfd can be taken, and dropped, by such a thread instead. */
static void* helper_thread(void* unused) {
  (void)unused;
  for (;;) pause();
  return NULL;
}

static void start_helper_thread(void) {
  static int started;
  pthread_t thread;
  if (started) return;
  if (pthread_create(&thread, NULL, helper_thread, NULL) == 0) {
    pthread_detach(thread);
    started = 1;
  }
}

static nvmlReturn_t init(const char* name) {
  const char* forced = getenv("FAKE_NVML_INIT_FAIL");
  if (forced != NULL && *forced != '\0') {
    count_call(name);
    return (nvmlReturn_t)atoi(forced);
  }
  if (S.refcount == 0) {
    ncounters = 0;
    reset_machine();
    if (load_config() != 0) {
      reset_machine();
      count_call(name);
      return NVML_ERROR_UNKNOWN;
    }
  }
  count_call(name);
  S.refcount++;
  if (S.thread) start_helper_thread();
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlInit(void) {
  return init("nvmlInit");
}

FAKE_EXPORT nvmlReturn_t nvmlShutdown(void) {
  count_call("nvmlShutdown");
  if (S.refcount == 0) return NVML_ERROR_UNINITIALIZED;
  if (--S.refcount == 0) reset_machine();
  return NVML_SUCCESS;
}

FAKE_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  count_call("nvmlErrorString");
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
      return "Argument version mismatch";
    default:
      return "Unknown Error";
  }
}

FAKE_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  ENTER("nvmlSystemGetDriverVersion", NULL);
  return put_text(version, length, S.driver);
}

static nvmlReturn_t device_count(const char* name, unsigned int* count) {
  ENTER(name, NULL);
  if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *count = (unsigned int)S.ngpus;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) {
  return device_count("nvmlDeviceGetCount", count);
}

static nvmlReturn_t handle_by_index(const char* name, unsigned int index, nvmlDevice_t* device) {
  ENTER(name, index < (unsigned)S.ngpus ? &S.gpus[index].handle : NULL);
  if (device == NULL || index >= (unsigned)S.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &S.gpus[index].handle;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return handle_by_index("nvmlDeviceGetHandleByIndex", index, device);
}

#ifndef FAKE_NVML_NO_UUID
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  ENTER("nvmlDeviceGetUUID", device);
  struct mig* m = as_mig(device);
  struct gpu* g = as_gpu(device);
  if (m == NULL && g == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  return put_text(uuid, length, m != NULL ? m->uuid : g->uuid);
}
#endif

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  ENTER("nvmlDeviceGetName", device);
  struct mig* m = as_mig(device);
  struct gpu* g = as_gpu(device);
  if (m == NULL && g == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  return put_text(name, length, m != NULL ? m->name : g->name);
}

/* Fills the numeric PCI fields from "DDDDDDDD:BB:DD.F" and the 4-digit-domain legacy string. */
static void pci_numbers(const char* bus_id, unsigned int* domain, unsigned int* bus,
                        unsigned int* device, char legacy[16]) {
  unsigned int d = 0, b = 0, v = 0, f = 0;
  sscanf(bus_id, "%x:%x:%x.%x", &d, &b, &v, &f);
  *domain = d;
  *bus = b;
  *device = v;
  snprintf(legacy, 16, "%04X:%02X:%02X.%X", d & 0xFFFFU, b, v, f);
}

/* The old layout: what the unversioned entry point (and _v2) write, 52 bytes and no more. */
static nvmlReturn_t pci_legacy(const char* name, nvmlDevice_t device, void* out) {
  ENTER(name, device);
  struct gpu* g = owner(device);
  if (g == NULL || out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  fake_pci_legacy pci;
  memset(&pci, 0, sizeof pci);
  pci_numbers(g->bus, &pci.domain, &pci.bus, &pci.device, pci.busId);
  pci.pciDeviceId = 0x233010DEU;
  memcpy(out, &pci, sizeof pci);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, void* pci) {
  return pci_legacy("nvmlDeviceGetPciInfo", device, pci);
}

static nvmlReturn_t memory_v1(const char* name, nvmlDevice_t device, fake_memory_v1* memory) {
  ENTER(name, device);
  struct mig* m = as_mig(device);
  struct gpu* g = as_gpu(device);
  if ((m == NULL && g == NULL) || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned long long total = (m != NULL ? m->total_mib : g->total_mib) * MIB;
  unsigned long long used = (m != NULL ? m->used_mib : g->used_mib) * MIB;
  memory->total = total;
  memory->used = used;
  memory->free = total - used;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, fake_memory_v1* memory) {
  return memory_v1("nvmlDeviceGetMemoryInfo", device, memory);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                       fake_utilization* utilization) {
  ENTER("nvmlDeviceGetUtilizationRates", device);
  if (as_mig(device) != NULL) return NVML_ERROR_NOT_SUPPORTED; /* as on real MIG devices */
  struct gpu* g = as_gpu(device);
  if (g == NULL || utilization == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  utilization->gpu = g->util;
  utilization->memory = g->util / 2;
  return NVML_SUCCESS;
}

static nvmlReturn_t gpu_unsigned(const char* name, nvmlDevice_t device, unsigned int* out,
                                 size_t field) {
  ENTER(name, device);
  if (as_mig(device) != NULL) return NVML_ERROR_NOT_SUPPORTED; /* board-wide values */
  struct gpu* g = as_gpu(device);
  if (g == NULL || out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  memcpy(out, (const char*)g + field, sizeof *out);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
  return gpu_unsigned("nvmlDeviceGetPowerUsage", device, power, offsetof(struct gpu, power_mw));
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device,
                                                           unsigned int* limit) {
  return gpu_unsigned("nvmlDeviceGetPowerManagementLimit", device, limit,
                      offsetof(struct gpu, limit_mw));
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int* mode) {
  ENTER("nvmlDeviceGetComputeMode", device);
  struct gpu* g = owner(device);
  if (g == NULL || mode == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *mode = g->mode;
  return NVML_SUCCESS;
}

/* Compute processes of a GPU (all of them, MIG or not) or of one MIG device, written as entries
 * of `stride` bytes: the first 16, 24 or 32 bytes of fake_process_v3. */
static nvmlReturn_t processes(const char* name, nvmlDevice_t device, unsigned int* count,
                              void* infos, size_t stride) {
  ENTER(name, device);
  struct mig* m = as_mig(device);
  struct gpu* g = owner(device);
  if (g == NULL || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned int n = 0;
  const struct proc* mine[MAX_PROCS];
  for (int i = 0; i < S.nprocs; ++i) {
    const struct proc* p = &S.procs[i];
    if (p->gpu != g->handle.index) continue;
    if (m != NULL && (p->gi != m->gi || p->ci != m->ci)) continue;
    mine[n++] = p;
  }
  unsigned int reported = n;
  if (*count == 0 && S.stale_count && n >= 2) reported = n - 1;
  if (*count < reported) {
    *count = reported;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  if (*count < n) {
    *count = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  *count = n;
  if (n == 0) return NVML_SUCCESS;
  if (infos == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned int i = 0; i < n; ++i) {
    fake_process_v3 entry;
    memset(&entry, 0, sizeof entry);
    entry.pid = mine[i]->pid;
    entry.usedGpuMemory = mine[i]->used;
    entry.gpuInstanceId = mine[i]->gi;
    entry.computeInstanceId = mine[i]->ci;
    memcpy((char*)infos + i * stride, &entry, stride);
  }
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                              unsigned int* count, void* infos) {
  return processes("nvmlDeviceGetComputeRunningProcesses", device, count, infos, 16);
}

/* ---- Entry points of current drivers only -------------------------------------------------- */
#ifndef FAKE_NVML_OLD_DRIVER

FAKE_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  return init("nvmlInit_v2");
}

FAKE_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  ENTER("nvmlSystemGetNVMLVersion", NULL);
  return put_text(version, length, S.nvml);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  return device_count("nvmlDeviceGetCount_v2", count);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  return handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device);
}

/* The current layout, with the 8-digit-domain busId. */
static void fill_pci(const struct gpu* g, fake_pci* pci) {
  memset(pci, 0, sizeof *pci);
  pci_numbers(g->bus, &pci->domain, &pci->bus, &pci->device, pci->busIdLegacy);
  pci->pciDeviceId = 0x233010DEU;
  copy_text(pci->busId, sizeof pci->busId, g->bus);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, void* pci) {
  return pci_legacy("nvmlDeviceGetPciInfo_v2", device, pci);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, fake_pci* pci) {
  ENTER("nvmlDeviceGetPciInfo_v3", device);
  struct gpu* g = owner(device);
  if (g == NULL || pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  fill_pci(g, pci);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, fake_memory_v2* memory) {
  ENTER("nvmlDeviceGetMemoryInfo_v2", device);
  if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != FAKE_MEMORY_V2_VERSION) {
    count_call("version_mismatch");
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  }
  fake_memory_v1 v1;
  nvmlReturn_t code = memory_v1("(memory)", device, &v1);
  if (code != NVML_SUCCESS) return code;
  memory->total = v1.total;
  memory->reserved = 0;
  memory->used = v1.used;
  memory->free = v1.free;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int* limit) {
  return gpu_unsigned("nvmlDeviceGetEnforcedPowerLimit", device, limit,
                      offsetof(struct gpu, limit_mw));
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                 unsigned int* count, void* infos) {
  return processes("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos, 24);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int* count, void* infos) {
  return processes("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos, S.v3_stride);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int* current,
                                              unsigned int* pending) {
  ENTER("nvmlDeviceGetMigMode", device);
  struct gpu* g = as_gpu(device);
  if (g == NULL || current == NULL || pending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *current = *pending = g->mig ? 1U : 0U;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int* count) {
  ENTER("nvmlDeviceGetMaxMigDeviceCount", device);
  struct gpu* g = as_gpu(device);
  if (g == NULL || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned int slots = g->mig ? 7U : 0U;
  for (int i = 0; g->mig && i < S.nmigs; ++i)
    if (S.migs[i].gpu == g->handle.index && (unsigned)S.migs[i].slot + 1 > slots)
      slots = (unsigned)S.migs[i].slot + 1;
  *count = slots;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device,
                                                             unsigned int index,
                                                             nvmlDevice_t* mig_device) {
  ENTER("nvmlDeviceGetMigDeviceHandleByIndex", device);
  struct gpu* g = as_gpu(device);
  if (g == NULL || mig_device == NULL || !g->mig) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < S.nmigs; ++i) {
    if (S.migs[i].gpu == g->handle.index && (unsigned)S.migs[i].slot == index) {
      *mig_device = &S.migs[i].handle;
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int* id) {
  ENTER("nvmlDeviceGetGpuInstanceId", device);
  struct mig* m = as_mig(device);
  if (m == NULL || id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *id = m->gi;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int* id) {
  ENTER("nvmlDeviceGetComputeInstanceId", device);
  struct mig* m = as_mig(device);
  if (m == NULL || id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *id = m->ci;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                             nvmlDevice_t device2, int* level) {
  ENTER("nvmlDeviceGetTopologyCommonAncestor", device1);
  struct gpu* a = as_gpu(device1);
  struct gpu* b = as_gpu(device2);
  if (a == NULL || b == NULL || level == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (a == b) {
    *level = 0;
    return NVML_SUCCESS;
  }
  for (int i = 0; i < S.ntopo; ++i) {
    const struct topo* t = &S.topo[i];
    if ((t->a == a->handle.index && t->b == b->handle.index) ||
        (t->a == b->handle.index && t->b == a->handle.index)) {
      *level = t->level;
      return NVML_SUCCESS;
    }
  }
  if (a->pci_switch >= 0 && a->pci_switch == b->pci_switch)
    *level = 10;
  else if (a->numa == b->numa)
    *level = 40;
  else
    *level = 50;
  return NVML_SUCCESS;
}

/* The GPU at the far end of `device`'s link number `link`, or NULL. A GPU's links are numbered
 * in the order its nvlink lines appear (a oneway link exists only at its `a` end). */
static struct gpu* nvlink_peer(struct gpu* g, unsigned int link, int* any) {
  unsigned int k = 0;
  *any = 0;
  for (int i = 0; i < S.nnvlinks; ++i) {
    const struct nvlink* l = &S.nvlinks[i];
    int peer = -1;
    if (l->a == g->handle.index) peer = l->b;
    if (l->b == g->handle.index && !l->oneway) peer = l->a;
    if (peer < 0 || peer >= S.ngpus) continue;
    *any = 1;
    if (k++ == link) return &S.gpus[peer];
  }
  return NULL;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                  int* is_active) {
  ENTER("nvmlDeviceGetNvLinkState", device);
  struct gpu* g = as_gpu(device);
  if (g == NULL || is_active == NULL || link >= NVLINK_MAX_LINKS)
    return NVML_ERROR_INVALID_ARGUMENT;
  int any = 0;
  struct gpu* peer = nvlink_peer(g, link, &any);
  if (!any) return NVML_ERROR_NOT_SUPPORTED;
  *is_active = peer != NULL ? 1 : 0;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                             fake_pci* pci) {
  ENTER("nvmlDeviceGetNvLinkRemotePciInfo_v2", device);
  struct gpu* g = as_gpu(device);
  if (g == NULL || pci == NULL || link >= NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
  int any = 0;
  struct gpu* peer = nvlink_peer(g, link, &any);
  if (!any) return NVML_ERROR_NOT_SUPPORTED;
  if (peer == NULL) return NVML_ERROR_NOT_FOUND;
  fill_pci(peer, pci);
  return NVML_SUCCESS;
}

#endif /* FAKE_NVML_OLD_DRIVER */
