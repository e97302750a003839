// Serialising tickets as JSON, and reading them back as untrusted input.
#include "queue/ticket.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr int kTicketSchema = 1;
constexpr std::size_t kMaxCandidates = 1024;
constexpr std::size_t kMaxUuidLength = 96;
constexpr std::size_t kMaxTextLength = 1024;
constexpr std::uint64_t kMaxSeq = std::uint64_t{1} << 62;
constexpr double kMaxTime = 9e9;  // seconds since the epoch: the year 2255

bool unsigned_field(const json& j, const char* key, std::uint64_t max, std::uint64_t& out) {
  if (!j.contains(key) || !j[key].is_number_unsigned()) return false;
  out = j[key].get<std::uint64_t>();
  return out <= max;
}

bool string_field(const json& j, const char* key, std::size_t max, std::string& out) {
  if (!j.contains(key) || !j[key].is_string()) return false;
  out = j[key].get<std::string>();
  return out.size() <= max;
}

}  // namespace

std::string serialize_ticket(const Ticket& t) {
  json j;
  j["schema"] = kTicketSchema;
  j["id"] = t.id;
  j["seq"] = t.seq;
  j["uid"] = t.uid;
  j["user"] = sanitize_for_display(t.user, 64);
  j["pid"] = t.process.pid;
  j["pid_start"] = t.process.start_ticks;
  j["enqueued_at"] = t.enqueued_at;
  j["priority"] = priority_name(t.priority);
  j["needed"] = t.needed;
  j["named_gpus"] = t.named_gpus;
  if (t.entered_over_limit) j["over_limit"] = true;
  j["candidates"] = t.candidates;
  if (t.min_free_memory_bytes) j["min_free_memory"] = *t.min_free_memory_bytes;
  if (t.max_utilization_percent) j["max_utilization"] = *t.max_utilization_percent;
  if (t.max_power_watts) j["max_power"] = *t.max_power_watts;
  j["allow_foreign"] = t.allow_foreign_processes;
  j["label"] = sanitize_for_display(t.label, kMaxTextLength);
  j["command"] = sanitize_for_display(t.command, kMaxTextLength);
  if (t.shared_units > 0) j["shared_units"] = t.shared_units;
  if (t.shared_slots > 0) j["shared_slots"] = t.shared_slots;
  if (t.spread) j["spread"] = true;
  return j.dump() + "\n";
}

std::optional<Ticket> parse_ticket(std::string_view bytes) {
  if (bytes.size() > kMaxTicketSize) return std::nullopt;
  const json j = json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  if (!j.contains("schema") || j["schema"] != kTicketSchema) return std::nullopt;

  Ticket t;
  std::uint64_t number = 0;
  std::string id;
  if (!string_field(j, "id", 64, id) || !is_lease_id(id)) return std::nullopt;
  t.id = id;
  // Bounded so that the next seq (highest + 1) can never wrap, whatever is planted.
  if (!unsigned_field(j, "seq", kMaxSeq, t.seq)) return std::nullopt;
  if (!unsigned_field(j, "uid", UINT32_MAX - 1, number)) return std::nullopt;
  t.uid = static_cast<uid_t>(number);
  if (!string_field(j, "user", 64, t.user)) return std::nullopt;
  if (!unsigned_field(j, "pid", 4194304, number) || number == 0) return std::nullopt;
  t.process.pid = static_cast<pid_t>(number);
  if (!unsigned_field(j, "pid_start", UINT64_MAX, t.process.start_ticks)) return std::nullopt;
  if (!j.contains("enqueued_at") || !j["enqueued_at"].is_number()) return std::nullopt;
  t.enqueued_at = j["enqueued_at"].get<double>();
  // Within what the system clock can represent (until about 2262): shown as a time point.
  if (!std::isfinite(t.enqueued_at) || t.enqueued_at < 0 || t.enqueued_at > kMaxTime)
    return std::nullopt;
  std::string priority;
  if (!string_field(j, "priority", 16, priority)) return std::nullopt;
  if (priority == "low") {
    t.priority = Priority::kLow;
  } else if (priority != "normal") {
    return std::nullopt;
  }
  if (!unsigned_field(j, "needed", kMaxCandidates, number) || number == 0) return std::nullopt;
  t.needed = static_cast<unsigned>(number);
  if (!j.contains("named_gpus") || !j["named_gpus"].is_boolean()) return std::nullopt;
  t.named_gpus = j["named_gpus"].get<bool>();
  if (j.contains("over_limit")) {
    if (!j["over_limit"].is_boolean()) return std::nullopt;
    t.entered_over_limit = j["over_limit"].get<bool>();
  }
  if (!j.contains("candidates") || !j["candidates"].is_array() ||
      j["candidates"].size() > kMaxCandidates)
    return std::nullopt;
  for (const auto& uuid : j["candidates"]) {
    if (!uuid.is_string() || uuid.get_ref<const std::string&>().empty() ||
        uuid.get_ref<const std::string&>().size() > kMaxUuidLength)
      return std::nullopt;
    t.candidates.push_back(uuid.get<std::string>());
  }
  if (t.named_gpus && t.candidates.size() != t.needed) return std::nullopt;
  if (j.contains("min_free_memory")) {
    if (!unsigned_field(j, "min_free_memory", UINT64_MAX, number)) return std::nullopt;
    t.min_free_memory_bytes = number;
  }
  if (j.contains("max_utilization")) {
    if (!unsigned_field(j, "max_utilization", 100, number)) return std::nullopt;
    t.max_utilization_percent = static_cast<unsigned>(number);
  }
  if (j.contains("max_power")) {
    if (!j["max_power"].is_number()) return std::nullopt;
    const double watts = j["max_power"].get<double>();
    if (!std::isfinite(watts) || watts < 0) return std::nullopt;
    t.max_power_watts = watts;
  }
  if (!j.contains("allow_foreign") || !j["allow_foreign"].is_boolean()) return std::nullopt;
  t.allow_foreign_processes = j["allow_foreign"].get<bool>();
  if (!string_field(j, "label", kMaxTextLength, t.label)) return std::nullopt;
  if (!string_field(j, "command", kMaxTextLength, t.command)) return std::nullopt;
  if (j.contains("shared_units")) {
    if (!unsigned_field(j, "shared_units", kMaxSharedUnits, number) || number == 0)
      return std::nullopt;
    t.shared_units = static_cast<std::uint32_t>(number);
  }
  if (j.contains("shared_slots")) {
    if (!unsigned_field(j, "shared_slots", kMaxSharedUnits, number) || number == 0)
      return std::nullopt;
    t.shared_slots = static_cast<std::uint32_t>(number);
  }
  if (j.contains("spread")) {
    if (!j["spread"].is_boolean()) return std::nullopt;
    t.spread = j["spread"].get<bool>();
  }
  // Shown to people: whatever was planted must not reach a terminal as escape sequences.
  t.user = sanitize_for_display(t.user, 64);
  t.label = sanitize_for_display(t.label, kMaxTextLength);
  t.command = sanitize_for_display(t.command, kMaxTextLength);
  return t;
}

}  // namespace gpulock
