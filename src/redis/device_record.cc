// Devices as JSON for the Redis backend's registration.
#include "redis/device_record.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "redis/flat_json.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxText = 256;
constexpr std::size_t kMaxProcesses = 1024;

template <typename T>
void put(json& j, const char* name, const std::optional<T>& value) {
  if (value) j[name] = *value;
}

// Field readers over both parsed forms, nlohmann's DOM and FlatJsonObject, with one meaning.
std::optional<std::string> text(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  std::string value = it->get<std::string>();
  if (value.size() > kMaxText) return std::nullopt;
  return value;
}

std::optional<std::string> text(const FlatJsonObject& j, const char* name) {
  const FlatJsonValue* v = j.find(name);
  if (!v || v->kind != FlatJsonValue::Kind::kString || v->text.size() > kMaxText)
    return std::nullopt;
  return std::string(v->text);
}

template <typename T>
std::optional<T> unsigned_number(const json& j, const char* name, T most) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_number_unsigned()) return std::nullopt;
  const auto value = it->get<std::uint64_t>();
  if (value > static_cast<std::uint64_t>(most)) return std::nullopt;
  return static_cast<T>(value);
}

template <typename T>
std::optional<T> unsigned_number(const FlatJsonObject& j, const char* name, T most) {
  const FlatJsonValue* v = j.find(name);
  if (!v || v->kind != FlatJsonValue::Kind::kUnsigned ||
      v->unsigned_number > static_cast<std::uint64_t>(most))
    return std::nullopt;
  return static_cast<T>(v->unsigned_number);
}

std::optional<double> real(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  const double value = it->get<double>();
  if (!(value >= 0 && value <= 1e7)) return std::nullopt;
  return value;
}

std::optional<double> real(const FlatJsonObject& j, const char* name) {
  const FlatJsonValue* v = j.find(name);
  if (!v || (v->kind != FlatJsonValue::Kind::kUnsigned && v->kind != FlatJsonValue::Kind::kReal))
    return std::nullopt;
  if (!(v->real >= 0 && v->real <= 1e7)) return std::nullopt;
  return v->real;
}

std::optional<bool> boolean(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

std::optional<bool> boolean(const FlatJsonObject& j, const char* name) {
  const FlatJsonValue* v = j.find(name);
  if (!v || v->kind != FlatJsonValue::Kind::kBool) return std::nullopt;
  return v->boolean;
}

// The elements of an array field, each an object; nullopt for anything else.
std::optional<std::vector<const json*>> objects(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_array()) return std::nullopt;
  std::vector<const json*> out;
  for (const auto& element : *it) out.push_back(&element);
  return out;
}

std::optional<std::vector<const FlatJsonObject*>> objects(const FlatJsonObject& j,
                                                          const char* name) {
  const FlatJsonValue* v = j.find(name);
  if (!v || v->kind != FlatJsonValue::Kind::kArray) return std::nullopt;
  std::vector<const FlatJsonObject*> out;
  for (const auto& element : v->objects) out.push_back(&element);
  return out;
}

bool is_object(const json& j) {
  return j.is_object();
}
bool is_object(const FlatJsonObject&) {
  return true;
}

ComputeMode compute_mode_from(const std::string& name) {
  for (const ComputeMode mode : {ComputeMode::kDefault, ComputeMode::kExclusiveThread,
                                 ComputeMode::kProhibited, ComputeMode::kExclusiveProcess})
    if (name == compute_mode_name(mode)) return mode;
  return ComputeMode::kUnknown;
}

}  // namespace

std::string device_static_json(const Device& d) {
  json j = {{"index", d.index},
            {"uuid", d.uuid},
            {"name", d.name},
            {"pci_bus_id", d.pci_bus_id},
            {"parent_uuid", d.parent_uuid},
            {"compute_mode", compute_mode_name(d.compute_mode)}};
  put(j, "mig_index", d.mig_index);
  put(j, "memory_total", d.memory_total_bytes);
  put(j, "mig_enabled", d.mig_enabled);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string device_readings_json(const Device& d) {
  json j = json::object();
  put(j, "memory_used", d.memory_used_bytes);
  put(j, "memory_free", d.memory_free_bytes);
  put(j, "utilization", d.utilization_percent);
  put(j, "power_draw", d.power_draw_watts);
  put(j, "power_limit", d.power_limit_watts);
  j["processes_known"] = d.processes_known;
  json processes = json::array();
  for (const auto& p : d.processes) {
    json entry = {{"pid", p.pid}};
    put(entry, "used_memory", p.used_memory_bytes);
    processes.push_back(std::move(entry));
  }
  j["processes"] = std::move(processes);
  return j.dump();
}

namespace {

// The static part's fields, from either parsed form; nullopt if the identity is unusable.
template <typename Object>
std::optional<Device> static_part(const Object& s) {
  Device d;
  const auto index = unsigned_number<unsigned>(s, "index", 1u << 16);
  const auto uuid = text(s, "uuid");
  const auto name = text(s, "name");
  if (!index || !uuid || uuid->empty() || !name) return std::nullopt;
  d.index = *index;
  d.uuid = *uuid;
  d.name = *name;
  d.pci_bus_id = text(s, "pci_bus_id").value_or("");
  d.parent_uuid = text(s, "parent_uuid").value_or("");
  d.compute_mode = compute_mode_from(text(s, "compute_mode").value_or(""));
  d.mig_index = unsigned_number<unsigned>(s, "mig_index", 1u << 16);
  d.memory_total_bytes = unsigned_number<std::uint64_t>(s, "memory_total", UINT64_MAX);
  d.mig_enabled = boolean(s, "mig_enabled");
  return d;
}

// Readings: what is there and valid; the rest stays unknown.
template <typename Object>
void add_readings(const Object& r, Device& d) {
  d.memory_used_bytes = unsigned_number<std::uint64_t>(r, "memory_used", UINT64_MAX);
  d.memory_free_bytes = unsigned_number<std::uint64_t>(r, "memory_free", UINT64_MAX);
  d.utilization_percent = unsigned_number<unsigned>(r, "utilization", 100);
  d.power_draw_watts = real(r, "power_draw");
  d.power_limit_watts = real(r, "power_limit");
  const auto processes = objects(r, "processes");
  const auto known = boolean(r, "processes_known");
  if (processes && processes->size() <= kMaxProcesses && known) {
    d.processes_known = *known;
    for (const auto* p : *processes) {
      const auto pid =
          is_object(*p) ? unsigned_number<std::uint32_t>(*p, "pid", UINT32_MAX) : std::nullopt;
      if (!pid) {
        d.processes.clear();
        d.processes_known = false;
        return;
      }
      d.processes.push_back(
          GpuProcess{*pid, unsigned_number<std::uint64_t>(*p, "used_memory", UINT64_MAX)});
    }
  }
}

}  // namespace

std::optional<Device> parse_registered_device(std::string_view static_json,
                                              std::string_view readings_json) {
  // The flat reader first (what gpulock writes), nlohmann's full parser for what it declines.
  std::optional<Device> d;
  if (const auto s = parse_flat_json(static_json)) {
    d = static_part(*s);
  } else {
    const json s_dom = json::parse(static_json, nullptr, /*allow_exceptions=*/false);
    if (!s_dom.is_object()) return std::nullopt;
    d = static_part(s_dom);
  }
  if (!d) return std::nullopt;
  d->processes_known = false;
  if (const auto r = parse_flat_json(readings_json)) {
    add_readings(*r, *d);
  } else {
    const json r_dom = json::parse(readings_json, nullptr, /*allow_exceptions=*/false);
    if (r_dom.is_object()) add_readings(r_dom, *d);
  }
  return d;
}

}  // namespace gpulock
