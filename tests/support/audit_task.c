/* audit_task AUDIT_DIR: one audited job of a storm test (tests/integration/test_queue_storm.py),
 * run by `gpulock run -n 1 -- audit_task DIR`, cheap enough to start thousands at once.
 *
 * It takes the GPU it was given from CUDA_VISIBLE_DEVICES, creates the marker DIR/gpu-<id>
 * with O_EXCL (a marker already there means another job holds that GPU now), appends
 * "start <id> <pid>" and then "end <id> <pid>" to DIR/log (O_APPEND: each line one write, in the
 * order the kernel ran them), removes the marker and appends "<pid>" to DIR/done. Any failure is
 * appended to DIR/errors and makes it exit 3. So the audit is independent of gpulock: a GPU
 * given to two jobs at once shows as a marker clash or as two starts in a row in the log. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char* dir;

static void append(const char* name, const char* line) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) _exit(4);
  size_t len = strlen(line);
  if (write(fd, line, len) != (ssize_t)len) _exit(4);
  close(fd);
}

static void fail(const char* what) {
  char line[512];
  snprintf(line, sizeof line, "pid %d: %s\n", (int)getpid(), what);
  append("errors", line);
  _exit(3);
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  dir = argv[1];
  const char* gpu = getenv("CUDA_VISIBLE_DEVICES");
  if (!gpu || !*gpu || strspn(gpu, "0123456789") != strlen(gpu)) fail("no GPU id given");
  char marker[4096], line[128];
  snprintf(marker, sizeof marker, "%s/gpu-%s", dir, gpu);
  int fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    snprintf(line, sizeof line, "GPU %s was in use (%s)", gpu, strerror(errno));
    fail(line);
  }
  close(fd);
  snprintf(line, sizeof line, "start %s %d\n", gpu, (int)getpid());
  append("log", line);
  snprintf(line, sizeof line, "end %s %d\n", gpu, (int)getpid());
  append("log", line);
  if (unlink(marker) != 0) fail("cannot remove its marker");
  snprintf(line, sizeof line, "%d\n", (int)getpid());
  append("done", line);
  return 0;
}
