// `gpulock status [--json]`: every GPU with its state, holder, memory and utilisation; a
// multi-GPU lease's GPUs together, its holder once; cut to the terminal's width on a terminal;
// then idle leased GPUs and intruders (gpulock/monitor.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

std::string memory_text(const Device& d) {
  if (!d.memory_total_bytes) return "?";
  // As "{:.1f}/{:.0f}G" of the GiB would print (byte counts / 2^30 are exact in a double, and
  // nearbyint() rounds half to even as those do), with integers: a float format with a
  // precision cost ~1,000 instructions, and a 100-host pool shows 800 of these.
  const double gib = 1024.0 * 1024 * 1024;
  const auto tenths = static_cast<std::uint64_t>(
      std::nearbyint(static_cast<double>(d.memory_used_bytes.value_or(0)) / gib * 10));
  const auto total =
      static_cast<std::uint64_t>(std::nearbyint(static_cast<double>(*d.memory_total_bytes) / gib));
  return fmt::format("{}.{}/{}G", tenths / 10, tenths % 10, total);
}

// What the holder column says of a GPU that no readable lease holds.
std::string unleased_text(const GpuStatus& g) {
  std::string text;
  if (g.reserved_for) {
    const QueueEntry& r = *g.reserved_for;
    const std::string what = r.memory_bytes ? format_size(*r.memory_bytes) + " shared"
                             : r.slots      ? fmt::format("1/{} GPU shared", *r.slots)
                                            : fmt::format("{}-GPU", r.gpus_requested);
    text =
        fmt::format("reserved for {}'s {} request (queue position {}) ", r.user, what, r.position);
  }
  for (const auto& p : g.processes) {
    if (!p.foreign) continue;
    text += fmt::format("{}pid {}{}", text.empty() ? "foreign: " : ", ", p.pid,
                        p.user.empty() ? "" : " (" + p.user + ")");
  }
  if (!g.note.empty()) text += (text.empty() ? "" : "; ") + g.note;
  return text;
}

// The holder column of a lease's rows: who, which lease, for how long and the label on the
// first, the command on the second, nothing on the others.
std::vector<std::string> lease_lines(const HolderInfo& h,
                                     std::chrono::system_clock::time_point now) {
  const auto held = std::chrono::duration_cast<std::chrono::seconds>(now - h.started_at);
  std::string first = fmt::format("{} {} {}", h.user, h.lease_id, format_duration(held));
  if (!h.label.empty()) first += " [" + h.label + "]";
  return {first, h.command};
}

// The holder column of a GPU held by shared leases: their memory, then one line per lease.
std::vector<std::string> shared_lines(const GpuStatus& g,
                                      std::chrono::system_clock::time_point now) {
  const SharedUse& s = *g.shared;
  const std::uint64_t total = g.device.memory_total_bytes.value_or(0);
  const std::uint64_t kept = s.reserved_bytes + s.reserve_bytes;
  std::vector<std::string> lines{fmt::format(
      "shared by {} lease{}: {} reserved, {} unreserved{}", s.jobs, s.jobs == 1 ? "" : "s",
      format_size(s.reserved_bytes), format_size(total > kept ? total - kept : 0),
      s.reserve_bytes ? fmt::format(" ({} kept back)", format_size(s.reserve_bytes)) : "")};
  for (const HolderInfo& h : s.leases) {
    const auto held = std::chrono::duration_cast<std::chrono::seconds>(now - h.started_at);
    std::string line = fmt::format("  {} {} {} {}", h.user, h.lease_id,
                                   format_size(h.memory_bytes.value_or(0)), format_duration(held));
    if (!h.label.empty()) line += " [" + h.label + "]";
    if (h.over_reservation) line += fmt::format(" OVER: uses {}", format_size(h.memory_used_bytes));
    if (!h.command.empty()) line += " " + h.command;
    lines.push_back(line);
  }
  return lines;
}

void print_table(const PoolStatus& status) {
  const std::size_t columns = terminal_columns();
  auto print_line = [columns](const std::string& line) { fmt::print("{}\n", fit(line, columns)); };
  print_line(fmt::format(
      "{} · {}{} · {}", status.host, status.device_source, status.simulated ? " (no real GPU)" : "",
      status.spans_hosts ? fmt::format("pool '{}' at {}", status.pool, status.backend_location)
                         : "lock dir " + status.lock_dir));
  for (const auto& w : status.warnings) print_line("warning: " + w);
  auto name_of = [&status](const GpuStatus& g) {
    return g.host.empty() || g.host == status.host ? g.device.display_index()
                                                   : g.host + "/" + g.device.display_index();
  };
  std::size_t name_width = 3;
  for (const auto& g : status.gpus) name_width = std::max(name_width, width_of(name_of(g)));
  auto row = [&](const std::string& name, const std::string& state, const std::string& memory,
                 const std::string& util, const std::string& holder) {
    // Padded by hand: fmt's padding measures each string's display width character by
    // character, ~5,000 instructions a row; the columns here are measured as name_width was.
    std::string line;
    line.reserve(name_width + 28 + holder.size());
    const auto pad = [&line](const std::string& text, std::size_t width, bool right) {
      const std::size_t fill = width - std::min(width, width_of(text));
      if (right) line.append(fill, ' ');
      line += text;
      if (!right) line.append(fill, ' ');
    };
    pad(name, name_width, false);
    line += ' ';
    pad(state, 8, false);
    line += ' ';
    pad(memory, 11, false);
    line += ' ';
    pad(util, 4, true);
    line += "  ";
    line += holder;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    print_line(line);
  };
  row("GPU", "STATE", "MEMORY", "UTIL", "HOLDER (user lease held [label] / command)");
  // A lease's GPUs are shown together, its holder once: rows in index order, except that the
  // first GPU of a lease brings the lease's other GPUs up beside it.
  std::vector<bool> shown(status.gpus.size(), false);
  for (std::size_t i = 0; i < status.gpus.size(); ++i) {
    if (shown[i]) continue;
    std::vector<std::size_t> group{i};
    const GpuStatus& first = status.gpus[i];
    if (first.holder) {
      for (std::size_t j = i + 1; j < status.gpus.size(); ++j)
        if (status.gpus[j].holder && status.gpus[j].holder->lease_id == first.holder->lease_id &&
            status.gpus[j].host == first.host)
          group.push_back(j);
    }
    std::vector<std::string> holder_column =
        first.holder   ? lease_lines(*first.holder, status.taken_at)
        : first.shared ? shared_lines(first, status.taken_at)
                       : std::vector<std::string>{unleased_text(first)};
    // The first GPU's row and the lines under it (no GPU number: they belong to the row above)
    // describe the holder; each other GPU of the lease says whose it is and where that is.
    const auto gpu_row = [&](const GpuStatus& g, const std::string& holder) {
      const Device& d = g.device;
      row(name_of(g), g.reserved_for ? "reserved" : gpu_state_name(g.state), memory_text(d),
          d.utilization_percent ? fmt::format("{}%", *d.utilization_percent) : "?", holder);
    };
    gpu_row(first, holder_column.empty() ? "" : holder_column[0]);
    shown[i] = true;
    for (std::size_t k = 1; k < holder_column.size(); ++k)
      if (!holder_column[k].empty()) row("", "", "", "", holder_column[k]);
    for (std::size_t k = 1; k < group.size(); ++k) {
      shown[group[k]] = true;
      gpu_row(status.gpus[group[k]], fmt::format("{} {} (with GPU {})", first.holder->user,
                                                 first.holder->lease_id, name_of(first)));
    }
    for (std::size_t k : group)
      if ((status.gpus[k].holder || status.gpus[k].shared) && !status.gpus[k].note.empty())
        print_line(fmt::format("{:<{}} note: GPU {}: {}", "", name_width, name_of(status.gpus[k]),
                               status.gpus[k].note));
  }
  if (status.gpus.empty()) print_line("(no GPUs)");
  for (const auto& g : status.gpus)
    if (g.idle && g.holder && g.idle_since)
      print_line(fmt::format("idle: GPU {} leased by {} (lease {}) at 0% for {}", name_of(g),
                             g.holder->user, g.holder->lease_id,
                             format_duration(std::chrono::duration_cast<std::chrono::seconds>(
                                 status.taken_at - *g.idle_since))));
  for (const auto& intruder : intruders_of(status)) print_line(describe_intruder(intruder));
  print_line(fmt::format("queue: {} request{} waiting ({}){}", status.queue_length,
                         status.queue_length == 1 ? "" : "s", status.queue_policy,
                         status.queue_length > 0 ? "; `gpulock queue` lists them" : ""));
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
    PoolStatus status = *whole_pool ? pool.pool_status() : pool.status();
    IdleTracker(default_idle_record_path()).observe(status, pool.config().idle_after);
    if (*json) {
      fmt::print("{}\n", status_to_json(status));
    } else {
      print_table(status);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
