/* Tests of the C API (include/gpulock/gpulock.h), from plain C and with real processes.
 *
 * The program makes its own world: a fresh temporary directory holding the lock directory and
 * an empty config file, with GPULOCK_FAKE_GPUS=4, GPULOCK_DIR and GPULOCK_CONFIG pointing
 * there; it removes the directory at the end. Every wait has a timeout or an interrupt, and
 * alarm() guards the whole run, so a bug fails the test instead of hanging it. Everything the
 * API hands out is freed, for AddressSanitizer's leak check.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpulock/gpulock.h"

/* ---- Checks ------------------------------------------------------------------------------ */

static char temp_dir[PATH_MAX]; /* "" until created */
static int in_child;            /* set in forked children: they never clean up */
static pid_t children[32];
static int child_count;

static void kill_children(void) {
  for (int i = 0; i < child_count; ++i) {
    if (children[i] <= 0) continue;
    kill(children[i], SIGKILL);
    waitpid(children[i], NULL, 0);
    children[i] = 0;
  }
}

static int remove_entry(const char* path, const struct stat* st, int type, struct FTW* ftw) {
  (void)st;
  (void)type;
  (void)ftw;
  if (remove(path) != 0)
    fprintf(stderr, "capi_test: cannot remove %s: %s\n", path, strerror(errno));
  return 0;
}

static void cleanup(void) {
  if (in_child) return;
  kill_children();
  if (temp_dir[0] != '\0') {
    nftw(temp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    temp_dir[0] = '\0';
  }
}

static void fail_at(const char* file, int line, const char* what) {
  fprintf(stderr, "%s:%d: CHECK failed: %s\n  gpulock_last_error(): \"%s\"\n", file, line, what,
          gpulock_last_error());
  fflush(stderr);
  cleanup();
  _exit(1);
}

#define CHECK(condition)                                       \
  do {                                                         \
    if (!(condition)) fail_at(__FILE__, __LINE__, #condition); \
  } while (0)

#define CHECK_STATUS(call, expected)                                                     \
  do {                                                                                   \
    const gpulock_status got_ = (call);                                                  \
    if (got_ != (expected)) {                                                            \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #call, \
              gpulock_status_name(got_), gpulock_status_name(expected));                 \
      fail_at(__FILE__, __LINE__, #call " == " #expected);                               \
    }                                                                                    \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, GPULOCK_OK)

static int contains(const char* haystack, const char* needle) {
  return haystack != NULL && needle != NULL && strstr(haystack, needle) != NULL;
}

static void sleep_ms(long ms) {
  struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
}

static double now_seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* The UUID of simulated GPU `index` (docs/simulated-gpus.md). */
static void sim_uuid(unsigned index, char* out, size_t size) {
  snprintf(out, size, "GPU-5e1f0a7e-0000-4000-8000-%012x", index);
}

/* ---- Helpers ----------------------------------------------------------------------------- */

static void path_in_temp(char* out, const char* name) {
  CHECK(snprintf(out, PATH_MAX, "%s/%s", temp_dir, name) < PATH_MAX);
}

static void write_file(const char* path, const char* text) {
  FILE* file = fopen(path, "w");
  CHECK(file != NULL);
  CHECK(fputs(text, file) >= 0);
  CHECK(fclose(file) == 0);
}

static gpulock_pool* open_pool(void) {
  gpulock_pool* pool = NULL;
  CHECK_OK(gpulock_pool_open(NULL, &pool));
  CHECK(pool != NULL);
  return pool;
}

/* A request for the GPUs named by `gpus` (NULL: any `count` GPUs). wait = 0: fail at once. */
static gpulock_request* make_request(const char* gpus, unsigned count, int wait,
                                     int64_t timeout_ms) {
  gpulock_request* request = gpulock_request_new();
  CHECK(request != NULL);
  CHECK_OK(gpulock_request_set_count(request, count));
  CHECK_OK(gpulock_request_set_gpus(request, gpus));
  CHECK_OK(gpulock_request_set_wait(request, wait));
  CHECK_OK(gpulock_request_set_timeout_ms(request, timeout_ms));
  return request;
}

static gpulock_status try_acquire(gpulock_pool* pool, const char* gpus, unsigned count, int wait,
                                  int64_t timeout_ms, gpulock_lease** lease) {
  gpulock_request* request = make_request(gpus, count, wait, timeout_ms);
  const gpulock_status status = gpulock_acquire(pool, request, lease);
  gpulock_request_free(request);
  return status;
}

static char* status_json(gpulock_pool* pool) {
  char* json = NULL;
  CHECK_OK(gpulock_pool_status_json(pool, &json));
  CHECK(json != NULL);
  return json;
}

static char* queue_json(gpulock_pool* pool) {
  char* json = NULL;
  CHECK_OK(gpulock_pool_queue_json(pool, &json));
  CHECK(json != NULL);
  return json;
}

static int status_json_contains(gpulock_pool* pool, const char* text) {
  char* json = status_json(pool);
  const int found = contains(json, text);
  gpulock_free(json);
  return found;
}

static void remember_child(pid_t pid) {
  CHECK(child_count < (int)(sizeof children / sizeof children[0]));
  children[child_count++] = pid;
}

/* Kills a child of ours and reaps it. */
static void kill_child(pid_t pid) {
  CHECK(kill(pid, SIGKILL) == 0);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  for (int i = 0; i < child_count; ++i)
    if (children[i] == pid) children[i] = 0;
}

/* Called first in every forked child: it dies with the test, and never cleans up. */
static void become_child(void) {
  in_child = 1;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  alarm(120);
}

/* Forks a process that opens its own pool and leases `gpus` (waiting as long as it takes),
 * writes the lease id to a pipe and holds the lease until killed. Returns its pid; *id_fd is
 * the pipe's reading end (see read_lease_id). */
static pid_t spawn_holder(const char* gpus, const char* label, int* id_fd) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    become_child();
    close(fds[0]);
    gpulock_pool* pool = NULL;
    gpulock_lease* lease = NULL;
    gpulock_request* request = gpulock_request_new();
    gpulock_status status = gpulock_pool_open(NULL, &pool);
    if (status == GPULOCK_OK) status = gpulock_request_set_gpus(request, gpus);
    if (status == GPULOCK_OK) status = gpulock_request_set_label(request, label);
    if (status == GPULOCK_OK) status = gpulock_acquire(pool, request, &lease);
    if (status != GPULOCK_OK) {
      fprintf(stderr, "capi_test holder: %s\n", gpulock_last_error());
      _exit(gpulock_exit_code(status));
    }
    if (write(fds[1], gpulock_lease_id(lease), 16) != 16) _exit(70);
    for (;;) pause();
  }
  close(fds[1]);
  remember_child(pid);
  *id_fd = fds[0];
  return pid;
}

/* Waits for a holder's lease id (16 hex digits); closes the pipe. */
static void read_lease_id(pid_t pid, int fd, char id[17]) {
  size_t got = 0;
  while (got < 16) {
    const ssize_t n = read(fd, id + got, 16 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int status = 0;
      waitpid(pid, &status, 0);
      fprintf(stderr, "holder %d ended without a lease (exit %d)\n", (int)pid,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      CHECK(!"the holder process got its lease");
    }
    got += (size_t)n;
  }
  id[16] = '\0';
  close(fd);
}

static pid_t spawn_holder_and_wait(const char* gpus, const char* label, char id[17]) {
  int fd = -1;
  const pid_t pid = spawn_holder(gpus, label, &fd);
  read_lease_id(pid, fd, id);
  return pid;
}

/* In a new process with a pool of its own: tries to lease `gpus` without waiting. Returns the
 * exit code of the status it got (0 = leased, 75 = not free now). */
static int try_acquire_in_child(const char* gpus) {
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    become_child();
    gpulock_pool* pool = NULL;
    gpulock_lease* lease = NULL;
    gpulock_status status = gpulock_pool_open(NULL, &pool);
    if (status == GPULOCK_OK) status = try_acquire(pool, gpus, 1, 0, -1, &lease);
    _exit(gpulock_exit_code(status));
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* ---- Names, codes, errors, arguments ----------------------------------------------------- */

static void test_version_names_codes(void) {
  const char* version = gpulock_version();
  CHECK(version != NULL && version[0] >= '0' && version[0] <= '9' && strchr(version, '.'));
  CHECK(GPULOCK_C_API_VERSION == 1);

  static const struct {
    gpulock_status status;
    const char* name;
    int exit_code;
  } expected[] = {
      {GPULOCK_OK, "ok", 0},
      {GPULOCK_INVALID_ARGUMENT, "invalid_argument", 64},
      {GPULOCK_UNSATISFIABLE, "unsatisfiable", 69},
      {GPULOCK_ENVIRONMENT, "environment", 69},
      {GPULOCK_PERMISSION_DENIED, "permission_denied", 69},
      {GPULOCK_NOT_FOUND, "not_found", 69},
      {GPULOCK_TIMED_OUT, "timed_out", 75},
      {GPULOCK_INTERRUPTED, "interrupted", 75},
      {GPULOCK_INTERNAL, "internal", 70},
      {GPULOCK_CONFIG, "config", 78},
      {GPULOCK_NO_MEMORY, "no_memory", 70},
  };
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; ++i) {
    CHECK(strcmp(gpulock_status_name(expected[i].status), expected[i].name) == 0);
    CHECK(gpulock_exit_code(expected[i].status) == expected[i].exit_code);
  }
  CHECK(GPULOCK_OK == 0);
}

struct thread_errors {
  char before[256]; /* the new thread's last error before it failed */
  char after[256];  /* ...and after */
};

static void* fail_on_another_thread(void* argument) {
  struct thread_errors* errors = argument;
  snprintf(errors->before, sizeof errors->before, "%s", gpulock_last_error());
  gpulock_request* request = gpulock_request_new();
  if (request != NULL &&
      gpulock_request_set_max_utilization(request, 101) == GPULOCK_INVALID_ARGUMENT)
    snprintf(errors->after, sizeof errors->after, "%s", gpulock_last_error());
  gpulock_request_free(request);
  return NULL;
}

static void test_last_error(void) {
  CHECK(strcmp(gpulock_last_error(), "") == 0); /* nothing failed yet on this thread */

  gpulock_request* request = gpulock_request_new();
  CHECK(request != NULL);
  CHECK_STATUS(gpulock_request_set_count(request, 0), GPULOCK_INVALID_ARGUMENT);
  char message[256];
  snprintf(message, sizeof message, "%s", gpulock_last_error());
  CHECK(strlen(message) > 0);
  /* Kept until the next failing call on this thread: successes leave it alone. */
  CHECK_OK(gpulock_request_set_count(request, 2));
  CHECK(strcmp(gpulock_last_error(), message) == 0);
  /* The next failure replaces it. */
  CHECK_STATUS(gpulock_request_set_gpus(request, "0,,1"), GPULOCK_INVALID_ARGUMENT);
  CHECK(strcmp(gpulock_last_error(), message) != 0 && contains(gpulock_last_error(), "0,,1"));
  snprintf(message, sizeof message, "%s", gpulock_last_error());
  gpulock_request_free(request);

  /* Per thread: a new thread starts with none, and its failure does not change ours. */
  struct thread_errors errors = {"unset", "unset"};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, fail_on_another_thread, &errors) == 0);
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(strcmp(errors.before, "") == 0);
  CHECK(strcmp(errors.after, "unset") != 0 && strlen(errors.after) > 0);
  CHECK(strcmp(gpulock_last_error(), message) == 0);
}

static void test_null_arguments(void) {
  /* Output parameters are set only on success: these sentinels must survive every failure. */
  gpulock_lease* const lease_sentinel = (gpulock_lease*)&temp_dir;
  char* const json_sentinel = temp_dir;

  CHECK_STATUS(gpulock_pool_open(NULL, NULL), GPULOCK_INVALID_ARGUMENT);
  CHECK(contains(gpulock_last_error(), "NULL"));

  char* json = json_sentinel;
  CHECK_STATUS(gpulock_pool_status_json(NULL, &json), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_pool_gpus_json(NULL, &json), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_pool_queue_json(NULL, &json), GPULOCK_INVALID_ARGUMENT);
  CHECK(json == json_sentinel);
  CHECK_STATUS(gpulock_pool_release(NULL, "0123456789abcdef"), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_enclosing_lease(NULL, "0123456789abcdef"),
               GPULOCK_INVALID_ARGUMENT);

  gpulock_pool* pool = open_pool();
  CHECK_STATUS(gpulock_pool_status_json(pool, NULL), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_pool_gpus_json(pool, NULL), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_pool_queue_json(pool, NULL), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_pool_release(pool, NULL), GPULOCK_INVALID_ARGUMENT);

  CHECK_STATUS(gpulock_request_set_count(NULL, 1), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_gpus(NULL, "0"), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_min_free_memory(NULL, 1), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_max_utilization(NULL, 50), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_max_power(NULL, 100.0), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_allow_foreign(NULL, 1), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_wait(NULL, 0), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_timeout_ms(NULL, 10), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_low_priority(NULL, 1), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_label(NULL, "x"), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_command(NULL, "x"), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_visible_devices(NULL, "0"), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_interrupt(NULL, NULL, NULL, 10), GPULOCK_INVALID_ARGUMENT);

  gpulock_request* request = gpulock_request_new();
  CHECK(request != NULL);
  gpulock_lease* lease = lease_sentinel;
  CHECK_STATUS(gpulock_acquire(NULL, request, &lease), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_acquire(pool, NULL, &lease), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_acquire(pool, request, NULL), GPULOCK_INVALID_ARGUMENT);
  CHECK(lease == lease_sentinel);
  CHECK(contains(gpulock_last_error(), "lease"));

  /* NULL strings where the header allows them: they clear the setting. */
  CHECK_OK(gpulock_request_set_gpus(request, NULL));
  CHECK_OK(gpulock_request_set_label(request, NULL));
  CHECK_OK(gpulock_request_set_command(request, NULL));
  CHECK_OK(gpulock_request_set_visible_devices(request, NULL));
  CHECK_OK(gpulock_request_set_interrupt(request, NULL, NULL, 0));
  gpulock_request_free(request);

  /* Accessors of a NULL lease, and the free functions, accept NULL. */
  CHECK(gpulock_lease_id(NULL) == NULL);
  CHECK(gpulock_lease_gpu_count(NULL) == 0);
  CHECK(gpulock_lease_gpu_index(NULL, 0) == 0);
  CHECK(gpulock_lease_gpu_display_index(NULL, 0) == NULL);
  CHECK(gpulock_lease_gpu_uuid(NULL, 0) == NULL);
  CHECK(gpulock_lease_cuda_visible_devices(NULL) == NULL);
  CHECK(gpulock_lease_active(NULL) == 0);
  uint64_t no_token = 0;
  CHECK_STATUS(gpulock_lease_verify(NULL, &no_token), GPULOCK_INVALID_ARGUMENT);
  gpulock_lease_release(NULL);
  gpulock_lease_free(NULL);
  gpulock_request_free(NULL);
  gpulock_pool_free(NULL);
  gpulock_free(NULL);

  gpulock_pool_free(pool);
}

static void test_request_validation(void) {
  gpulock_request* request = gpulock_request_new();
  CHECK(request != NULL);
  CHECK_STATUS(gpulock_request_set_count(request, 0), GPULOCK_INVALID_ARGUMENT);
  CHECK(gpulock_exit_code(GPULOCK_INVALID_ARGUMENT) == 64);
  CHECK_OK(gpulock_request_set_count(request, 1));

  static const char* const bad_lists[] = {"0,,1", ",", " ", "0,", ",0", "1, ,2"};
  for (size_t i = 0; i < sizeof bad_lists / sizeof bad_lists[0]; ++i) {
    CHECK_STATUS(gpulock_request_set_gpus(request, bad_lists[i]), GPULOCK_INVALID_ARGUMENT);
    CHECK(strlen(gpulock_last_error()) > 0);
  }
  CHECK_OK(gpulock_request_set_gpus(request, "0, 2"));
  CHECK_OK(gpulock_request_set_gpus(request, ""));
  CHECK_OK(gpulock_request_set_gpus(request, NULL));

  CHECK_STATUS(gpulock_request_set_max_utilization(request, 101), GPULOCK_INVALID_ARGUMENT);
  CHECK_OK(gpulock_request_set_max_utilization(request, 100));
  CHECK_STATUS(gpulock_request_set_max_power(request, -1.0), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_max_power(request, NAN), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_max_power(request, 2e6), GPULOCK_INVALID_ARGUMENT);
  CHECK_OK(gpulock_request_set_max_power(request, 300.0));
  CHECK_OK(gpulock_request_set_min_free_memory(request, 1024));
  CHECK_OK(gpulock_request_set_allow_foreign(request, 1));
  CHECK_OK(gpulock_request_set_low_priority(request, 1));
  CHECK_OK(gpulock_request_set_timeout_ms(request, -1));
  CHECK_OK(gpulock_request_set_label(request, "a label"));
  CHECK_OK(gpulock_request_set_command(request, "a command"));
  CHECK_OK(gpulock_request_set_visible_devices(request, "0,1"));
  gpulock_request_free(request);
}

static void test_pool_open_errors(void) {
  gpulock_pool* const sentinel = (gpulock_pool*)&temp_dir;
  gpulock_pool* pool = sentinel;
  char path[PATH_MAX];
  char good_config[PATH_MAX];
  path_in_temp(good_config, "config.toml");

  /* A config file named by GPULOCK_CONFIG must exist. */
  path_in_temp(path, "missing.toml");
  CHECK(setenv("GPULOCK_CONFIG", path, 1) == 0);
  CHECK_STATUS(gpulock_pool_open(NULL, &pool), GPULOCK_CONFIG);
  CHECK(gpulock_exit_code(GPULOCK_CONFIG) == 78);
  CHECK(contains(gpulock_last_error(), "missing.toml"));
  CHECK(pool == sentinel);

  /* ...and be valid. */
  path_in_temp(path, "bad.toml");
  write_file(path, "this is = = not TOML\n");
  CHECK(setenv("GPULOCK_CONFIG", path, 1) == 0);
  CHECK_STATUS(gpulock_pool_open(NULL, &pool), GPULOCK_CONFIG);
  CHECK(pool == sentinel);
  CHECK(setenv("GPULOCK_CONFIG", good_config, 1) == 0);

  /* Nonsense simulated GPUs. */
  CHECK(setenv("GPULOCK_FAKE_GPUS", "many", 1) == 0);
  CHECK_STATUS(gpulock_pool_open(NULL, &pool), GPULOCK_INVALID_ARGUMENT);
  CHECK(contains(gpulock_last_error(), "GPULOCK_FAKE_GPUS"));
  CHECK(setenv("GPULOCK_FAKE_GPUS", "4", 1) == 0);

  /* An empty lock directory is a mistake, not the default. */
  CHECK_STATUS(gpulock_pool_open("", &pool), GPULOCK_INVALID_ARGUMENT);
  CHECK(contains(gpulock_last_error(), "lock_dir"));
  CHECK(pool == sentinel);

  /* A lock directory that is a regular file. */
  CHECK_STATUS(gpulock_pool_open(good_config, &pool), GPULOCK_ENVIRONMENT);
  CHECK(pool == sentinel);

  /* An explicit lock directory wins over GPULOCK_DIR, and is a world of its own. */
  path_in_temp(path, "other-locks");
  pool = NULL;
  CHECK_OK(gpulock_pool_open(path, &pool));
  char* json = status_json(pool);
  CHECK(contains(json, "other-locks"));
  gpulock_free(json);
  gpulock_pool* main_pool = open_pool();
  gpulock_lease* here = NULL;
  gpulock_lease* there = NULL;
  CHECK_OK(try_acquire(main_pool, "0", 1, 0, -1, &here));
  CHECK_OK(try_acquire(pool, "0", 1, 0, -1, &there));
  gpulock_lease_free(here);
  gpulock_lease_free(there);
  gpulock_pool_free(main_pool);
  gpulock_pool_free(pool);
}

/* ---- Leases ------------------------------------------------------------------------------ */

static void test_acquire_two(gpulock_pool* pool) {
  gpulock_request* request = make_request(NULL, 2, 0, -1);
  CHECK_OK(gpulock_request_set_label(request, "capi-two"));
  CHECK_OK(gpulock_request_set_command(request, "capi_test --two"));
  gpulock_lease* lease = NULL;
  CHECK_OK(gpulock_acquire(pool, request, &lease));
  gpulock_request_free(request);
  CHECK(lease != NULL);

  const char* id = gpulock_lease_id(lease);
  CHECK(id != NULL && strlen(id) == 16 && strspn(id, "0123456789abcdef") == 16);
  CHECK(gpulock_lease_gpu_count(lease) == 2);
  CHECK(gpulock_lease_active(lease) == 1);

  unsigned index[2];
  for (size_t i = 0; i < 2; ++i) {
    index[i] = gpulock_lease_gpu_index(lease, i);
    CHECK(index[i] < 4);
    char text[32];
    snprintf(text, sizeof text, "%u", index[i]);
    CHECK(strcmp(gpulock_lease_gpu_display_index(lease, i), text) == 0);
    char uuid[64];
    sim_uuid(index[i], uuid, sizeof uuid);
    CHECK(strcmp(gpulock_lease_gpu_uuid(lease, i), uuid) == 0);
  }
  CHECK(index[0] != index[1]);
  char visible[64];
  snprintf(visible, sizeof visible, "%u,%u", index[0], index[1]);
  CHECK(strcmp(gpulock_lease_cuda_visible_devices(lease), visible) == 0);

  /* Out of range. */
  CHECK(gpulock_lease_gpu_index(lease, 2) == 0);
  CHECK(gpulock_lease_gpu_display_index(lease, 2) == NULL);
  CHECK(gpulock_lease_gpu_uuid(lease, 2) == NULL);
  CHECK(gpulock_lease_gpu_uuid(lease, SIZE_MAX) == NULL);
  CHECK(gpulock_lease_gpu_display_index(lease, SIZE_MAX) == NULL);

  /* The JSON documents, with the lease in them. */
  char* json = status_json(pool);
  CHECK(contains(json, "\"schema_version\""));
  CHECK(contains(json, id));
  CHECK(contains(json, "capi-two"));
  gpulock_free(json);
  json = NULL;
  CHECK_OK(gpulock_pool_gpus_json(pool, &json));
  char uuid3[64];
  sim_uuid(3, uuid3, sizeof uuid3);
  CHECK(contains(json, "\"schema_version\"") && contains(json, uuid3));
  gpulock_free(json);
  json = queue_json(pool);
  CHECK(contains(json, "\"schema_version\"") && contains(json, "\"waiting\""));
  gpulock_free(json);

  /* Nobody else can have these GPUs now, not even this process. */
  gpulock_lease* again = NULL;
  CHECK_STATUS(try_acquire(pool, visible, 1, 0, -1, &again), GPULOCK_TIMED_OUT);
  CHECK(again == NULL);

  /* The kernel holds a local lease: verify asks nothing, and its token is 0. */
  uint64_t token = 99;
  CHECK_OK(gpulock_lease_verify(lease, &token));
  CHECK(token == 0 && gpulock_lease_lost(lease) == 0);
  CHECK_STATUS(gpulock_lease_verify(lease, NULL), GPULOCK_INVALID_ARGUMENT);

  /* Release: the handle stays valid, and so do the strings it gave out. */
  const char* uuid0 = gpulock_lease_gpu_uuid(lease, 0);
  const char* shown = gpulock_lease_cuda_visible_devices(lease);
  gpulock_lease_release(lease);
  CHECK(gpulock_lease_active(lease) == 0);
  CHECK(strlen(id) == 16 && strncmp(uuid0, "GPU-", 4) == 0 && strcmp(shown, visible) == 0);
  gpulock_lease_release(lease); /* a second release does nothing */
  CHECK(gpulock_lease_active(lease) == 0);
  CHECK_STATUS(gpulock_lease_verify(lease, &token), GPULOCK_INVALID_ARGUMENT);
  CHECK(!status_json_contains(pool, id));

  CHECK_OK(try_acquire(pool, visible, 1, 0, -1, &again));
  CHECK(gpulock_lease_gpu_count(again) == 2);
  gpulock_lease_free(again);
  gpulock_lease_free(lease);
}

static void test_explicit_gpus(gpulock_pool* pool) {
  gpulock_lease* lease = NULL;
  char uuid[64];
  sim_uuid(3, uuid, sizeof uuid);
  CHECK_OK(try_acquire(pool, uuid, 1, 0, -1, &lease)); /* by UUID */
  CHECK(gpulock_lease_gpu_index(lease, 0) == 3);
  gpulock_lease_free(lease);
  lease = NULL;

  /* A prefix of every GPU's UUID is ambiguous; a GPU named twice is a mistake. */
  CHECK_STATUS(try_acquire(pool, "GPU-5e1f0a7e", 1, 0, -1, &lease), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(try_acquire(pool, "1,1", 1, 0, -1, &lease), GPULOCK_INVALID_ARGUMENT);
  CHECK(lease == NULL);

  /* Limited to CUDA_VISIBLE_DEVICES=2. */
  gpulock_request* request = make_request(NULL, 1, 0, -1);
  CHECK_OK(gpulock_request_set_visible_devices(request, "2"));
  CHECK_OK(gpulock_acquire(pool, request, &lease));
  CHECK(gpulock_lease_gpu_index(lease, 0) == 2);
  CHECK(strcmp(gpulock_lease_cuda_visible_devices(lease), "2") == 0);
  gpulock_lease_free(lease);
  lease = NULL;
  CHECK_OK(gpulock_request_set_count(request, 2));
  CHECK_STATUS(gpulock_acquire(pool, request, &lease), GPULOCK_UNSATISFIABLE);
  gpulock_request_free(request);

  /* Health filters: simulated GPUs have 80 GiB and draw 60 W. */
  request = make_request(NULL, 1, 0, -1);
  CHECK_OK(gpulock_request_set_min_free_memory(request, 100ull << 30));
  CHECK_STATUS(gpulock_acquire(pool, request, &lease), GPULOCK_UNSATISFIABLE);
  CHECK_OK(gpulock_request_set_min_free_memory(request, 1ull << 30));
  CHECK_OK(gpulock_request_set_max_power(request, 10.0));
  CHECK_STATUS(gpulock_acquire(pool, request, &lease), GPULOCK_TIMED_OUT);
  CHECK_OK(gpulock_request_set_max_power(request, 100.0));
  CHECK_OK(gpulock_acquire(pool, request, &lease));
  gpulock_request_free(request);
  gpulock_lease_free(lease);
}

static void test_unsatisfiable(gpulock_pool* pool) {
  gpulock_lease* lease = NULL;
  /* Waiting forever, yet failing at once: no wait could ever serve these. */
  CHECK_STATUS(try_acquire(pool, NULL, 99, 1, -1, &lease), GPULOCK_UNSATISFIABLE);
  CHECK(gpulock_exit_code(GPULOCK_UNSATISFIABLE) == 69);
  CHECK(strlen(gpulock_last_error()) > 0);
  CHECK_STATUS(try_acquire(pool, NULL, 5000, 1, -1, &lease), GPULOCK_UNSATISFIABLE);
  CHECK_STATUS(try_acquire(pool, "7", 1, 1, -1, &lease), GPULOCK_UNSATISFIABLE);
  CHECK(contains(gpulock_last_error(), "7"));
  CHECK_STATUS(try_acquire(pool, "0,7", 1, 1, -1, &lease), GPULOCK_UNSATISFIABLE);
  CHECK(lease == NULL);

  /* Under a lease that holds GPU 0 (as a command of `gpulock run` is), waiting for GPU 0 could
   * never end: it fails at once. Other GPUs are still granted. */
  gpulock_lease* outer = NULL;
  CHECK_OK(try_acquire(pool, "0", 1, 0, -1, &outer));
  gpulock_request* request = make_request("0", 1, 1, -1);
  CHECK_OK(gpulock_request_set_enclosing_lease(request, gpulock_lease_id(outer)));
  CHECK_STATUS(gpulock_acquire(pool, request, &lease), GPULOCK_UNSATISFIABLE);
  CHECK(contains(gpulock_last_error(), gpulock_lease_id(outer)));
  CHECK(lease == NULL);
  CHECK_OK(gpulock_request_set_gpus(request, "1"));
  CHECK_OK(gpulock_acquire(pool, request, &lease));
  gpulock_lease_free(lease);
  lease = NULL;
  CHECK_OK(gpulock_request_set_enclosing_lease(request, NULL));
  CHECK_OK(gpulock_request_set_gpus(request, "0"));
  CHECK_OK(gpulock_request_set_timeout_ms(request, 0));
  CHECK_STATUS(gpulock_acquire(pool, request, &lease), GPULOCK_TIMED_OUT);
  gpulock_request_free(request);
  gpulock_lease_free(outer);
}

/* Shared leases by memory: two of 40 GiB share simulated GPU 3 (80 GiB); a third does not fit,
 * nor does the whole GPU; releasing one frees its memory. */
static gpulock_status try_shared(gpulock_pool* pool, uint64_t gib, gpulock_lease** lease) {
  gpulock_request* request = make_request("3", 1, 0, -1);
  CHECK_OK(gpulock_request_set_memory(request, gib << 30));
  const gpulock_status status = gpulock_acquire(pool, request, lease);
  gpulock_request_free(request);
  return status;
}

static void test_shared_leases(gpulock_pool* pool) {
  gpulock_lease *a = NULL, *b = NULL, *c = NULL, *whole = NULL;
  gpulock_request* request = gpulock_request_new();
  CHECK(request != NULL);
  CHECK_STATUS(gpulock_request_set_memory(request, 0), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_request_set_slots(request, 0), GPULOCK_INVALID_ARGUMENT);
  CHECK_OK(gpulock_request_set_spread(request, 1));
  gpulock_request_free(request);
  CHECK_OK(try_shared(pool, 40, &a));
  CHECK(gpulock_lease_memory_bytes(a) == (uint64_t)40 << 30);
  CHECK_OK(try_shared(pool, 40, &b));
  CHECK_STATUS(try_shared(pool, 1, &c), GPULOCK_TIMED_OUT);
  CHECK_STATUS(try_acquire(pool, "3", 1, 0, -1, &whole), GPULOCK_TIMED_OUT);
  gpulock_lease_release(a);
  CHECK_OK(try_shared(pool, 40, &c));
  gpulock_lease_free(a);
  gpulock_lease_free(b);
  gpulock_lease_free(c);
  CHECK_OK(try_acquire(pool, "3", 1, 0, -1, &whole));
  CHECK(gpulock_lease_memory_bytes(whole) == 0);
  gpulock_lease_free(whole);
}

static void test_pool_release_errors(gpulock_pool* pool) {
  CHECK_STATUS(gpulock_pool_release(pool, "0123456789abcdef"), GPULOCK_NOT_FOUND);
  CHECK(gpulock_exit_code(GPULOCK_NOT_FOUND) == 69);
  CHECK(contains(gpulock_last_error(), "0123456789abcdef"));
  /* Not a lease id at all. */
  CHECK_STATUS(gpulock_pool_release(pool, "no-such-lease"), GPULOCK_INVALID_ARGUMENT);
  CHECK_STATUS(gpulock_pool_release(pool, ""), GPULOCK_INVALID_ARGUMENT);

  /* A lease held by a running process (not a detached one) is ended by ending the process. */
  gpulock_lease* lease = NULL;
  CHECK_OK(try_acquire(pool, "0", 1, 0, -1, &lease));
  CHECK_STATUS(gpulock_pool_release(pool, gpulock_lease_id(lease)), GPULOCK_UNSATISFIABLE);
  CHECK(gpulock_lease_active(lease) == 1);
  gpulock_lease_free(lease);
}

struct delayed_kill {
  pid_t pid;
  long delay_ms;
};

static void* kill_later(void* argument) {
  const struct delayed_kill* job = argument;
  sleep_ms(job->delay_ms);
  kill(job->pid, SIGKILL);
  return NULL;
}

static void test_exclusion_across_processes(gpulock_pool* pool) {
  char holder_id[17];
  const pid_t holder = spawn_holder_and_wait("1,2", "capi-holder", holder_id);
  CHECK(status_json_contains(pool, holder_id));

  gpulock_lease* lease = NULL;
  CHECK_STATUS(try_acquire(pool, "1", 1, 0, -1, &lease), GPULOCK_TIMED_OUT);
  CHECK(gpulock_exit_code(GPULOCK_TIMED_OUT) == 75);
  CHECK(strlen(gpulock_last_error()) > 0);
  CHECK_STATUS(try_acquire(pool, "2", 1, 0, -1, &lease), GPULOCK_TIMED_OUT);
  CHECK_STATUS(try_acquire(pool, "0,2", 1, 0, -1, &lease), GPULOCK_TIMED_OUT);
  CHECK(lease == NULL);

  /* All or nothing: the failed "0,2" kept nothing; GPUs 0 and 3 are free. */
  CHECK_OK(try_acquire(pool, "0", 1, 0, -1, &lease));
  gpulock_lease* last = NULL;
  CHECK_OK(try_acquire(pool, NULL, 1, 0, -1, &last));
  CHECK(gpulock_lease_gpu_index(last, 0) == 3);
  gpulock_lease* none = NULL;
  CHECK_STATUS(try_acquire(pool, NULL, 1, 0, -1, &none), GPULOCK_TIMED_OUT);
  gpulock_lease_free(last);
  gpulock_lease_free(lease);
  lease = NULL;

  /* The holder is SIGKILLed while we wait for its GPUs: the kernel ends its lease, and the
   * waiting acquire gets them. The timeout only guards against a bug. */
  struct delayed_kill job = {holder, 200};
  pthread_t killer;
  CHECK(pthread_create(&killer, NULL, kill_later, &job) == 0);
  CHECK_OK(try_acquire(pool, "1,2", 1, 1, 30000, &lease));
  CHECK(pthread_join(killer, NULL) == 0);
  int status = 0;
  CHECK(waitpid(holder, &status, 0) == holder);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  for (int i = 0; i < child_count; ++i)
    if (children[i] == holder) children[i] = 0;
  CHECK(gpulock_lease_gpu_count(lease) == 2);
  CHECK(strcmp(gpulock_lease_cuda_visible_devices(lease), "1,2") == 0);
  CHECK(!status_json_contains(pool, holder_id));
  gpulock_lease_free(lease);
}

struct interrupt_counter {
  int calls;
};

static int interrupt_on_third_call(void* user_data) {
  struct interrupt_counter* counter = user_data;
  return ++counter->calls >= 3;
}

static void test_timeout_and_interrupt(gpulock_pool* pool) {
  char holder_id[17];
  const pid_t holder = spawn_holder_and_wait("3", "capi-timeout", holder_id);
  gpulock_lease* const sentinel = (gpulock_lease*)&temp_dir;
  gpulock_lease* lease = sentinel;

  /* Returning at all is the point; no assertion on how long it took. */
  CHECK_STATUS(try_acquire(pool, "3", 1, 1, 200, &lease), GPULOCK_TIMED_OUT);
  CHECK(strlen(gpulock_last_error()) > 0);
  CHECK_STATUS(try_acquire(pool, NULL, 4, 1, 200, &lease), GPULOCK_TIMED_OUT);
  CHECK_STATUS(try_acquire(pool, "3", 1, 1, 0, &lease), GPULOCK_TIMED_OUT);
  CHECK(lease == sentinel);

  /* An interrupt callback stops a wait with no timeout. */
  struct interrupt_counter counter = {0};
  gpulock_request* request = make_request("3", 1, 1, -1);
  CHECK_OK(gpulock_request_set_interrupt(request, interrupt_on_third_call, &counter, 10));
  CHECK_STATUS(gpulock_acquire(pool, request, &lease), GPULOCK_INTERRUPTED);
  CHECK(gpulock_exit_code(GPULOCK_INTERRUPTED) == 75);
  CHECK(counter.calls >= 1);
  CHECK(counter.calls == 3); /* not called again once it asked to stop */
  CHECK(lease == sentinel);

  /* Removed, it is not called any more. */
  CHECK_OK(gpulock_request_set_interrupt(request, NULL, NULL, 0));
  CHECK_OK(gpulock_request_set_timeout_ms(request, 100));
  CHECK_STATUS(gpulock_acquire(pool, request, &lease), GPULOCK_TIMED_OUT);
  CHECK(counter.calls == 3);

  /* A callback does not get in the way of a request served at once. */
  CHECK_OK(gpulock_request_set_interrupt(request, interrupt_on_third_call, &counter, 1));
  CHECK_OK(gpulock_request_set_gpus(request, "0"));
  CHECK_OK(gpulock_acquire(pool, request, &lease));
  gpulock_lease_free(lease);
  gpulock_request_free(request);

  kill_child(holder);
}

static void test_queue_and_handoff(gpulock_pool* pool) {
  char first_id[17];
  const pid_t first = spawn_holder_and_wait("3", "capi-first", first_id);
  int waiter_fd = -1;
  const pid_t waiter = spawn_holder("3", "capi-waiter", &waiter_fd);

  /* The waiter shows in the queue, while the holder's lease shows in the status. */
  const double give_up = now_seconds() + 30;
  for (;;) {
    char* json = queue_json(pool);
    const int queued = contains(json, "capi-waiter");
    CHECK(contains(json, "\"schema_version\""));
    gpulock_free(json);
    if (queued) break;
    CHECK(now_seconds() < give_up);
    sleep_ms(20);
  }
  char* json = status_json(pool);
  CHECK(contains(json, first_id) && contains(json, "capi-first"));
  gpulock_free(json);

  /* The holder dies; the waiter is served. */
  kill_child(first);
  char second_id[17];
  read_lease_id(waiter, waiter_fd, second_id);
  CHECK(strcmp(first_id, second_id) != 0);
  json = status_json(pool);
  CHECK(contains(json, second_id) && !contains(json, first_id));
  gpulock_free(json);
  json = queue_json(pool);
  CHECK(!contains(json, "capi-waiter"));
  gpulock_free(json);
  kill_child(waiter);
}

static void test_free_without_release(gpulock_pool* pool) {
  gpulock_lease* lease = NULL;
  CHECK_OK(try_acquire(pool, "2", 1, 0, -1, &lease));
  CHECK(try_acquire_in_child("2") == 75);
  gpulock_lease_free(lease); /* no gpulock_lease_release() */
  CHECK(try_acquire_in_child("2") == 0);
}

static void test_fork_and_exec(gpulock_pool* pool) {
  /* A child made by fork() shares the lease: it outlives the parent's handle. */
  gpulock_lease* lease = NULL;
  CHECK_OK(try_acquire(pool, "0", 1, 0, -1, &lease));
  const pid_t sharer = fork();
  CHECK(sharer >= 0);
  if (sharer == 0) {
    become_child();
    for (;;) pause();
  }
  remember_child(sharer);
  gpulock_lease_free(lease);
  CHECK(try_acquire_in_child("0") == 75);
  kill_child(sharer);
  CHECK(try_acquire_in_child("0") == 0);

  /* The descriptors are close-on-exec: a program exec'd by a child does not hold the lease. */
  CHECK_OK(try_acquire(pool, "0", 1, 0, -1, &lease));
  int exec_pipe[2];
  CHECK(pipe2(exec_pipe, O_CLOEXEC) == 0);
  const pid_t execd = fork();
  CHECK(execd >= 0);
  if (execd == 0) {
    become_child();
    close(exec_pipe[0]);
    execlp("sleep", "sleep", "60", (char*)NULL);
    _exit(127);
  }
  remember_child(execd);
  close(exec_pipe[1]);
  char byte;
  ssize_t got;
  while ((got = read(exec_pipe[0], &byte, 1)) < 0 && errno == EINTR) {
  }
  CHECK(got == 0); /* end of file: the child has exec'd (or died) */
  close(exec_pipe[0]);
  CHECK(waitpid(execd, NULL, WNOHANG) == 0); /* still running: it exec'd */
  gpulock_lease_free(lease);
  CHECK(try_acquire_in_child("0") == 0);
  kill_child(execd);
}

/* ---- Threads ----------------------------------------------------------------------------- */

struct thread_lease {
  gpulock_pool* pool;
  pthread_barrier_t* all_hold;
  gpulock_status status;
  unsigned index;
};

static void* lease_on_thread(void* argument) {
  struct thread_lease* job = argument;
  gpulock_lease* lease = NULL;
  gpulock_request* request = gpulock_request_new();
  job->status = request == NULL ? GPULOCK_NO_MEMORY : gpulock_acquire(job->pool, request, &lease);
  if (job->status == GPULOCK_OK) job->index = gpulock_lease_gpu_index(lease, 0);
  pthread_barrier_wait(job->all_hold); /* everyone holds a lease at this point */
  gpulock_lease_free(lease);
  gpulock_request_free(request);
  return NULL;
}

static void test_threads_share_a_pool(gpulock_pool* pool) {
  enum { kThreads = 4 };
  pthread_barrier_t all_hold;
  CHECK(pthread_barrier_init(&all_hold, NULL, kThreads) == 0);
  struct thread_lease jobs[kThreads];
  pthread_t threads[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    jobs[i] = (struct thread_lease){pool, &all_hold, GPULOCK_INTERNAL, 99};
    CHECK(pthread_create(&threads[i], NULL, lease_on_thread, &jobs[i]) == 0);
  }
  for (int i = 0; i < kThreads; ++i) CHECK(pthread_join(threads[i], NULL) == 0);
  pthread_barrier_destroy(&all_hold);
  unsigned seen = 0;
  for (int i = 0; i < kThreads; ++i) {
    CHECK_OK(jobs[i].status);
    CHECK(jobs[i].index < 4 && !(seen & (1u << jobs[i].index)));
    seen |= 1u << jobs[i].index;
  }
  CHECK(seen == 0xf);
}

/* ---- Main -------------------------------------------------------------------------------- */

static void set_up_environment(void) {
  const char* tmp = getenv("TMPDIR");
  CHECK(snprintf(temp_dir, sizeof temp_dir, "%s/gpulock-capi-XXXXXX",
                 tmp != NULL && *tmp != '\0' ? tmp : "/tmp") < (int)sizeof temp_dir);
  if (mkdtemp(temp_dir) == NULL) {
    fprintf(stderr, "capi_test: mkdtemp(%s): %s\n", temp_dir, strerror(errno));
    temp_dir[0] = '\0';
    exit(1);
  }
  char path[PATH_MAX];
  path_in_temp(path, "locks");
  CHECK(setenv("GPULOCK_DIR", path, 1) == 0);
  /* An empty config of our own, so /etc/gpulock/config.toml cannot change the outcome (a
   * GPULOCK_CONFIG naming a missing file would be an error). */
  path_in_temp(path, "config.toml");
  write_file(path, "");
  CHECK(setenv("GPULOCK_CONFIG", path, 1) == 0);
  CHECK(setenv("GPULOCK_FAKE_GPUS", "4", 1) == 0);
}

int main(void) {
  alarm(150); /* hang guard: a bug must fail the test, not hang it */
  setvbuf(stdout, NULL, _IONBF, 0);
  set_up_environment();

  test_version_names_codes();
  test_last_error();
  test_null_arguments();
  test_request_validation();
  test_pool_open_errors();

  gpulock_pool* pool = open_pool();
  test_acquire_two(pool);
  test_explicit_gpus(pool);
  test_unsatisfiable(pool);
  test_pool_release_errors(pool);
  test_shared_leases(pool);
  test_exclusion_across_processes(pool);
  test_timeout_and_interrupt(pool);
  test_queue_and_handoff(pool);
  test_free_without_release(pool);
  test_fork_and_exec(pool);
  test_threads_share_a_pool(pool);
  gpulock_pool_free(pool);

  cleanup();
  printf("capi_test: all checks passed\n");
  return 0;
}
