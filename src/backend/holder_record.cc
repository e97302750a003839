// Serialising holder records, and reading them back as untrusted input: a fast reader for the
// form gpulock writes, and nlohmann's full parser for anything else, with the same checks.
#include "backend/holder_record.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/canonical_json_reader.h"
#include "util/json_members.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using namespace json_members;
using nlohmann::json;

constexpr int kRecordSchema = 1;
constexpr std::size_t kMaxGpusInRecord = 64;
constexpr std::size_t kMaxMembers = 8;

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
  if (r.session > 0) out += fmt::format(R"(,"session":{})", r.session);
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

namespace {

// A record's fields as read, before they are checked: what both readers below produce.
struct RecordFields {
  std::string_view lease_id, user, host, boot_id, kind, command, label;
  std::uint64_t uid = 0;
  ProcessId holder;
  std::vector<ProcessId> members;
  double started_at = 0;
  std::vector<std::string_view> gpus;
  std::optional<std::uint64_t> memory_bytes;
  std::optional<std::uint64_t> session;
};

constexpr std::uint64_t kMaxPid = 4194304;

// Bounds, names and ranges: the same checks whichever reader read the fields.
std::optional<HolderRecord> checked_record(const RecordFields& f) {
  HolderRecord record;
  if (f.lease_id.size() > 16 || !is_lease_id(f.lease_id)) return std::nullopt;
  record.lease_id = std::string(f.lease_id);
  if (f.uid > 0xFFFFFFFFu) return std::nullopt;
  record.uid = static_cast<uid_t>(f.uid);
  if (f.user.size() > 64 || f.host.size() > 255 || f.boot_id.size() > 64 || f.kind.size() > 16 ||
      f.command.size() > 1024 * 4 || f.label.size() > 256 * 4)
    return std::nullopt;
  record.user = sanitize_for_display(f.user, 64);
  record.host = sanitize_for_display(f.host, 255);
  record.boot_id = std::string(f.boot_id);
  record.command = sanitize_for_display(f.command, 1024);
  record.label = sanitize_for_display(f.label, 256);
  if (f.kind == "process") {
    record.kind = HolderKind::kProcess;
  } else if (f.kind == "run") {
    record.kind = HolderKind::kRun;
  } else if (f.kind == "detached") {
    record.kind = HolderKind::kDetached;
  } else {
    return std::nullopt;
  }
  const auto valid_pid = [](const ProcessId& p) { return p.pid > 0; };
  if (!valid_pid(f.holder) || f.members.size() > kMaxMembers) return std::nullopt;
  record.holder = f.holder;
  for (const ProcessId& member : f.members)
    if (!valid_pid(member)) return std::nullopt;
  record.members = f.members;
  // Beyond the year 5000 is nonsense, and would overflow the clocks readers convert it to.
  if (!std::isfinite(f.started_at) || f.started_at < 0 || f.started_at > 9e9) return std::nullopt;
  record.started_at = f.started_at;
  if (f.gpus.size() > kMaxGpusInRecord) return std::nullopt;
  for (std::string_view g : f.gpus) {
    if (g.size() > 96) return std::nullopt;
    record.gpus.push_back(sanitize_for_display(g, 96));
  }
  record.memory_bytes = f.memory_bytes;
  if (f.session) {
    if (*f.session == 0 || *f.session > kMaxPid) return std::nullopt;
    record.session = static_cast<pid_t>(*f.session);
  }
  return record;
}

// pid 0 stands for "not a valid process" (checked_record refuses it).
ProcessId process_from_json(const json& j) {
  if (!j.is_object() || !j.contains("pid") || !j.contains("start")) return {};
  if (!j["pid"].is_number_unsigned() || !j["start"].is_number_unsigned()) return {};
  const auto pid = j["pid"].get<std::uint64_t>();
  if (pid == 0 || pid > kMaxPid) return {};
  return ProcessId{static_cast<pid_t>(pid), j["start"].get<std::uint64_t>()};
}

// Any JSON, read with nlohmann's full parser.
std::optional<HolderRecord> read_with_full_parser(std::string_view bytes) {
  const json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  if (!j.contains("schema") || !j["schema"].is_number_integer() ||
      j["schema"].get<int>() != kRecordSchema)
    return std::nullopt;
  RecordFields f;
  if (!required(j, "lease_id", string_member, f.lease_id) ||
      !required(j, "user", string_member, f.user) || !required(j, "host", string_member, f.host) ||
      !required(j, "boot_id", string_member, f.boot_id) ||
      !required(j, "kind", string_member, f.kind) ||
      !required(j, "command", string_member, f.command) ||
      !required(j, "label", string_member, f.label) ||
      !required(j, "uid", unsigned_member, f.uid) ||
      !required(j, "started_at", number_member, f.started_at) ||
      !optional(j, "memory_bytes", unsigned_member, f.memory_bytes) ||
      !optional(j, "session", unsigned_member, f.session))
    return std::nullopt;
  if (!j.contains("holder")) return std::nullopt;
  f.holder = process_from_json(j["holder"]);
  if (!j.contains("members") || !j["members"].is_array() || j["members"].size() > kMaxMembers)
    return std::nullopt;
  for (const auto& m : j["members"]) f.members.push_back(process_from_json(m));
  if (!j.contains("gpus") || !j["gpus"].is_array() || j["gpus"].size() > kMaxGpusInRecord)
    return std::nullopt;
  for (const auto& g : j["gpus"]) {
    if (!g.is_string()) return std::nullopt;
    f.gpus.push_back(g.get_ref<const std::string&>());
  }
  return checked_record(f);
}

// A holder or member process, `{"pid":P,"start":S}`; pid 0 for one that is not valid.
std::optional<ProcessId> read_process(CanonicalJsonReader& in) {
  if (!in.literal(R"({"pid":)")) return std::nullopt;
  const auto pid = in.unsigned_number();
  if (!pid || !in.literal(R"(,"start":)")) return std::nullopt;
  const auto start = in.unsigned_number();
  if (!start || !in.literal("}")) return std::nullopt;
  if (*pid == 0 || *pid > kMaxPid) return ProcessId{};
  return ProcessId{static_cast<pid_t>(*pid), *start};
}

// The record's fields, or nullopt where the text is not in record_json()'s exact form (its keys
// in its order, numbers as fmt writes them): read without building a JSON document, a tenth of
// the full parser's work, on the path of every plan that reads who holds which GPU. On what it
// accepts it reads what the full parser would (tests/unit/holder_record_test.cc checks both on
// every record and on mutations of them).
std::optional<RecordFields> read_canonical(std::string_view bytes) {
  CanonicalJsonReader in(bytes);
  RecordFields f;
  if (!in.literal(R"({"schema":1)") || !in.member(R"(,"lease_id":)", f.lease_id) ||
      !in.member(R"(,"uid":)", f.uid) || !in.member(R"(,"user":)", f.user) ||
      !in.member(R"(,"host":)", f.host) || !in.member(R"(,"boot_id":)", f.boot_id) ||
      !in.member(R"(,"kind":)", f.kind) || !in.literal(R"(,"holder":)"))
    return std::nullopt;
  const auto holder = read_process(in);
  if (!holder || !in.literal(R"(,"members":[)")) return std::nullopt;
  f.holder = *holder;
  if (!in.literal("]")) {
    do {
      const auto member = read_process(in);
      if (!member || f.members.size() == kMaxMembers) return std::nullopt;
      f.members.push_back(*member);
    } while (in.literal(","));
    if (!in.literal("]")) return std::nullopt;
  }
  if (!in.member(R"(,"command":)", f.command) || !in.member(R"(,"label":)", f.label) ||
      !in.member(R"(,"started_at":)", f.started_at) || !in.literal(R"(,"gpus":[)"))
    return std::nullopt;
  if (!in.literal("]")) {
    do {
      const auto gpu = in.string();
      if (!gpu || f.gpus.size() == kMaxGpusInRecord) return std::nullopt;
      f.gpus.push_back(*gpu);
    } while (in.literal(","));
    if (!in.literal("]")) return std::nullopt;
  }
  if (!in.optional_member(R"(,"memory_bytes":)", f.memory_bytes) ||
      !in.optional_member(R"(,"session":)", f.session) || !in.literal("}") || !in.at_end())
    return std::nullopt;
  return f;
}

// Trailing JSON whitespace changes nothing; a record on disk is a few hundred bytes of JSON
// padded with spaces to 4 KiB, which the full parser would read a character at a time.
std::string_view without_padding(std::string_view bytes) {
  constexpr std::uint64_t kEightSpaces = 0x2020202020202020;
  while (true) {
    std::uint64_t last8 = 0;
    if (bytes.size() >= 8) std::memcpy(&last8, bytes.data() + bytes.size() - 8, 8);
    if (last8 == kEightSpaces) {
      bytes.remove_suffix(8);  // the padding, eight at a time
    } else if (!bytes.empty() && (bytes.back() == ' ' || bytes.back() == '\n' ||
                                  bytes.back() == '\t' || bytes.back() == '\r')) {
      bytes.remove_suffix(1);
    } else {
      return bytes;
    }
  }
}

}  // namespace

std::optional<HolderRecord> parse_holder_record(std::string_view bytes) {
  if (bytes.size() > kHolderRecordSize) return std::nullopt;
  bytes = without_padding(bytes);
  if (const auto fields = read_canonical(bytes)) return checked_record(*fields);
  return read_with_full_parser(bytes);
}

std::optional<HolderRecord> parse_holder_record_with_full_parser(std::string_view bytes) {
  if (bytes.size() > kHolderRecordSize) return std::nullopt;
  return read_with_full_parser(without_padding(bytes));
}

bool holder_record_is_canonical(std::string_view bytes) {
  return bytes.size() <= kHolderRecordSize && read_canonical(without_padding(bytes)).has_value();
}

}  // namespace gpulock
