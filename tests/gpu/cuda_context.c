/* cuda_context: a real CUDA compute process for checks on a machine with an NVIDIA GPU.
 *
 * It loads the driver's libcuda.so.1 at run time (no CUDA toolkit needed to build it), prints
 * how many devices CUDA sees under the current CUDA_VISIBLE_DEVICES and the UUID of each, then,
 * if asked, makes device ORDINAL current, allocates MIB MiB on it (so NVML lists this process
 * with its memory) and sleeps SECONDS before exiting. The declarations below are written from
 * NVIDIA's public CUDA Driver API reference (cuInit, cuDeviceGetCount, cuDeviceGet,
 * cuDeviceGetUuid, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemAlloc_v2, cuGetErrorString).
 *
 *   cuda_context                       list what CUDA sees: "count N", then "device I GPU-…"
 *   cuda_context ORDINAL MIB SECONDS   also hold MIB MiB on device ORDINAL; "ready PID" once held
 *
 * Exit status: 0, or 2 when libcuda cannot be loaded or a call fails (its error is printed).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult; /* CUDA_SUCCESS == 0 */
typedef int CUdevice;
typedef void* CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct {
  unsigned char bytes[16];
} CUuuid;

static void* library;

static void* entry(const char* name) {
  void* symbol = dlsym(library, name);
  if (symbol == NULL) {
    fprintf(stderr, "cuda_context: libcuda.so.1 has no %s\n", name);
    exit(2);
  }
  return symbol;
}

static void check(CUresult result, const char* what) {
  if (result == 0) return;
  const char* text = "unknown error";
  CUresult (*error_string)(CUresult, const char**) =
      (CUresult(*)(CUresult, const char**))dlsym(library, "cuGetErrorString");
  if (error_string != NULL) error_string(result, &text);
  fprintf(stderr, "cuda_context: %s failed: %d (%s)\n", what, result, text);
  exit(2);
}

int main(int argc, char** argv) {
  library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "cuda_context: cannot load libcuda.so.1: %s\n", dlerror());
    return 2;
  }
  CUresult (*cu_init)(unsigned) = (CUresult(*)(unsigned))entry("cuInit");
  CUresult (*device_count)(int*) = (CUresult(*)(int*))entry("cuDeviceGetCount");
  CUresult (*device_get)(CUdevice*, int) = (CUresult(*)(CUdevice*, int))entry("cuDeviceGet");
  CUresult (*device_uuid)(CUuuid*, CUdevice) =
      (CUresult(*)(CUuuid*, CUdevice))entry("cuDeviceGetUuid");

  check(cu_init(0), "cuInit");
  int count = 0;
  check(device_count(&count), "cuDeviceGetCount");
  printf("count %d\n", count);
  for (int i = 0; i < count; ++i) {
    CUdevice device;
    CUuuid uuid;
    check(device_get(&device, i), "cuDeviceGet");
    check(device_uuid(&uuid, device), "cuDeviceGetUuid");
    const unsigned char* b = uuid.bytes;
    printf("device %d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
           i, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
           b[13], b[14], b[15]);
  }
  fflush(stdout);
  if (argc < 4) return 0;

  const int ordinal = atoi(argv[1]);
  const size_t bytes = (size_t)strtoull(argv[2], NULL, 10) << 20;
  const unsigned seconds = (unsigned)strtoul(argv[3], NULL, 10);
  CUresult (*retain)(CUcontext*, CUdevice) =
      (CUresult(*)(CUcontext*, CUdevice))entry("cuDevicePrimaryCtxRetain");
  CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))entry("cuCtxSetCurrent");
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) =
      (CUresult(*)(CUdeviceptr*, size_t))entry("cuMemAlloc_v2");
  CUdevice device;
  CUcontext context;
  CUdeviceptr memory;
  check(device_get(&device, ordinal), "cuDeviceGet");
  check(retain(&context, device), "cuDevicePrimaryCtxRetain");
  check(set_current(context), "cuCtxSetCurrent");
  if (bytes > 0) check(mem_alloc(&memory, bytes), "cuMemAlloc_v2");
  printf("ready %ld\n", (long)getpid());
  fflush(stdout);
  sleep(seconds);
  return 0;
}
