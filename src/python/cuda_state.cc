// Detects an initialised CUDA driver without initialising it. The loaded objects are listed
// (dl_iterate_phdr, which touches no file) to find libcuda.so.1; only when it is there is it
// opened, with RTLD_NOLOAD, and cuDeviceGetCount, which the CUDA driver API documents to fail
// with CUDA_ERROR_NOT_INITIALIZED (3) before cuInit, tells the two states apart.
#include "python/cuda_state.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <string>

namespace gpulock::python {
namespace {

constexpr int kCudaSuccess = 0;
constexpr const char* kDriverName = "libcuda.so.1";

// The path under which the driver library was loaded, or "" when it is not loaded.
std::string loaded_driver_path() {
  std::string found;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) -> int {
        const char* name = info->dlpi_name;
        if (name == nullptr) return 0;
        const char* slash = std::strrchr(name, '/');
        const char* base = slash != nullptr ? slash + 1 : name;
        if (std::strncmp(base, "libcuda.so", std::strlen("libcuda.so")) != 0) return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &found);
  return found;
}

}  // namespace

bool cuda_initialized_in_process() noexcept {
  try {
    const std::string path = loaded_driver_path();
    if (path.empty()) return false;
    // By its path first (loaded as libcuda.so or by full path), then by the soname.
    void* driver = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (driver == nullptr) driver = ::dlopen(kDriverName, RTLD_LAZY | RTLD_NOLOAD);
    if (driver == nullptr) return false;
    using DeviceGetCount = int (*)(int*);
    auto get_count = reinterpret_cast<DeviceGetCount>(::dlsym(driver, "cuDeviceGetCount"));
    int count = 0;
    const bool initialized = get_count != nullptr && get_count(&count) == kCudaSuccess;
    ::dlclose(driver);  // drops only the reference RTLD_NOLOAD added
    return initialized;
  } catch (...) {
    return false;  // out of memory for a path: no warning rather than a failed lease
  }
}

}  // namespace gpulock::python
