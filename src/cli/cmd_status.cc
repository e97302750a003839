// `gpulock status [--json]`: every GPU with its state, holder, memory and utilisation.
#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

std::string memory_text(const Device& d) {
  if (!d.memory_total_bytes) return "?";
  const double gib = 1024.0 * 1024 * 1024;
  return fmt::format("{:.1f}/{:.0f} GiB", d.memory_used_bytes.value_or(0) / gib,
                     *d.memory_total_bytes / gib);
}

std::string holder_text(const GpuStatus& g, std::chrono::system_clock::time_point now) {
  if (g.holder) {
    const HolderInfo& h = *g.holder;
    const auto held = std::chrono::duration_cast<std::chrono::seconds>(now - h.started_at);
    std::string text = fmt::format("{} {} {} ", h.user, h.lease_id, format_duration(held));
    if (!h.label.empty()) text += "[" + h.label + "] ";
    text += h.command;
    return text;
  }
  std::string text;
  if (g.reserved_for)
    text =
        fmt::format("reserved for {}'s {}-GPU request (queue position {}) ", g.reserved_for->user,
                    g.reserved_for->gpus_requested, g.reserved_for->position);
  for (const auto& p : g.processes) {
    if (!p.foreign) continue;
    text += fmt::format("{}pid {}{}", text.empty() ? "foreign: " : ", ", p.pid,
                        p.user.empty() ? "" : " (" + p.user + ")");
  }
  if (!g.note.empty()) text += (text.empty() ? "" : "; ") + g.note;
  return text;
}

void print_table(const PoolStatus& status) {
  fmt::print("{} · {}{} · {}\n", status.host, status.device_source,
             status.simulated ? " (simulated, no real GPU)" : "",
             status.backend == "redis"
                 ? fmt::format("pool '{}' at {}", status.pool, status.backend_location)
                 : "lock dir " + status.lock_dir);
  for (const auto& w : status.warnings) fmt::print("warning: {}\n", w);
  fmt::print("{:<5} {:<9} {:<16} {:>5}  {}\n", "GPU", "STATE", "MEMORY", "UTIL",
             "HOLDER (user, lease, held for, [label], command)");
  for (const auto& g : status.gpus) {
    const auto& d = g.device;
    const std::string state = g.reserved_for ? "reserved" : gpu_state_name(g.state);
    const std::string name = g.host.empty() || g.host == status.host
                                 ? d.display_index()
                                 : g.host + "/" + d.display_index();
    fmt::print("{:<5} {:<9} {:<16} {:>5}  {}\n", name, state, memory_text(d),
               d.utilization_percent ? fmt::format("{}%", *d.utilization_percent) : "?",
               holder_text(g, status.taken_at));
    if (g.holder && !g.note.empty()) fmt::print("      note: {}\n", g.note);
  }
  if (status.gpus.empty()) fmt::print("(no GPUs)\n");
  fmt::print("queue: {} request{} waiting ({}){}\n", status.queue_length,
             status.queue_length == 1 ? "" : "s", status.queue_policy,
             status.queue_length > 0 ? "; `gpulock queue` lists them" : "");
}

}  // namespace

void add_status_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("status", "Show every GPU: free, leased (by whom), busy");
  auto json = std::make_shared<bool>(false);
  auto whole_pool = std::make_shared<bool>(false);
  auto backend = std::make_shared<std::string>();
  command->add_flag("--json", *json, "Machine-readable output (docs/json.md)");
  command->add_flag("--pool", *whole_pool,
                    "Redis backend: every host of the pool, not only this one");
  add_backend_option(*command, *backend);
  command->callback([json, whole_pool, backend, exit_status] {
    GpuPool pool = open_pool(*backend);
    const PoolStatus status = *whole_pool ? pool.pool_status() : pool.status();
    if (*json) {
      fmt::print("{}\n", status_to_json(status));
    } else {
      print_table(status);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
