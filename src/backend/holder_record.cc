// Serialising holder records, and reading them back as untrusted input.
#include "backend/holder_record.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr int kRecordSchema = 1;
constexpr std::size_t kMaxGpusInRecord = 64;
constexpr std::size_t kMaxMembers = 8;

std::optional<ProcessId> process_from_json(const json& j) {
  if (!j.is_object() || !j.contains("pid") || !j.contains("start")) return std::nullopt;
  if (!j["pid"].is_number_unsigned() || !j["start"].is_number_unsigned()) return std::nullopt;
  const auto pid = j["pid"].get<std::uint64_t>();
  if (pid == 0 || pid > 4194304) return std::nullopt;
  return ProcessId{static_cast<pid_t>(pid), j["start"].get<std::uint64_t>()};
}

std::optional<std::string> bounded_string(const json& j, const char* key, std::size_t max) {
  if (!j.contains(key) || !j[key].is_string()) return std::nullopt;
  const auto& value = j[key].get_ref<const std::string&>();
  if (value.size() > max) return std::nullopt;
  return value;
}

}  // namespace

const char* holder_kind_name(HolderKind kind) noexcept {
  switch (kind) {
    case HolderKind::kProcess:
      return "process";
    case HolderKind::kRun:
      return "run";
    case HolderKind::kDetached:
      return "detached";
  }
  return "process";
}

namespace {

// Appends text as a JSON string. The text has been through sanitize_for_display(), so it is
// valid UTF-8 without control characters: only quotes and backslashes need escaping.
void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
}

void append_process(std::string& out, const ProcessId& p) {
  out += fmt::format(R"({{"pid":{},"start":{}}})", p.pid, p.start_ticks);
}

// The record as JSON with the given limits on free text and on the GPU list. Written by hand
// rather than through a JSON object: this is on every acquire's path, and the fields are few.
std::string record_json(const HolderRecord& r, std::size_t command_max, std::size_t label_max,
                        std::size_t gpus_max) {
  std::string out;
  out.reserve(1024);
  out += fmt::format(R"({{"schema":{},"lease_id":)", kRecordSchema);
  append_json_string(out, r.lease_id);
  out += fmt::format(R"(,"uid":{},"user":)", r.uid);
  append_json_string(out, sanitize_for_display(r.user, 64));
  out += ",\"host\":";
  append_json_string(out, sanitize_for_display(r.host, 255));
  out += ",\"boot_id\":";
  append_json_string(out, sanitize_for_display(r.boot_id, 64));
  out += ",\"kind\":";
  append_json_string(out, holder_kind_name(r.kind));
  out += ",\"holder\":";
  append_process(out, r.holder);
  out += ",\"members\":[";
  for (std::size_t i = 0; i < r.members.size() && i < kMaxMembers; ++i) {
    if (i > 0) out += ',';
    append_process(out, r.members[i]);
  }
  out += "],\"command\":";
  append_json_string(out, sanitize_for_display(r.command, command_max));
  out += ",\"label\":";
  append_json_string(out, sanitize_for_display(r.label, label_max));
  // Shortest text that reads back as the same double.
  out += fmt::format(R"(,"started_at":{},"gpus":[)", r.started_at);
  for (std::size_t i = 0; i < r.gpus.size() && i < std::min(gpus_max, kMaxGpusInRecord); ++i) {
    if (i > 0) out += ',';
    append_json_string(out, sanitize_for_display(r.gpus[i], 96));
  }
  out += ']';
  if (r.memory_bytes) out += fmt::format(R"(,"memory_bytes":{})", *r.memory_bytes);
  out += '}';
  return out;
}

}  // namespace

std::string holder_record_json(const HolderRecord& record) {
  std::string text = record_json(record, 1024, 256, kMaxGpusInRecord);
  // Too long (very many GPUs, or text full of quotes): give up detail until it fits.
  if (text.size() >= kHolderRecordSize) text = record_json(record, 128, 64, kMaxGpusInRecord);
  if (text.size() >= kHolderRecordSize) text = record_json(record, 0, 0, kMaxGpusInRecord);
  for (std::size_t gpus = kMaxGpusInRecord; text.size() >= kHolderRecordSize && gpus > 0;)
    text = record_json(record, 0, 0, --gpus);
  return text;
}

std::string serialize_holder_record(const HolderRecord& record) {
  std::string text = holder_record_json(record);
  text.resize(kHolderRecordSize - 1, ' ');
  text += '\n';
  return text;
}

std::optional<HolderRecord> parse_holder_record(std::string_view bytes) {
  if (bytes.size() > kHolderRecordSize) return std::nullopt;
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  if (!j.contains("schema") || !j["schema"].is_number_integer() ||
      j["schema"].get<int>() != kRecordSchema)
    return std::nullopt;

  HolderRecord record;
  const auto lease_id = bounded_string(j, "lease_id", 16);
  if (!lease_id || !is_lease_id(*lease_id)) return std::nullopt;
  record.lease_id = *lease_id;
  if (!j.contains("uid") || !j["uid"].is_number_unsigned() ||
      j["uid"].get<std::uint64_t>() > 0xFFFFFFFFu)
    return std::nullopt;
  record.uid = static_cast<uid_t>(j["uid"].get<std::uint64_t>());

  const auto user = bounded_string(j, "user", 64);
  const auto host = bounded_string(j, "host", 255);
  const auto boot = bounded_string(j, "boot_id", 64);
  const auto kind = bounded_string(j, "kind", 16);
  const auto command = bounded_string(j, "command", 1024 * 4);
  const auto label = bounded_string(j, "label", 256 * 4);
  if (!user || !host || !boot || !kind || !command || !label) return std::nullopt;
  record.user = sanitize_for_display(*user, 64);
  record.host = sanitize_for_display(*host, 255);
  record.boot_id = *boot;
  record.command = sanitize_for_display(*command, 1024);
  record.label = sanitize_for_display(*label, 256);
  if (*kind == "process") {
    record.kind = HolderKind::kProcess;
  } else if (*kind == "run") {
    record.kind = HolderKind::kRun;
  } else if (*kind == "detached") {
    record.kind = HolderKind::kDetached;
  } else {
    return std::nullopt;
  }

  const auto holder = j.contains("holder") ? process_from_json(j["holder"]) : std::nullopt;
  if (!holder) return std::nullopt;
  record.holder = *holder;
  if (!j.contains("members") || !j["members"].is_array() || j["members"].size() > kMaxMembers)
    return std::nullopt;
  for (const auto& m : j["members"]) {
    const auto member = process_from_json(m);
    if (!member) return std::nullopt;
    record.members.push_back(*member);
  }
  if (!j.contains("started_at") || !j["started_at"].is_number()) return std::nullopt;
  record.started_at = j["started_at"].get<double>();
  // Beyond the year 5000 is nonsense, and would overflow the clocks readers convert it to.
  if (!std::isfinite(record.started_at) || record.started_at < 0 || record.started_at > 9e9)
    return std::nullopt;
  if (!j.contains("gpus") || !j["gpus"].is_array() || j["gpus"].size() > kMaxGpusInRecord)
    return std::nullopt;
  for (const auto& g : j["gpus"]) {
    if (!g.is_string() || g.get_ref<const std::string&>().size() > 96) return std::nullopt;
    record.gpus.push_back(sanitize_for_display(g.get<std::string>(), 96));
  }
  if (j.contains("memory_bytes")) {
    if (!j["memory_bytes"].is_number_unsigned()) return std::nullopt;
    record.memory_bytes = j["memory_bytes"].get<std::uint64_t>();
  }
  return record;
}

}  // namespace gpulock
