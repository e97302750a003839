/* A C API holder for the pause tests (tests/integration/test_redis_failures.py): opens the pool
 * the environment selects, takes 1 GPU, prints "held UUID", then answers each line on stdin at
 * once: "lost" or "held" from gpulock_lease_lost() for "check", and "verify STATUS" from
 * gpulock_lease_verify() for "verify". Ends at the end of its input. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <gpulock/gpulock.h>

int main(void) {
  gpulock_pool* pool = NULL;
  gpulock_lease* lease = NULL;
  gpulock_request* request = gpulock_request_new();
  if (request == NULL || gpulock_request_set_count(request, 1) != GPULOCK_OK ||
      gpulock_pool_open(NULL, &pool) != GPULOCK_OK ||
      gpulock_acquire(pool, request, &lease) != GPULOCK_OK) {
    fprintf(stderr, "paused_holder: cannot take a GPU: %s\n", gpulock_last_error());
    return 1;
  }
  printf("held %s\n", gpulock_lease_gpu_uuid(lease, 0));
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin) != NULL) {
    if (strncmp(line, "verify", 6) == 0) {
      uint64_t token = 0;
      printf("verify %d\n", (int)gpulock_lease_verify(lease, &token));
    } else {
      printf("%s\n", gpulock_lease_lost(lease) ? "lost" : "held");
    }
    fflush(stdout);
  }
  gpulock_lease_free(lease);
  gpulock_request_free(request);
  gpulock_pool_free(pool);
  return 0;
}
