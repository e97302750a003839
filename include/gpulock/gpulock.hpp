// gpulock: exclusive, never-stale GPU leases on shared machines. Include this for everything.
#pragma once

#include "gpulock/device.hpp"
#include "gpulock/device_source.hpp"
#include "gpulock/doctor.hpp"
#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"
#include "gpulock/jobs.hpp"
#include "gpulock/json_output.hpp"
#include "gpulock/lease.hpp"
#include "gpulock/monitor.hpp"
#include "gpulock/parse.hpp"
#include "gpulock/request.hpp"
#include "gpulock/run.hpp"
#include "gpulock/status.hpp"
#include "gpulock/usage.hpp"
#include "gpulock/version.hpp"
