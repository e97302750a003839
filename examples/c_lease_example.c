/* Example: lease GPUs from C and run a command on them.
 *
 *   GPULOCK_FAKE_GPUS=4 build/examples/c_lease_example 2 -- sh -c 'echo $CUDA_VISIBLE_DEVICES'
 *   build/examples/c_lease_example 1              (no command: holds one GPU for 5 seconds)
 *
 * Waits up to 10 minutes for N GPUs (Ctrl-C stops the wait), then runs the command with
 * CUDA_VISIBLE_DEVICES set and holds the GPUs until it ends. The lease belongs to this process:
 * its descriptors are close-on-exec, so the command runs as a child and this process waits.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpulock/gpulock.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int signal_number) {
  (void)signal_number;
  interrupted = 1;
}

static int stop_waiting(void* user_data) {
  (void)user_data;
  return interrupted;
}

int main(int argc, char** argv) {
  char* end = NULL;
  const unsigned long count = argc > 1 ? strtoul(argv[1], &end, 10) : 0;
  if (argc < 2 || *end != '\0' || count == 0 || count > 64) {
    fprintf(stderr, "usage: %s N [--] [command [argument...]]\n", argv[0]);
    return 64;
  }
  char** command = argv + 2;
  if (*command != NULL && strcmp(*command, "--") == 0) ++command;

  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_sigint;
  sigaction(SIGINT, &action, NULL);

  gpulock_pool* pool = NULL;
  gpulock_request* request = gpulock_request_new();
  gpulock_lease* lease = NULL;
  gpulock_status status = request == NULL ? GPULOCK_NO_MEMORY : GPULOCK_OK;
  if (status == GPULOCK_OK) status = gpulock_pool_open(NULL, &pool);
  if (status == GPULOCK_OK) status = gpulock_request_set_count(request, (unsigned)count);
  if (status == GPULOCK_OK) status = gpulock_request_set_timeout_ms(request, 10 * 60 * 1000);
  if (status == GPULOCK_OK) status = gpulock_request_set_label(request, "c_lease_example");
  if (status == GPULOCK_OK) status = gpulock_request_set_command(request, command[0]);
  if (status == GPULOCK_OK)
    status = gpulock_request_set_interrupt(request, stop_waiting, NULL, 100);
  if (status == GPULOCK_OK) status = gpulock_acquire(pool, request, &lease);
  gpulock_request_free(request);
  if (status != GPULOCK_OK) {
    fprintf(stderr, "c_lease_example: %s (%s)\n", gpulock_last_error(),
            gpulock_status_name(status));
    gpulock_pool_free(pool);
    return gpulock_exit_code(status);
  }

  /* Before anything in this process or its children initialises CUDA. */
  setenv("CUDA_VISIBLE_DEVICES", gpulock_lease_cuda_visible_devices(lease), 1);
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
  setenv("GPULOCK_LEASE_ID", gpulock_lease_id(lease), 1);
  printf("lease %s: CUDA_VISIBLE_DEVICES=%s\n", gpulock_lease_id(lease),
         gpulock_lease_cuda_visible_devices(lease));
  fflush(stdout);

  int exit_code = 0;
  if (command[0] == NULL) {
    sleep(5);
  } else {
    const pid_t child = fork();
    if (child == 0) {
      signal(SIGINT, SIG_DFL);
      execvp(command[0], command);
      perror(command[0]);
      _exit(127);
    }
    int child_status = 0;
    pid_t waited = -1;
    if (child > 0)
      while ((waited = waitpid(child, &child_status, 0)) < 0 && errno == EINTR) {
      }
    if (waited != child) {
      perror("c_lease_example");
      exit_code = 70;
    } else {
      exit_code =
          WIFEXITED(child_status) ? WEXITSTATUS(child_status) : 128 + WTERMSIG(child_status);
    }
  }

  gpulock_lease_free(lease); /* releases the GPUs */
  gpulock_pool_free(pool);
  return exit_code;
}
