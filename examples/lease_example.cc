// Example: lease two GPUs from C++, make them visible to CUDA, and see who holds what.
//
//   GPULOCK_FAKE_GPUS=4 build/examples/lease_example
#include <cstdlib>
#include <iostream>

#include "gpulock/gpulock.hpp"

int main() {
  try {
    gpulock::GpuPool pool = gpulock::GpuPool::open();  // NVML or GPULOCK_FAKE_GPUS; GPULOCK_DIR

    gpulock::LeaseRequest request;
    request.count = 2;
    request.min_free_memory_bytes = gpulock::parse_size("10G");
    request.timeout = gpulock::parse_duration("5m");
    request.label = "lease_example";

    // Waits (without polling) until two healthy GPUs are free, then holds them until `lease`
    // is destroyed or this process ends, however it ends.
    gpulock::Lease lease = pool.acquire(request);

    // Must happen before anything in this process initialises CUDA.
    ::setenv("CUDA_VISIBLE_DEVICES", lease.cuda_visible_devices().c_str(), 1);
    ::setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
    std::cout << "lease " << lease.id() << ": CUDA_VISIBLE_DEVICES=" << lease.cuda_visible_devices()
              << "\n";

    for (const auto& gpu : pool.status().gpus) {
      std::cout << "GPU " << gpu.device.display_index() << " "
                << gpulock::gpu_state_name(gpu.state)
                << (gpu.holder ? " by " + gpu.holder->user + " (" + gpu.holder->label + ")" : "")
                << "\n";
    }
  } catch (const gpulock::Error& error) {
    std::cerr << "lease_example: " << error.what() << "\n";
    return gpulock::exit_status_for(error.code());
  }
}
