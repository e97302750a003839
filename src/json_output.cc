// JSON rendering of status, the queue and the device inventory (schema in docs/json.md),
// written as it goes (util/json_writer.h): a 100-host pool's status is some 700 KB, which a
// document built in memory first made four times slower to print than the table. Each object's
// members are written in key order, as the schema's documents have always listed them.
#include "gpulock/json_output.hpp"
#include "gpulock/monitor.hpp"
#include "util/json_writer.h"
#include "util/unix_time.h"

#include <algorithm>

namespace gpulock {
namespace {

void nullable(JsonWriter& w, std::string_view key, const std::string& text) {
  w.key(key);
  if (text.empty())
    w.null();
  else
    w.value(text);
}

// The device's own members from "compute_mode" to "index" and from "memory_free_bytes" to
// "mig_index"; the callers interleave theirs.
void device_head(JsonWriter& w, const Device& d) {
  w.member("compute_mode", compute_mode_name(d.compute_mode));
  w.member("display_index", d.display_index());
}
void device_memory(JsonWriter& w, const Device& d) {
  w.member("memory_free_bytes", d.memory_free_bytes);
  w.member("memory_total_bytes", d.memory_total_bytes);
  w.member("memory_used_bytes", d.memory_used_bytes);
  w.member("mig_enabled", d.mig_enabled);
  w.member("mig_index", d.mig_index);
  w.member("name", d.name);
}
// From "parent_uuid" to "power_limit_watts".
void device_middle(JsonWriter& w, const Device& d) {
  nullable(w, "parent_uuid", d.parent_uuid);
  w.member("pci_bus_id", d.pci_bus_id);
  w.member("power_draw_watts", d.power_draw_watts);
  w.member("power_limit_watts", d.power_limit_watts);
}
void device_tail(JsonWriter& w, const Device& d) {
  w.member("utilization_percent", d.utilization_percent);
  w.member("uuid", d.uuid);
}

// What a lease's holder record says, as both exclusive holders and shared leases show it, in
// three runs of keys between which each kind puts members of its own.
void lease_head(JsonWriter& w, const HolderInfo& h) {
  w.member("command", h.command);
  w.member("gpus", h.gpus);
}
void lease_middle(JsonWriter& w, const HolderInfo& h) {
  w.member("kind", h.kind);
  w.member("label", h.label);
  w.member("lease_id", h.lease_id);
  w.member("member_pids", h.member_pids);
}
void lease_tail(JsonWriter& w, const HolderInfo& h) {
  w.member("pid", h.pid);
  w.member("pid_alive", h.holder_alive);
  w.member("session", h.session);
  w.member("started_at", unix_seconds(h.started_at));
  w.member("uid", h.uid);
  w.member("user", h.user);
}

void holder_json(JsonWriter& w, const HolderInfo& h, double now) {
  w.begin_object();
  lease_head(w, h);
  w.member("held_seconds", std::max(0.0, now - unix_seconds(h.started_at)));
  w.member("host", h.host);
  lease_middle(w, h);
  if (h.memory_bytes) w.member("memory_bytes", *h.memory_bytes);
  lease_tail(w, h);
  w.end_object();
}

void shared_lease_json(JsonWriter& w, const HolderInfo& h) {
  w.begin_object();
  lease_head(w, h);
  lease_middle(w, h);
  w.member("memory_bytes", h.memory_bytes.value_or(0));
  w.member("memory_used_bytes", h.memory_used_bytes);
  w.member("over_reservation", h.over_reservation);
  lease_tail(w, h);
  w.end_object();
}

void queue_entry_json(JsonWriter& w, const QueueEntry& e) {
  w.begin_object();
  w.member("blocked_by", e.blocked_by);
  w.member("command", e.command);
  w.member("gpus_named", e.gpus_named);
  w.member("gpus_requested", e.gpus_requested);
  w.member("label", e.label);
  w.member("memory_bytes", e.memory_bytes);
  w.member("pid", e.pid);
  w.member("position", e.position);
  w.member("priority", priority_name(e.priority));
  w.member("reserved_gpus", e.reserved_gpus);
  w.member("slots", e.slots);
  w.member("standing", queue_standing_name(e.standing));
  w.member("ticket_id", e.ticket_id);
  w.member("uid", e.uid);
  w.member("user", e.user);
  w.member("waiting_since", unix_seconds(e.waiting_since));
  w.end_object();
}

// What shared leases hold of a GPU's memory; with the leases themselves in a status.
void shared_memory_json(JsonWriter& w, const GpuStatus& g, bool with_leases) {
  const std::uint64_t total = g.device.memory_total_bytes.value_or(0);
  const std::uint64_t kept = g.shared->reserved_bytes + g.shared->reserve_bytes;
  w.begin_object();
  w.member("admin_reserve_bytes", g.shared->reserve_bytes);
  w.member("jobs", g.shared->jobs);
  if (with_leases) {
    w.key("leases");
    w.begin_array();
    for (const HolderInfo& h : g.shared->leases) shared_lease_json(w, h);
    w.end_array();
  }
  w.member("reserved_bytes", g.shared->reserved_bytes);
  w.member("unreserved_bytes", total > kept ? total - kept : 0);
  w.end_object();
}

void device_processes(JsonWriter& w, const Device& d) {
  w.key("processes");
  w.begin_array();
  for (const auto& p : d.processes) {
    w.begin_object();
    w.member("pid", p.pid);
    w.member("used_memory_bytes", p.used_memory_bytes);
    w.end_object();
  }
  w.end_array();
}

void status_gpu_json(JsonWriter& w, const GpuStatus& g, const PoolStatus& status, double now) {
  const Device& d = g.device;
  w.begin_object();
  device_head(w, d);
  w.key("holder");
  if (g.holder)
    holder_json(w, *g.holder, now);
  else
    w.null();
  w.member("host", g.host.empty() ? status.host : g.host);
  w.member("idle", g.idle);
  std::optional<double> idle_since;
  if (g.idle_since) idle_since = unix_seconds(*g.idle_since);
  w.member("idle_seconds",
           idle_since ? std::optional(std::max(0.0, now - *idle_since)) : std::nullopt);
  w.member("idle_since", idle_since);
  w.member("index", d.index);
  w.key("lease_id");
  if (g.holder)
    w.value(g.holder->lease_id);
  else
    w.null();
  device_memory(w, d);
  nullable(w, "note", g.note);
  device_middle(w, d);
  w.key("processes");
  w.begin_array();
  for (const auto& p : g.processes) {
    w.begin_object();
    w.member("foreign", p.foreign);
    w.member("pid", p.pid);
    w.member("used_memory_bytes", p.used_memory_bytes);
    nullable(w, "user", p.user);
    w.end_object();
  }
  w.end_array();
  w.key("reserved_for");
  if (g.reserved_for)
    queue_entry_json(w, *g.reserved_for);
  else
    w.null();
  w.key("shared");
  if (g.shared)
    shared_memory_json(w, g, /*with_leases=*/true);
  else
    w.null();
  w.member("state", gpu_state_name(g.state));
  device_tail(w, d);
  w.end_object();
}

}  // namespace

std::string status_to_json(const PoolStatus& status) {
  std::string out;
  out.reserve(1024 + status.gpus.size() * 1536);
  JsonWriter w(out);
  const double now = unix_seconds(status.taken_at);
  w.begin_object();
  w.member("backend", status.backend);
  nullable(w, "backend_location", status.backend_location);
  w.member("device_source", status.device_source);
  w.key("gpus");
  w.begin_array();
  for (const auto& g : status.gpus) status_gpu_json(w, g, status, now);
  w.end_array();
  w.member("host", status.host);
  w.member("idle_after_seconds",
           status.idle_after ? std::optional(status.idle_after->count()) : std::nullopt);
  w.key("intruders");
  w.begin_array();
  for (const auto& i : intruders_of(status)) {
    w.begin_object();
    w.member("gpu", i.gpu);
    w.member("holder_user", i.holder_user);
    w.member("host", i.host);
    w.member("lease_id", i.lease_id);
    w.member("pid", i.pid);
    w.member("used_memory_bytes", i.used_memory_bytes);
    nullable(w, "user", i.user);
    w.member("uuid", i.gpu_uuid);
    w.end_object();
  }
  w.end_array();
  nullable(w, "lock_dir", status.lock_dir);
  nullable(w, "pool", status.pool);
  w.key("queue");
  w.begin_object();
  w.member("length", status.queue_length);
  w.member("policy", status.queue_policy);
  w.end_object();
  w.member("schema_version", kJsonSchemaVersion);
  w.member("simulated", status.simulated);
  w.member("spans_hosts", status.spans_hosts);
  w.member("taken_at", now);
  w.member("warnings", status.warnings);
  w.end_object();
  return out;
}

std::string queue_to_json(const QueueStatus& queue) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  nullable(w, "config", queue.config_source);
  w.member("policy", queue.policy);
  w.member("schema_version", kJsonSchemaVersion);
  w.key("waiting");
  w.begin_array();
  for (const auto& e : queue.entries) queue_entry_json(w, e);
  w.end_array();
  w.member("warnings", queue.warnings);
  w.end_object();
  return out;
}

std::string devices_to_json(const std::vector<Device>& devices, const std::string& device_source,
                            bool simulated, const PoolStatus* leases) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  w.member("device_source", device_source);
  w.key("gpus");
  w.begin_array();
  for (const auto& d : devices) {
    // The GPU's lease state and what shared leases hold of it, from the pool's view (null when
    // not known). When several entries have the UUID: the last one's state, and the last
    // shared use among them.
    const GpuStatus* seen = nullptr;
    const GpuStatus* shared = nullptr;
    if (leases)
      for (const GpuStatus& g : leases->gpus)
        if (g.device.uuid == d.uuid) {
          seen = &g;
          if (g.shared) shared = &g;
        }
    w.begin_object();
    device_head(w, d);
    w.member("index", d.index);
    device_memory(w, d);
    device_middle(w, d);
    device_processes(w, d);
    w.key("shared");
    if (shared)
      shared_memory_json(w, *shared, /*with_leases=*/false);
    else
      w.null();
    w.key("state");
    if (seen)
      w.value(gpu_state_name(seen->state));
    else
      w.null();
    device_tail(w, d);
    w.end_object();
  }
  w.end_array();
  w.member("schema_version", kJsonSchemaVersion);
  w.member("simulated", simulated);
  w.end_object();
  return out;
}

}  // namespace gpulock
