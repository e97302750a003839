// Serialising holder records, and reading them back as untrusted input.
#include "local/holder_record.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr int kRecordSchema = 1;
constexpr std::size_t kMaxGpusInRecord = 64;
constexpr std::size_t kMaxMembers = 8;

json process_to_json(const ProcessId& p) {
  return json{{"pid", p.pid}, {"start", p.start_ticks}};
}

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

std::string serialize_holder_record(const HolderRecord& record) {
  json members = json::array();
  for (std::size_t i = 0; i < record.members.size() && i < kMaxMembers; ++i)
    members.push_back(process_to_json(record.members[i]));
  json gpus = json::array();
  for (std::size_t i = 0; i < record.gpus.size() && i < kMaxGpusInRecord; ++i)
    gpus.push_back(sanitize_for_display(record.gpus[i], 96));
  // Text is made valid, control-free UTF-8 within the reader's bounds first, so JSON escaping
  // can only grow it by quotes and backslashes, and what is written is what a reader accepts.
  json j{{"schema", kRecordSchema},
         {"lease_id", record.lease_id},
         {"uid", record.uid},
         {"user", sanitize_for_display(record.user, 64)},
         {"host", sanitize_for_display(record.host, 255)},
         {"boot_id", sanitize_for_display(record.boot_id, 64)},
         {"kind", holder_kind_name(record.kind)},
         {"holder", process_to_json(record.holder)},
         {"members", members},
         {"command", sanitize_for_display(record.command, 1024)},
         {"label", sanitize_for_display(record.label, 256)},
         {"started_at", record.started_at},
         {"gpus", gpus}};
  std::string text = j.dump();
  // Too long (very many GPUs, or text full of quotes): give up detail until it fits.
  for (const std::size_t command_length : {128, 0}) {
    if (text.size() < kHolderRecordSize) break;
    j["command"] = sanitize_for_display(record.command, command_length);
    j["label"] = sanitize_for_display(record.label, command_length / 2);
    text = j.dump();
  }
  while (text.size() >= kHolderRecordSize && !j["gpus"].empty()) {
    j["gpus"].erase(j["gpus"].size() - 1);
    text = j.dump();
  }
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
  if (!std::isfinite(record.started_at) || record.started_at < 0 || record.started_at > 1e11)
    return std::nullopt;
  if (!j.contains("gpus") || !j["gpus"].is_array() || j["gpus"].size() > kMaxGpusInRecord)
    return std::nullopt;
  for (const auto& g : j["gpus"]) {
    if (!g.is_string() || g.get_ref<const std::string&>().size() > 96) return std::nullopt;
    record.gpus.push_back(sanitize_for_display(g.get<std::string>(), 96));
  }
  return record;
}

}  // namespace gpulock
