// Journal records to and from checksummed lines of JSON.
#include "journal/journal_line.h"

#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/crc32.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxField = 1024;  // any one string read back
constexpr std::size_t kMaxGpus = 1024;
constexpr double kLatestTime = 32503680000.0;  // year 3000: times beyond are damage

// Appends `text` as a JSON string. Written by hand rather than through nlohmann::json because a
// record is made on every lease start and end (the journal's cost is budgeted in microseconds).
// Invalid UTF-8 becomes '?', so that every line parses back.
void append_string(std::string& out, std::string_view text) {
  out += '"';
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7F) {
        out += fmt::format("\\u{:04x}", c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: its length from the lead byte, its continuation bytes checked.
    const std::size_t length = (c & 0xE0) == 0xC0 && c >= 0xC2   ? 2
                               : (c & 0xF0) == 0xE0              ? 3
                               : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4
                                                                 : 0;
    bool valid = length != 0 && i + length <= text.size();
    for (std::size_t k = 1; valid && k < length; ++k)
      valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (valid && length == 3) {  // no overlong forms, no surrogates
      const auto c1 = static_cast<unsigned char>(text[i + 1]);
      valid = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
    } else if (valid && length == 4) {
      const auto c1 = static_cast<unsigned char>(text[i + 1]);
      valid = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
    }
    if (valid) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += '?';
      ++i;
    }
  }
  out += '"';
}

std::string record_text(const JournalRecord& r) {
  std::string out;
  out.reserve(256 + r.command.size() + r.label.size());
  out += R"({"v":1,"event":)";
  out += r.kind == JournalRecord::Kind::kEnd ? R"("end")" : R"("start")";
  out += R"(,"lease_id":)";
  append_string(out, r.lease_id);
  out += fmt::format(R"(,"time":{})", r.time);
  if (r.kind == JournalRecord::Kind::kEnd) {
    out += fmt::format(R"(,"how":"{}","inferred":{})", lease_end_name(r.end),
                       r.inferred ? "true" : "false");
    if (r.outcome)
      out +=
          fmt::format(R"(,"command_end":"{}","exit_status":{},"signal":{})",
                      command_end_name(r.outcome->how), r.outcome->exit_status, r.outcome->signal);
    out += '}';
    return out;
  }
  out += R"(,"user":)";
  append_string(out, r.user);
  out += fmt::format(R"(,"uid":{},"host":)", r.uid);
  append_string(out, r.host);
  out += R"(,"gpus":[)";
  for (std::size_t i = 0; i < r.gpus.size(); ++i) {
    out += i ? R"(,{"uuid":)" : R"({"uuid":)";
    append_string(out, r.gpus[i].uuid);
    out += fmt::format(R"(,"index":{}}})", r.gpus[i].index);
  }
  out += R"(],"label":)";
  append_string(out, r.label);
  out += R"(,"command":)";
  append_string(out, r.command);
  out += fmt::format(R"(,"waited_seconds":{})", r.waited_seconds);
  if (r.memory_bytes) out += fmt::format(R"(,"memory_bytes":{})", r.memory_bytes);
  out += '}';
  return out;
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
  std::string text = record_text(record);
  if (text.size() + 10 <= kMaxJournalLine) return text;
  // Too long: the command and label are the only unbounded parts.
  JournalRecord shorter = record;
  shorter.command = cut(shorter.command, 512);
  shorter.label = cut(shorter.label, 256);
  text = record_text(shorter);
  if (text.size() + 10 <= kMaxJournalLine) return text;
  shorter.command.clear();
  shorter.label = cut(shorter.label, 64);
  return record_text(shorter);
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
    const auto command_end = j.find("command_end");
    if (command_end != j.end()) {
      // Records of a later gpulock may name ends this one does not know: the lease's own end
      // still counts, only the command's is dropped.
      const auto exit_status = j.find("exit_status");
      const auto signal = j.find("signal");
      if (!command_end->is_string() || exit_status == j.end() ||
          !exit_status->is_number_integer() || signal == j.end() || !signal->is_number_integer())
        return fail("bad command end");
      const long long status = exit_status->get<long long>();
      const long long number = signal->get<long long>();
      if (status < 0 || status > 255 || number < 0 || number > 64) return fail("bad command end");
      if (const auto how = command_end_named(command_end->get<std::string>()))
        r.outcome = CommandOutcome{*how, static_cast<int>(status), static_cast<int>(number)};
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
  if (const auto memory = j.find("memory_bytes"); memory != j.end()) {
    if (!memory->is_number_unsigned()) return fail("bad memory_bytes");
    r.memory_bytes = memory->get<std::uint64_t>();
  }
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
