// status_to_json, queue_to_json and devices_to_json, written as they go, give the same text as
// the documents built in memory that they replaced (kept below as the reference: the schema in
// docs/json.md as it was rendered), for a status with every kind of GPU, holder and queue entry.
#include "gpulock/json_output.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "gpulock/monitor.hpp"
#include "util/unix_time.h"

namespace gpulock {
namespace {

// ---- the reference: the earlier rendering, through nlohmann's document --------------------
namespace reference {
using nlohmann::json;

template <typename T>
json optional_value(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

json device_json(const Device& d) {
  json processes = json::array();
  for (const auto& p : d.processes)
    processes.push_back(
        {{"pid", p.pid}, {"used_memory_bytes", optional_value(p.used_memory_bytes)}});
  return {{"index", d.index},
          {"mig_index", optional_value(d.mig_index)},
          {"display_index", d.display_index()},
          {"uuid", d.uuid},
          {"parent_uuid", d.parent_uuid.empty() ? json(nullptr) : json(d.parent_uuid)},
          {"name", d.name},
          {"pci_bus_id", d.pci_bus_id},
          {"memory_total_bytes", optional_value(d.memory_total_bytes)},
          {"memory_used_bytes", optional_value(d.memory_used_bytes)},
          {"memory_free_bytes", optional_value(d.memory_free_bytes)},
          {"utilization_percent", optional_value(d.utilization_percent)},
          {"power_draw_watts", optional_value(d.power_draw_watts)},
          {"power_limit_watts", optional_value(d.power_limit_watts)},
          {"compute_mode", compute_mode_name(d.compute_mode)},
          {"mig_enabled", optional_value(d.mig_enabled)},
          {"processes", processes}};
}

// What a lease's holder record says, as both exclusive holders and shared leases show it.
json lease_json(const HolderInfo& h) {
  return {{"lease_id", h.lease_id},
          {"user", h.user},
          {"uid", h.uid},
          {"kind", h.kind},
          {"pid", h.pid},
          {"pid_alive", h.holder_alive},
          {"member_pids", h.member_pids},
          {"session", h.session ? json(*h.session) : json(nullptr)},
          {"command", h.command},
          {"label", h.label},
          {"started_at", unix_seconds(h.started_at)},
          {"gpus", h.gpus}};
}

json queue_entry_json(const QueueEntry& e) {
  return {{"position", e.position},
          {"ticket_id", e.ticket_id},
          {"user", e.user},
          {"uid", e.uid},
          {"pid", e.pid},
          {"priority", priority_name(e.priority)},
          {"gpus_requested", e.gpus_requested},
          {"memory_bytes", e.memory_bytes ? json(*e.memory_bytes) : json(nullptr)},
          {"slots", e.slots ? json(*e.slots) : json(nullptr)},
          {"gpus_named", e.gpus_named},
          {"label", e.label},
          {"command", e.command},
          {"waiting_since", unix_seconds(e.waiting_since)},
          {"standing", queue_standing_name(e.standing)},
          {"reserved_gpus", e.reserved_gpus},
          {"blocked_by", e.blocked_by}};
}

// What shared leases hold of a GPU's memory (without the leases themselves).
json shared_memory_json(const GpuStatus& g) {
  const std::uint64_t total = g.device.memory_total_bytes.value_or(0);
  const std::uint64_t kept = g.shared->reserved_bytes + g.shared->reserve_bytes;
  return {{"jobs", g.shared->jobs},
          {"reserved_bytes", g.shared->reserved_bytes},
          {"admin_reserve_bytes", g.shared->reserve_bytes},
          {"unreserved_bytes", total > kept ? total - kept : 0}};
}

std::string dump(const json& j) {
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string status_to_json(const PoolStatus& status) {
  json gpus = json::array();
  const double now = unix_seconds(status.taken_at);
  for (const auto& g : status.gpus) {
    json entry = device_json(g.device);
    entry["host"] = g.host.empty() ? status.host : g.host;
    entry["state"] = gpu_state_name(g.state);
    entry["note"] = g.note.empty() ? json(nullptr) : json(g.note);
    json processes = json::array();
    for (const auto& p : g.processes) {
      processes.push_back({{"pid", p.pid},
                           {"used_memory_bytes", optional_value(p.used_memory_bytes)},
                           {"user", p.user.empty() ? json(nullptr) : json(p.user)},
                           {"foreign", p.foreign}});
    }
    entry["processes"] = processes;
    entry["lease_id"] = nullptr;
    entry["holder"] = nullptr;
    entry["reserved_for"] = g.reserved_for ? queue_entry_json(*g.reserved_for) : json(nullptr);
    entry["idle"] = g.idle;
    entry["idle_since"] = g.idle_since ? json(unix_seconds(*g.idle_since)) : json(nullptr);
    entry["idle_seconds"] =
        g.idle_since ? json(std::max(0.0, now - unix_seconds(*g.idle_since))) : json(nullptr);
    if (g.holder) {
      const HolderInfo& h = *g.holder;
      entry["lease_id"] = h.lease_id;
      json holder = lease_json(h);
      holder["host"] = h.host;
      holder["held_seconds"] = std::max(0.0, now - unix_seconds(h.started_at));
      if (h.memory_bytes) holder["memory_bytes"] = *h.memory_bytes;
      entry["holder"] = std::move(holder);
    }
    entry["shared"] = nullptr;
    if (g.shared) {
      json leases = json::array();
      for (const HolderInfo& h : g.shared->leases) {
        json lease = lease_json(h);
        lease["memory_bytes"] = h.memory_bytes.value_or(0);
        lease["memory_used_bytes"] = h.memory_used_bytes;
        lease["over_reservation"] = h.over_reservation;
        leases.push_back(std::move(lease));
      }
      entry["shared"] = shared_memory_json(g);
      entry["shared"]["leases"] = std::move(leases);
    }
    gpus.push_back(std::move(entry));
  }
  json intruders = json::array();
  for (const auto& i : intruders_of(status))
    intruders.push_back({{"pid", i.pid},
                         {"user", i.user.empty() ? json(nullptr) : json(i.user)},
                         {"used_memory_bytes", optional_value(i.used_memory_bytes)},
                         {"host", i.host},
                         {"gpu", i.gpu},
                         {"uuid", i.gpu_uuid},
                         {"lease_id", i.lease_id},
                         {"holder_user", i.holder_user}});
  return dump(
      {{"schema_version", kJsonSchemaVersion},
       {"host", status.host},
       {"device_source", status.device_source},
       {"simulated", status.simulated},
       {"lock_dir", status.lock_dir.empty() ? json(nullptr) : json(status.lock_dir)},
       {"backend", status.backend},
       {"spans_hosts", status.spans_hosts},
       {"backend_location",
        status.backend_location.empty() ? json(nullptr) : json(status.backend_location)},
       {"pool", status.pool.empty() ? json(nullptr) : json(status.pool)},
       {"taken_at", now},
       {"warnings", status.warnings},
       {"queue", {{"length", status.queue_length}, {"policy", status.queue_policy}}},
       {"idle_after_seconds", status.idle_after ? json(status.idle_after->count()) : json(nullptr)},
       {"intruders", intruders},
       {"gpus", gpus}});
}

std::string queue_to_json(const QueueStatus& queue) {
  json entries = json::array();
  for (const auto& e : queue.entries) entries.push_back(queue_entry_json(e));
  return dump({{"schema_version", kJsonSchemaVersion},
               {"policy", queue.policy},
               {"config", queue.config_source.empty() ? json(nullptr) : json(queue.config_source)},
               {"warnings", queue.warnings},
               {"waiting", entries}});
}

std::string devices_to_json(const std::vector<Device>& devices, const std::string& device_source,
                            bool simulated, const PoolStatus* leases) {
  json list = json::array();
  for (const auto& d : devices) {
    json entry = device_json(d);
    // The GPU's lease state and what shared leases hold of it, from the pool's view (null when
    // not known).
    entry["state"] = nullptr;
    entry["shared"] = nullptr;
    if (leases) {
      for (const GpuStatus& g : leases->gpus) {
        if (g.device.uuid != d.uuid) continue;
        entry["state"] = gpu_state_name(g.state);
        if (g.shared) entry["shared"] = shared_memory_json(g);
      }
    }
    list.push_back(std::move(entry));
  }
  return dump({{"schema_version", kJsonSchemaVersion},
               {"device_source", device_source},
               {"simulated", simulated},
               {"gpus", list}});
}

}  // namespace reference

using Time = std::chrono::system_clock::time_point;
Time At(double seconds) {
  return Time(std::chrono::microseconds(static_cast<long long>(seconds * 1e6)));
}

Device TestDevice(unsigned index, const std::string& uuid) {
  Device d;
  d.index = index;
  d.uuid = uuid;
  d.name = "NVIDIA H100 80GB HBM3";
  d.pci_bus_id = "00000000:1" + std::to_string(index) + ":00.0";
  d.memory_total_bytes = 85520809984ULL;
  d.memory_used_bytes = 1048576ULL * (index + 1);
  d.memory_free_bytes = *d.memory_total_bytes - *d.memory_used_bytes;
  d.utilization_percent = 7 * index;
  d.power_draw_watts = 68.731 + index;
  d.power_limit_watts = 700.0;
  d.mig_enabled = false;
  d.processes = {{4242, 512ULL << 20}, {4243, std::nullopt}};
  return d;
}

HolderInfo TestHolder(const std::string& id, const std::string& user) {
  HolderInfo h;
  h.lease_id = id;
  h.uid = 1001;
  h.user = user;
  h.host = "node-b";
  h.kind = "run";
  h.pid = 777;
  h.holder_alive = true;
  h.member_pids = {778, 779};
  h.command = "python train.py --lr \"0.1\"\t\xe6";  // a quote, a tab, a broken UTF-8 byte
  h.label = "sweep/7";
  h.started_at = At(1764240000.124681);
  h.gpus = {"GPU-b", "GPU-c"};
  return h;
}

QueueEntry TestEntry() {
  QueueEntry e;
  e.position = 1;
  e.ticket_id = "t-01";
  e.uid = 1002;
  e.user = "bob";
  e.pid = 888;
  e.priority = Priority::kLow;
  e.gpus_requested = 2;
  e.memory_bytes = 20ULL << 30;
  e.label = "";
  e.command = "sh -c 'x'";
  e.waiting_since = At(1764239990.503117);
  e.standing = QueueStanding::kNext;
  e.reserved_gpus = {"GPU-a"};
  e.blocked_by = "GPU 1: leased by alice";
  return e;
}

PoolStatus TestStatus() {
  PoolStatus s;
  s.host = "node-a";
  s.device_source = "NVML";
  s.backend = "redis";
  s.backend_location = "redis://127.0.0.1:6379/0";
  s.pool = "lab";
  s.taken_at = At(1764240100.752347);
  s.warnings = {"queue entry x is unreadable", "ünïcode"};
  s.queue_length = 3;
  s.queue_policy = "fair-share";
  s.idle_after = std::chrono::seconds(600);

  GpuStatus free;
  free.device = TestDevice(0, "GPU-a");
  free.reserved_for = TestEntry();
  free.idle = true;
  free.idle_since = At(1764239000.000093);
  s.gpus.push_back(free);

  GpuStatus leased;
  leased.device = TestDevice(1, "GPU-b");
  leased.state = GpuState::kLeased;
  leased.host = "node-b";
  leased.note = "held past its TTL";
  leased.holder = TestHolder("lease-1", "alice");
  leased.holder->memory_bytes = 8ULL << 30;
  leased.processes = {{778, 1ULL << 30, "alice", false}, {999, std::nullopt, "", true}};
  s.gpus.push_back(leased);

  GpuStatus shared;
  shared.device = TestDevice(2, "GPU-c");
  shared.device.mig_index = 3;
  shared.device.parent_uuid = "GPU-parent";
  shared.device.power_draw_watts.reset();
  shared.state = GpuState::kLeased;
  shared.shared = SharedUse{2, 30ULL << 30, 4ULL << 30, {}};
  shared.shared->leases = {TestHolder("lease-2", "carol"), TestHolder("lease-3", "dan")};
  shared.shared->leases[0].memory_bytes = 10ULL << 30;
  shared.shared->leases[1].over_reservation = true;
  shared.shared->leases[1].memory_used_bytes = 21ULL << 30;
  shared.shared->leases[1].kind = "detached";  // held for a session (gpulock acquire)
  shared.shared->leases[1].session = 4242;
  s.gpus.push_back(shared);

  GpuStatus busy;
  busy.device = TestDevice(3, "GPU-d");
  busy.device.processes.clear();
  busy.device.memory_total_bytes.reset();
  busy.state = GpuState::kBusy;
  s.gpus.push_back(busy);
  return s;
}

TEST(JsonOutputTest, StatusIsTheTextTheDocumentGave) {
  const PoolStatus status = TestStatus();
  ASSERT_FALSE(intruders_of(status).empty());  // the intruders' list is exercised too
  EXPECT_EQ(status_to_json(status), reference::status_to_json(status));
  PoolStatus local = status;
  local.backend = "file";
  local.backend_location.clear();
  local.pool.clear();
  local.lock_dir = "/run/gpulock";
  local.idle_after.reset();
  local.warnings.clear();
  EXPECT_EQ(status_to_json(local), reference::status_to_json(local));
  EXPECT_EQ(status_to_json(PoolStatus{}), reference::status_to_json(PoolStatus{}));
}

TEST(JsonOutputTest, QueueAndDevicesAreTheTextTheDocumentGave) {
  QueueStatus queue;
  queue.policy = "fifo";
  queue.config_source = "/etc/gpulock/config.toml";
  queue.entries = {TestEntry(), TestEntry()};
  queue.entries[1].memory_bytes.reset();
  queue.entries[1].slots = 4;
  queue.entries[1].gpus_named = {"GPU-a", "GPU-b"};
  EXPECT_EQ(queue_to_json(queue), reference::queue_to_json(queue));
  EXPECT_EQ(queue_to_json(QueueStatus{}), reference::queue_to_json(QueueStatus{}));

  const PoolStatus status = TestStatus();
  std::vector<Device> devices;
  for (const GpuStatus& g : status.gpus) devices.push_back(g.device);
  devices.push_back(TestDevice(9, "GPU-unknown"));  // not in the status: state null
  EXPECT_EQ(devices_to_json(devices, "NVML", false, &status),
            reference::devices_to_json(devices, "NVML", false, &status));
  // A UUID that two entries of a pool's status have (two hosts list it): the last one's state,
  // and the last shared use among them.
  PoolStatus twice = status;
  twice.gpus.push_back(status.gpus[2]);
  twice.gpus.back().shared.reset();
  twice.gpus.back().state = GpuState::kBusy;
  EXPECT_EQ(devices_to_json(devices, "NVML", false, &twice),
            reference::devices_to_json(devices, "NVML", false, &twice));
  EXPECT_EQ(devices_to_json(devices, "4 simulated GPUs", true, nullptr),
            reference::devices_to_json(devices, "4 simulated GPUs", true, nullptr));
}

}  // namespace
}  // namespace gpulock
