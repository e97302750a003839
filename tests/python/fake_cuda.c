/* A stand-in for the CUDA driver (libcuda.so.1), for the tests of gpulock's "CUDA was already
 * initialised" warning. Built with SONAME libcuda.so.1, so that once a test process has loaded
 * it (ctypes.CDLL(path)), dlopen("libcuda.so.1", RTLD_NOLOAD) finds it, as it would find the
 * real driver after PyTorch or another framework loaded it.
 *
 * It implements the two calls gpulock's check relies on, as the CUDA driver API documents them:
 * cuDeviceGetCount fails with CUDA_ERROR_NOT_INITIALIZED (3) until cuInit has run, then
 * succeeds. It never touches a GPU. */

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3

static int initialized;

__attribute__((visibility("default"))) int cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  initialized = 1;
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) int cuDeviceGetCount(int* count) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  *count = 0;
  return CUDA_SUCCESS;
}
