// Detects an initialised CUDA driver without initialising it: libcuda.so.1 is looked up only
// among the libraries already loaded (RTLD_NOLOAD), and cuDeviceGetCount, which the CUDA driver
// API documents to fail with CUDA_ERROR_NOT_INITIALIZED (3) before cuInit, tells the two states
// apart.
#include "python/cuda_state.h"

#include <dlfcn.h>

namespace gpulock::python {
namespace {

constexpr int kCudaSuccess = 0;

}  // namespace

bool cuda_initialized_in_process() noexcept {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) return false;
  using DeviceGetCount = int (*)(int*);
  auto get_count = reinterpret_cast<DeviceGetCount>(::dlsym(driver, "cuDeviceGetCount"));
  int count = 0;
  const bool initialized = get_count != nullptr && get_count(&count) == kCudaSuccess;
  ::dlclose(driver);  // drops only the reference RTLD_NOLOAD added
  return initialized;
}

}  // namespace gpulock::python
