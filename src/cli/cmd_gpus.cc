// `gpulock gpus [--json]`: device inventory and health.
#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

template <typename T>
std::string or_unknown(const std::optional<T>& value, const char* format) {
  return value ? fmt::format(fmt::runtime(format), *value) : "?";
}

void print_table(const std::vector<Device>& devices, DeviceSource& source) {
  fmt::print("{}{}\n", source.description(), source.simulated() ? " (simulated, no real GPU)" : "");
  fmt::print("{:<5} {:<42} {:<24} {:>18} {:>5} {:>13} {:<17} {}\n", "GPU", "UUID", "NAME",
             "MEMORY FREE/TOTAL", "UTIL", "POWER", "MODE", "PROCESSES");
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
    fmt::print("{:<5} {:<42} {:<24} {:>18} {:>5} {:>13} {:<17} {}\n", d.display_index(), d.uuid,
               d.name.substr(0, 24), memory, or_unknown(d.utilization_percent, "{}%"), power, mode,
               d.processes.size());
  }
}

}  // namespace

void add_gpus_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("gpus", "List the GPUs with memory, utilisation and power");
  auto json = std::make_shared<bool>(false);
  command->add_flag("--json", *json, "Machine-readable output (docs/json.md)");
  command->callback([json, exit_status] {
    auto source = open_device_source();
    const auto devices = source->devices();
    if (*json) {
      fmt::print("{}\n", devices_to_json(devices, source->description(), source->simulated()));
    } else {
      print_table(devices, *source);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
