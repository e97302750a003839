// Whether CUDA is already initialised in this process: then CUDA_VISIBLE_DEVICES, which CUDA
// reads once in cuInit, can no longer change which GPUs the process uses.
#pragma once

namespace gpulock::python {

// True if the CUDA driver library (libcuda.so*) is loaded in this process and cuInit has run.
// Never loads the driver itself and never initialises it. False when the driver is absent.
bool cuda_initialized_in_process() noexcept;

}  // namespace gpulock::python
