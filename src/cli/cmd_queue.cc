// `gpulock queue [--json]`: the waiting requests in serving order, and what each waits for.
#include <ctime>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

std::string waited_text(std::chrono::system_clock::time_point since) {
  const auto waited =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now() - since);
  return format_duration(std::max(waited, std::chrono::seconds(0)));
}

std::string request_text(const QueueEntry& e) {
  std::string text =
      e.gpus_named.empty()
          ? fmt::format("{} GPU{}", e.gpus_requested, e.gpus_requested == 1 ? "" : "s")
          : fmt::format("{} named GPU{}", e.gpus_named.size(), e.gpus_named.size() == 1 ? "" : "s");
  if (e.memory_bytes) {
    text = format_size(*e.memory_bytes) + (e.gpus_requested == 1 ? "" : " × " + text);
  } else if (e.slots) {
    text = fmt::format("1/{} GPU", *e.slots) + (e.gpus_requested == 1 ? "" : " × " + text);
  }
  if (e.priority == Priority::kLow) text += " (low)";
  return text;
}

void print_table(const QueueStatus& queue) {
  for (const auto& w : queue.warnings) fmt::print("warning: {}\n", w);
  fmt::print("policy {}{} · {} request{} waiting\n", queue.policy,
             queue.config_source.empty() ? "" : " (" + queue.config_source + ")",
             queue.entries.size(), queue.entries.size() == 1 ? "" : "s");
  if (queue.entries.empty()) return;
  fmt::print("{:>3}  {:<16} {:>8}  {:<14} {:>8}  {}\n", "POS", "USER", "PID", "REQUEST", "WAITING",
             "STANDING: WHAT IT WAITS FOR");
  for (const auto& e : queue.entries) {
    std::string what = e.blocked_by;
    if (!e.label.empty()) what = "[" + e.label + "] " + what;
    fmt::print("{:>3}  {:<16} {:>8}  {:<14} {:>8}  {}: {}\n", e.position, e.user, e.pid,
               request_text(e), waited_text(e.waiting_since), queue_standing_name(e.standing),
               what);
  }
}

}  // namespace

void add_queue_command(CLI::App& app, int* exit_status) {
  auto* command =
      app.add_subcommand("queue", "Show the requests waiting for GPUs, in serving order");
  auto json = std::make_shared<bool>(false);
  auto backend = std::make_shared<std::string>();
  command->add_flag("--json", *json, "Machine-readable output (docs/json.md)");
  add_backend_option(*command, *backend);
  command->callback([json, backend, exit_status] {
    GpuPool pool = open_pool(*backend);
    const QueueStatus queue = pool.queue();
    if (*json) {
      fmt::print("{}\n", queue_to_json(queue));
    } else {
      print_table(queue);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
