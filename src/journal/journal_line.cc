// Journal records to and from checksummed lines of JSON.
#include "journal/journal_line.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "util/crc32.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxField = 1024;  // any one string read back
constexpr std::size_t kMaxGpus = 1024;
constexpr double kLatestTime = 32503680000.0;  // year 3000: times beyond are damage

json record_to_json(const JournalRecord& r) {
  if (r.kind == JournalRecord::Kind::kEnd)
    return {{"v", 1},
            {"event", "end"},
            {"lease_id", r.lease_id},
            {"time", r.time},
            {"how", lease_end_name(r.end)},
            {"inferred", r.inferred}};
  json gpus = json::array();
  for (const auto& gpu : r.gpus) gpus.push_back({{"uuid", gpu.uuid}, {"index", gpu.index}});
  return {{"v", 1},
          {"event", "start"},
          {"lease_id", r.lease_id},
          {"time", r.time},
          {"user", r.user},
          {"uid", r.uid},
          {"host", r.host},
          {"gpus", gpus},
          {"label", r.label},
          {"command", r.command},
          {"waited_seconds", r.waited_seconds}};
}

// Cuts on a UTF-8 character boundary.
std::string cut(const std::string& text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

bool read_string(const json& j, const char* key, std::string& out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return false;
  out = it->get<std::string>();
  return out.size() <= kMaxField;
}

bool read_time(const json& j, const char* key, double& out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  out = it->get<double>();
  return std::isfinite(out) && out >= 0 && out < kLatestTime;
}

}  // namespace

std::string journal_record_json(const JournalRecord& record) {
  std::string text = record_to_json(record).dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() + 10 <= kMaxJournalLine) return text;
  // Too long: the command and label are the only unbounded parts.
  JournalRecord shorter = record;
  shorter.command = cut(shorter.command, 512);
  shorter.label = cut(shorter.label, 256);
  text = record_to_json(shorter).dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() + 10 <= kMaxJournalLine) return text;
  shorter.command.clear();
  shorter.label = cut(shorter.label, 64);
  return record_to_json(shorter).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string journal_line(const JournalRecord& record) {
  const std::string body = journal_record_json(record);
  char checksum[16];
  std::snprintf(checksum, sizeof checksum, "%08x ", crc32(body));
  std::string line;
  line.reserve(body.size() + 10);
  line += checksum;
  line += body;
  line += '\n';
  return line;
}

std::optional<JournalRecord> parse_journal_record_json(std::string_view text, std::string* why) {
  const auto fail = [why](const char* what) -> std::optional<JournalRecord> {
    if (why) *why = what;
    return std::nullopt;
  };
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return fail("not a JSON object");
  const auto version = j.find("v");
  if (version == j.end() || !version->is_number_integer() || version->get<int>() != 1)
    return fail("unknown record version");
  JournalRecord r;
  std::string event;
  if (!read_string(j, "event", event)) return fail("no event");
  if (!read_string(j, "lease_id", r.lease_id) || r.lease_id.empty()) return fail("no lease id");
  if (!read_time(j, "time", r.time)) return fail("bad time");
  if (event == "end") {
    r.kind = JournalRecord::Kind::kEnd;
    std::string how;
    if (!read_string(j, "how", how)) return fail("no end reason");
    if (how == "released")
      r.end = LeaseEnd::kReleased;
    else if (how == "holder_died")
      r.end = LeaseEnd::kHolderDied;
    else if (how == "lost")
      r.end = LeaseEnd::kLost;
    else
      return fail("unknown end reason");
    const auto inferred = j.find("inferred");
    if (inferred != j.end()) {
      if (!inferred->is_boolean()) return fail("bad inferred flag");
      r.inferred = inferred->get<bool>();
    }
    return r;
  }
  if (event != "start") return fail("unknown event");
  r.kind = JournalRecord::Kind::kStart;
  if (!read_string(j, "user", r.user) || !read_string(j, "host", r.host) ||
      !read_string(j, "label", r.label) || !read_string(j, "command", r.command))
    return fail("missing user, host, label or command");
  const auto uid = j.find("uid");
  if (uid == j.end() || !uid->is_number_unsigned()) return fail("bad uid");
  r.uid = uid->get<unsigned>();
  if (!read_time(j, "waited_seconds", r.waited_seconds)) return fail("bad waited_seconds");
  const auto gpus = j.find("gpus");
  if (gpus == j.end() || !gpus->is_array() || gpus->empty() || gpus->size() > kMaxGpus)
    return fail("bad gpus");
  for (const auto& g : *gpus) {
    JournalGpu gpu;
    if (!g.is_object() || !read_string(g, "uuid", gpu.uuid) || gpu.uuid.empty())
      return fail("bad gpu uuid");
    const auto index = g.find("index");
    if (index == g.end() || !index->is_number_integer()) return fail("bad gpu index");
    gpu.index = index->get<int>();
    r.gpus.push_back(std::move(gpu));
  }
  return r;
}

std::optional<JournalRecord> parse_journal_line(std::string_view line, std::string* why) {
  if (line.size() < 10 || line[8] != ' ') {
    if (why) *why = "no checksum (a truncated or foreign line)";
    return std::nullopt;
  }
  unsigned expected = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    const char c = line[i];
    unsigned digit;
    if (c >= '0' && c <= '9')
      digit = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      digit = static_cast<unsigned>(c - 'a' + 10);
    else {
      if (why) *why = "no checksum (a truncated or foreign line)";
      return std::nullopt;
    }
    expected = expected * 16 + digit;
  }
  const std::string_view body = line.substr(9);
  if (crc32(body) != expected) {
    if (why) *why = "checksum mismatch (torn, truncated or edited)";
    return std::nullopt;
  }
  return parse_journal_record_json(body, why);
}

}  // namespace gpulock
