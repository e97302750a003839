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

// The GPU's shared use in the pool's view; nullptr when it has no shared leases.
const SharedUse* shared_use_of(const Device& d, const PoolStatus& leases) {
  for (const GpuStatus& g : leases.gpus)
    if (g.device.uuid == d.uuid && g.shared) return &*g.shared;
  return nullptr;
}

// What shared leases may still reserve on the GPU: its memory less theirs and the reserve.
std::uint64_t unreserved_bytes(const Device& d, const SharedUse& s) {
  const std::uint64_t total = d.memory_total_bytes.value_or(0);
  const std::uint64_t kept = s.reserved_bytes + s.reserve_bytes;
  return total > kept ? total - kept : 0;
}

// "-" for a GPU without shared leases, else "JOBS: RESERVED reserved, UNRESERVED left".
std::string shared_column(const Device& d, const PoolStatus* leases) {
  if (!leases) return "?";
  const SharedUse* s = shared_use_of(d, *leases);
  if (!s) return "-";
  return fmt::format("{} job{}, {} reserved, {} left", s->jobs, s->jobs == 1 ? "" : "s",
                     format_size(s->reserved_bytes), format_size(unreserved_bytes(d, *s)));
}

std::string state_column(const Device& d, const PoolStatus* leases) {
  if (!leases) return "?";
  for (const GpuStatus& g : leases->gpus)
    if (g.device.uuid == d.uuid) return gpu_state_name(g.state);
  return "?";
}

// The shared column of the narrow table: "2 jobs 40.0G left".
std::string short_shared_column(const Device& d, const PoolStatus* leases) {
  if (!leases) return "?";
  const SharedUse* s = shared_use_of(d, *leases);
  if (!s) return "-";
  return fmt::format("{} job{} {:.1f}G left", s->jobs, s->jobs == 1 ? "" : "s",
                     static_cast<double>(unreserved_bytes(d, *s)) / (1u << 30));
}

std::string short_mode(const Device& d) {
  std::string mode;
  switch (d.compute_mode) {
    case ComputeMode::kDefault:
      mode = "-";
      break;
    case ComputeMode::kExclusiveProcess:
      mode = "excl";
      break;
    case ComputeMode::kExclusiveThread:
      mode = "excl-t";
      break;
    case ComputeMode::kProhibited:
      mode = "prohib";
      break;
    case ComputeMode::kUnknown:
      mode = "?";
      break;
  }
  return d.mig_enabled.value_or(false) ? mode + ",MIG" : mode;
}

// On a terminal (unless --wide): the columns that fit 80, without the UUID (`--wide`, `--json`
// and `status --json` have it), each line cut to the terminal's width.
void print_narrow_table(const std::vector<Device>& devices, const PoolStatus* leases,
                        std::size_t columns) {
  const auto line = [columns](const std::string& text) { fmt::print("{}\n", fit(text, columns)); };
  line(fmt::format("{:<3} {:<14} {:>9} {:>4} {:>8} {:>4} {:<6} {:<8} {}", "GPU", "NAME", "MEM FREE",
                   "UTIL", "POWER", "PROC", "MODE", "STATE", "SHARED"));
  const double gib = 1024.0 * 1024 * 1024;
  for (const auto& d : devices) {
    // "NVIDIA H100 80GB HBM3" says what it is in its last 14 characters.
    std::string name = d.name.starts_with("NVIDIA ") ? d.name.substr(7) : d.name;
    if (width_of(name) > 14) name = fit(name, 14);
    const std::string memory =
        d.memory_total_bytes ? fmt::format("{:.1f}/{:.0f}G", d.memory_free_bytes.value_or(0) / gib,
                                           *d.memory_total_bytes / gib)
                             : "?";
    const std::string power = fmt::format("{}/{}", or_unknown(d.power_draw_watts, "{:.0f}"),
                                          or_unknown(d.power_limit_watts, "{:.0f}W"));
    line(fmt::format("{:<3} {:<14} {:>9} {:>4} {:>8} {:>4} {:<6} {:<8} {}", d.display_index(), name,
                     memory, or_unknown(d.utilization_percent, "{}%"), power, d.processes.size(),
                     short_mode(d), state_column(d, leases), short_shared_column(d, leases)));
  }
}

void print_table(const std::vector<Device>& devices, DeviceSource& source, const PoolStatus* leases,
                 bool wide) {
  fmt::print("{}{}\n", source.description(), source.simulated() ? " (no real GPU)" : "");
  if (const std::size_t columns = terminal_columns(); columns != 0 && !wide) {
    print_narrow_table(devices, leases, columns);
    return;
  }
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
  auto wide = std::make_shared<bool>(false);
  command->add_flag("--json", *json, "Machine-readable output (docs/json.md)");
  command->add_flag("--wide", *wide,
                    "Every column (UUID, compute mode…) on a terminal too; piped output has them");
  add_backend_option(*command, *backend);
  command->callback([json, backend, wide, exit_status] {
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
      print_table(devices, *source, pool_view, *wide);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
