// `gpulock gpus [--json]`: device inventory and health, with each GPU's lease state and the
// memory its shared leases reserve (from the pool, when it can be read).
#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

template <typename T>
std::string or_unknown(const std::optional<T>& value, const char* format) {
  return value ? fmt::format(fmt::runtime(format), *value) : "?";
}

// "-" for a GPU without shared leases, else "JOBS: RESERVED reserved, UNRESERVED left".
std::string shared_column(const Device& d, const PoolStatus* leases) {
  if (!leases) return "?";
  for (const GpuStatus& g : leases->gpus) {
    if (g.device.uuid != d.uuid || !g.shared) continue;
    const std::uint64_t total = d.memory_total_bytes.value_or(0);
    const std::uint64_t kept = g.shared->reserved_bytes + g.shared->reserve_bytes;
    return fmt::format("{} job{}, {} reserved, {} left", g.shared->jobs,
                       g.shared->jobs == 1 ? "" : "s", format_size(g.shared->reserved_bytes),
                       format_size(total > kept ? total - kept : 0));
  }
  return "-";
}

std::string state_column(const Device& d, const PoolStatus* leases) {
  if (!leases) return "?";
  for (const GpuStatus& g : leases->gpus)
    if (g.device.uuid == d.uuid) return gpu_state_name(g.state);
  return "?";
}

void print_table(const std::vector<Device>& devices, DeviceSource& source,
                 const PoolStatus* leases) {
  fmt::print("{}{}\n", source.description(), source.simulated() ? " (no real GPU)" : "");
  fmt::print("{:<5} {:<42} {:<24} {:>18} {:>5} {:>13} {:<17} {:>9} {:<8} {}\n", "GPU", "UUID",
             "NAME", "MEMORY FREE/TOTAL", "UTIL", "POWER", "MODE", "PROCESSES", "STATE",
             "SHARED LEASES");
  const double gib = 1024.0 * 1024 * 1024;
  for (const auto& d : devices) {
    const std::string memory =
        d.memory_total_bytes
            ? fmt::format("{:.1f}/{:.1f} GiB", d.memory_free_bytes.value_or(0) / gib,
                          *d.memory_total_bytes / gib)
            : "?";
    const std::string power = fmt::format("{}/{}", or_unknown(d.power_draw_watts, "{:.0f}"),
                                          or_unknown(d.power_limit_watts, "{:.0f} W"));
    std::string mode = compute_mode_name(d.compute_mode);
    if (d.mig_enabled.value_or(false)) mode += ",MIG";
    fmt::print("{:<5} {:<42} {:<24} {:>18} {:>5} {:>13} {:<17} {:>9} {:<8} {}\n", d.display_index(),
               d.uuid, d.name.substr(0, 24), memory, or_unknown(d.utilization_percent, "{}%"),
               power, mode, d.processes.size(), state_column(d, leases), shared_column(d, leases));
  }
}

}  // namespace

void add_gpus_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("gpus", "List the GPUs with memory, utilisation and power");
  auto json = std::make_shared<bool>(false);
  auto backend = std::make_shared<std::string>();
  command->add_flag("--json", *json, "Machine-readable output (docs/json.md)");
  add_backend_option(*command, *backend);
  command->callback([json, backend, exit_status] {
    auto source = open_device_source();
    const auto devices = source->devices();
    // The lease states come from the pool; the inventory does not depend on it (an unusable
    // lock directory or an unreachable Redis server leaves those columns unknown).
    std::optional<PoolStatus> leases;
    try {
      leases = open_pool(*backend).status();
    } catch (const Error& e) {
      print_error(fmt::format("lease states unknown: {}", e.what()));
    }
    const PoolStatus* pool_view = leases ? &*leases : nullptr;
    if (*json) {
      fmt::print("{}\n",
                 devices_to_json(devices, source->description(), source->simulated(), pool_view));
    } else {
      print_table(devices, *source, pool_view);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
