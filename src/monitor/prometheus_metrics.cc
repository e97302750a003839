// metrics_text() (gpulock/monitor.hpp): the Prometheus text exposition format, version 0.0.4.
// Every family is written whole (HELP, TYPE, then its samples), label values escaped as the
// format asks (backslash, double quote, newline), in base units (bytes, seconds, ratios).
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "gpulock/monitor.hpp"
#include "util/strings.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

std::string escaped(const std::string& raw) {
  // A scraper refuses the whole page over one label value that is not UTF-8, and labels are
  // anyone's --label: such a value is shown made safe ('?' for what is not text) instead.
  const std::string value = is_valid_utf8(raw) ? raw : sanitize_for_display(raw, raw.size() * 3);
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string number(double value) {
  // The format's own words for what is not a finite number (and no cast of one to an integer).
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers exactly; others with enough digits to round-trip.
  if (std::abs(value) < 1e15 && value == std::trunc(value))
    return fmt::format("{}", static_cast<long long>(value));
  return fmt::format("{:.17g}", value);
}

class Family {
 public:
  Family(std::string name, std::string type, std::string help)
      : name_(std::move(name)), type_(std::move(type)), help_(std::move(help)) {}
  void add(const Labels& labels, double value) {
    std::string line = name_;
    if (!labels.empty()) {
      line += '{';
      for (std::size_t i = 0; i < labels.size(); ++i)
        line +=
            fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first, escaped(labels[i].second));
      line += '}';
    }
    samples_ += line + " " + number(value) + "\n";
  }
  std::string text() const {
    return fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name_, help_, name_, type_, samples_);
  }

 private:
  std::string name_, type_, help_, samples_;
};

Labels gpu_labels(const PoolStatus& status, const GpuStatus& gpu) {
  return {{"host", gpu.host.empty() ? status.host : gpu.host},
          {"gpu", gpu.device.display_index()},
          {"uuid", gpu.device.uuid}};
}

Labels with(Labels labels, const std::string& name, const std::string& value) {
  labels.emplace_back(name, value);
  return labels;
}

// The journal's counters, or a comment saying why there are none (journal_up 0).
std::string lease_count_text(const LeaseCounts& counts) {
  Family up("gpulock_journal_up", "gauge",
            "1 if the usage journal could be read for the lease counters, else 0.");
  up.add({}, counts.available ? 1 : 0);
  if (!counts.available) {
    std::string why = counts.problem;
    std::replace(why.begin(), why.end(), '\n', ' ');
    return fmt::format("# gpulock: no lease counters: {}\n", why) + up.text();
  }
  Family started("gpulock_leases_started_total", "counter",
                 "Leases started, per user, as the usage journal records them.");
  Family ended("gpulock_leases_ended_total", "counter",
               "Leases ended, per user and how (released, holder_died, lost).");
  for (const auto& [user, n] : counts.started)
    started.add({{"user", user}}, static_cast<double>(n));
  for (const auto& [key, n] : counts.ended)
    ended.add({{"user", key.first}, {"how", lease_end_name(key.second)}}, static_cast<double>(n));
  return up.text() + started.text() + ended.text();
}

}  // namespace

std::string metrics_text(const PoolStatus& status, const QueueStatus& queue,
                         const LeaseCounts* lease_counts) {
  const double now = unix_seconds(status.taken_at);
  Family info("gpulock_gpu_info", "gauge", "A GPU (or MIG instance) gpulock manages; always 1.");
  Family state("gpulock_gpu_state", "gauge",
               "1 for the GPU's current state (free, leased, busy, excluded, reserved), else 0.");
  Family lease("gpulock_gpu_lease_info", "gauge",
               "1 for each leased GPU, labelled with its holder, lease and label.");
  Family held("gpulock_gpu_lease_held_seconds", "gauge", "How long the lease has held the GPU.");
  Family utilization("gpulock_gpu_utilization_ratio", "gauge",
                     "GPU utilisation over the driver's sampling window, 0 to 1.");
  Family memory_used("gpulock_gpu_memory_used_bytes", "gauge", "GPU memory in use.");
  Family memory_total("gpulock_gpu_memory_total_bytes", "gauge", "GPU memory in all.");
  Family power("gpulock_gpu_power_draw_watts", "gauge", "Power drawn by the GPU.");
  Family idle("gpulock_gpu_idle", "gauge",
              "1 if the leased GPU has been at 0 % utilisation for at least idle_after.");
  Family idle_seconds("gpulock_gpu_idle_seconds", "gauge",
                      "How long the leased GPU has been at 0 % utilisation without a break.");
  Family intruders("gpulock_gpu_intruder_processes", "gauge",
                   "Compute processes on the leased GPU outside the lease's process tree.");
  Family intruder("gpulock_intruder_info", "gauge",
                  "1 for each process running on a GPU leased to someone else's lease.");
  Family shared_jobs("gpulock_gpu_shared_jobs", "gauge",
                     "Shared leases (by memory) holding the GPU; GPUs in shared use only.");
  Family shared_reserved("gpulock_gpu_shared_reserved_bytes", "gauge",
                         "GPU memory the shared leases on the GPU reserve, in all.");
  Family shared_unreserved("gpulock_gpu_shared_unreserved_bytes", "gauge",
                           "GPU memory left for further shared leases: total less reservations and "
                           "shared_memory_reserve.");
  Family lease_reserved("gpulock_shared_lease_reserved_bytes", "gauge",
                        "GPU memory a shared lease reserves on the GPU.");
  Family lease_over("gpulock_shared_lease_over_reservation", "gauge",
                    "1 if the shared lease's processes use more GPU memory than it reserved.");
  Family user_gpus("gpulock_user_gpus_held", "gauge", "GPUs each user holds.");
  Family queue_length("gpulock_queue_length", "gauge", "Requests waiting in the queue.");
  Family user_waiting("gpulock_queue_waiting_requests", "gauge", "Waiting requests per user.");
  Family user_gpus_wanted("gpulock_queue_requested_gpus", "gauge",
                          "GPUs the waiting requests of each user ask for.");
  Family user_wait("gpulock_queue_longest_wait_seconds", "gauge",
                   "How long each user's longest-waiting request has waited.");
  Family idle_after("gpulock_idle_after_seconds", "gauge",
                    "The config's idle_after: 0 % this long makes a leased GPU idle.");
  Family taken("gpulock_status_timestamp_seconds", "gauge",
               "When these readings were taken (Unix time).");

  std::map<std::string, int> gpus_per_user;
  for (const auto& gpu : status.gpus) {
    const Labels labels = gpu_labels(status, gpu);
    const Device& d = gpu.device;
    info.add(with(labels, "name", d.name), 1);
    const std::string current = gpu.reserved_for ? "reserved" : gpu_state_name(gpu.state);
    for (const char* name : {"free", "leased", "busy", "excluded", "reserved"})
      state.add(with(labels, "state", name), current == name ? 1 : 0);
    if (d.utilization_percent) utilization.add(labels, *d.utilization_percent / 100.0);
    if (d.memory_used_bytes) memory_used.add(labels, static_cast<double>(*d.memory_used_bytes));
    if (d.memory_total_bytes) memory_total.add(labels, static_cast<double>(*d.memory_total_bytes));
    if (d.power_draw_watts) power.add(labels, *d.power_draw_watts);
    if (gpu.shared) {
      const SharedUse& use = *gpu.shared;
      shared_jobs.add(labels, use.jobs);
      shared_reserved.add(labels, static_cast<double>(use.reserved_bytes));
      if (d.memory_total_bytes) {
        const std::uint64_t kept = use.reserved_bytes + use.reserve_bytes;
        shared_unreserved.add(
            labels,
            static_cast<double>(*d.memory_total_bytes > kept ? *d.memory_total_bytes - kept : 0));
      }
      for (const auto& h : use.leases) {
        const Labels of_lease = with(with(labels, "user", h.user), "lease_id", h.lease_id);
        lease_reserved.add(of_lease, static_cast<double>(h.memory_bytes.value_or(0)));
        lease_over.add(of_lease, h.over_reservation ? 1 : 0);
      }
    }
    if (gpu.state != GpuState::kLeased || !gpu.holder) continue;
    const HolderInfo& h = *gpu.holder;
    ++gpus_per_user[h.user];
    Labels holder = with(labels, "user", h.user);
    lease.add(with(with(holder, "lease_id", h.lease_id), "label", h.label), 1);
    held.add(holder, std::max(0.0, now - unix_seconds(h.started_at)));
    if (status.idle_after) {
      idle.add(holder, gpu.idle ? 1 : 0);
      idle_seconds.add(holder, gpu.idle_since ? now - unix_seconds(*gpu.idle_since) : 0);
    }
    intruders.add(holder, static_cast<double>(
                              std::count_if(gpu.processes.begin(), gpu.processes.end(),
                                            [](const ProcessOnGpu& p) { return p.foreign; })));
  }
  for (const auto& found : intruders_of(status))
    intruder.add({{"host", found.host},
                  {"gpu", found.gpu},
                  {"uuid", found.gpu_uuid},
                  {"pid", std::to_string(found.pid)},
                  {"user", found.user},
                  {"holder_user", found.holder_user},
                  {"lease_id", found.lease_id}},
                 1);
  for (const auto& [user, count] : gpus_per_user) user_gpus.add({{"user", user}}, count);

  struct Waiting {
    int requests = 0;
    unsigned gpus = 0;
    double longest = 0;
  };
  std::map<std::string, Waiting> waiting;
  for (const auto& e : queue.entries) {
    Waiting& w = waiting[e.user];
    ++w.requests;
    w.gpus += e.gpus_requested;
    w.longest = std::max(w.longest, now - unix_seconds(e.waiting_since));
  }
  queue_length.add({}, static_cast<double>(queue.entries.size()));
  for (const auto& [user, w] : waiting) {
    user_waiting.add({{"user", user}}, w.requests);
    user_gpus_wanted.add({{"user", user}}, w.gpus);
    user_wait.add({{"user", user}}, w.longest);
  }
  if (status.idle_after)
    idle_after.add({}, std::chrono::duration<double>(*status.idle_after).count());
  taken.add({}, now);

  std::string text;
  for (const Family* family : {&info,
                               &state,
                               &lease,
                               &held,
                               &utilization,
                               &memory_used,
                               &memory_total,
                               &power,
                               &shared_jobs,
                               &shared_reserved,
                               &shared_unreserved,
                               &lease_reserved,
                               &lease_over,
                               &idle,
                               &idle_seconds,
                               &intruders,
                               &intruder,
                               &user_gpus,
                               &queue_length,
                               &user_waiting,
                               &user_gpus_wanted,
                               &user_wait,
                               &idle_after,
                               &taken})
    text += family->text();
  if (lease_counts) text += lease_count_text(*lease_counts);
  return text;
}

}  // namespace gpulock
