// Serialising tickets as JSON, and reading them back as untrusted input.
#include "queue/ticket.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "util/canonical_json_reader.h"
#include "util/json_members.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using nlohmann::json;
using namespace json_members;

constexpr int kTicketSchema = 1;
constexpr std::size_t kMaxCandidates = 1024;
constexpr std::size_t kMaxUuidLength = 96;
constexpr std::size_t kMaxTextLength = 1024;
constexpr std::uint64_t kMaxSeq = std::uint64_t{1} << 62;
constexpr double kMaxTime = 9e9;  // seconds since the epoch: the year 2255

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

namespace {

// A ticket's fields as read, before they are checked: what both readers below produce.
struct TicketFields {
  std::string_view id, user, priority, label, command;
  std::uint64_t seq = 0, uid = 0, pid = 0, pid_start = 0, needed = 0;
  double enqueued_at = 0;
  bool named_gpus = false, allow_foreign = false;
  std::optional<bool> over_limit, spread;
  std::vector<std::string_view> candidates;
  std::optional<std::uint64_t> min_free_memory, max_utilization, shared_units, shared_slots;
  std::optional<double> max_power;
};

// Bounds, names and ranges: the same checks whichever reader read the fields.
std::optional<Ticket> checked_ticket(const TicketFields& f) {
  Ticket t;
  if (f.id.size() > 64 || !is_lease_id(f.id)) return std::nullopt;
  t.id = f.id;
  // Bounded so that the next seq (highest + 1) can never wrap, whatever is planted.
  if (f.seq > kMaxSeq) return std::nullopt;
  t.seq = f.seq;
  if (f.uid > UINT32_MAX - 1) return std::nullopt;
  t.uid = static_cast<uid_t>(f.uid);
  if (f.user.size() > 64) return std::nullopt;
  if (f.pid > 4194304 || f.pid == 0) return std::nullopt;
  t.process.pid = static_cast<pid_t>(f.pid);
  t.process.start_ticks = f.pid_start;
  t.enqueued_at = f.enqueued_at;
  // Within what the system clock can represent (until about 2262): shown as a time point.
  if (!std::isfinite(t.enqueued_at) || t.enqueued_at < 0 || t.enqueued_at > kMaxTime)
    return std::nullopt;
  if (f.priority.size() > 16) return std::nullopt;
  if (f.priority == "low") {
    t.priority = Priority::kLow;
  } else if (f.priority != "normal") {
    return std::nullopt;
  }
  if (f.needed > kMaxCandidates || f.needed == 0) return std::nullopt;
  t.needed = static_cast<unsigned>(f.needed);
  t.named_gpus = f.named_gpus;
  t.entered_over_limit = f.over_limit.value_or(false);
  if (f.candidates.size() > kMaxCandidates) return std::nullopt;
  t.candidates.reserve(f.candidates.size());
  for (std::string_view uuid : f.candidates) {
    if (uuid.empty() || uuid.size() > kMaxUuidLength) return std::nullopt;
    t.candidates.emplace_back(uuid);
  }
  if (t.named_gpus && t.candidates.size() != t.needed) return std::nullopt;
  t.min_free_memory_bytes = f.min_free_memory;
  if (f.max_utilization) {
    if (*f.max_utilization > 100) return std::nullopt;
    t.max_utilization_percent = static_cast<unsigned>(*f.max_utilization);
  }
  if (f.max_power) {
    if (!std::isfinite(*f.max_power) || *f.max_power < 0) return std::nullopt;
    t.max_power_watts = *f.max_power;
  }
  t.allow_foreign_processes = f.allow_foreign;
  if (f.label.size() > kMaxTextLength || f.command.size() > kMaxTextLength) return std::nullopt;
  for (const auto& [units, out] :
       {std::pair{f.shared_units, &t.shared_units}, std::pair{f.shared_slots, &t.shared_slots}}) {
    if (!units) continue;
    if (*units > kMaxSharedUnits || *units == 0) return std::nullopt;
    *out = static_cast<std::uint32_t>(*units);
  }
  t.spread = f.spread.value_or(false);
  // Shown to people: whatever was planted must not reach a terminal as escape sequences.
  t.user = sanitize_for_display(f.user, 64);
  t.label = sanitize_for_display(f.label, kMaxTextLength);
  t.command = sanitize_for_display(f.command, kMaxTextLength);
  return t;
}

// Any JSON, read with nlohmann's full parser. `j` must outlive the fields (they view its
// strings).
std::optional<TicketFields> read_with_full_parser(const json& j) {
  if (!j.is_object()) return std::nullopt;
  if (!j.contains("schema") || j["schema"] != kTicketSchema) return std::nullopt;
  TicketFields f;
  if (!required(j, "id", string_member, f.id) || !required(j, "user", string_member, f.user) ||
      !required(j, "priority", string_member, f.priority) ||
      !required(j, "label", string_member, f.label) ||
      !required(j, "command", string_member, f.command) ||
      !required(j, "seq", unsigned_member, f.seq) || !required(j, "uid", unsigned_member, f.uid) ||
      !required(j, "pid", unsigned_member, f.pid) ||
      !required(j, "pid_start", unsigned_member, f.pid_start) ||
      !required(j, "needed", unsigned_member, f.needed) ||
      !required(j, "enqueued_at", number_member, f.enqueued_at) ||
      !required(j, "named_gpus", bool_member, f.named_gpus) ||
      !required(j, "allow_foreign", bool_member, f.allow_foreign) ||
      !optional(j, "over_limit", bool_member, f.over_limit) ||
      !optional(j, "spread", bool_member, f.spread) ||
      !optional(j, "min_free_memory", unsigned_member, f.min_free_memory) ||
      !optional(j, "max_utilization", unsigned_member, f.max_utilization) ||
      !optional(j, "shared_units", unsigned_member, f.shared_units) ||
      !optional(j, "shared_slots", unsigned_member, f.shared_slots) ||
      !optional(j, "max_power", number_member, f.max_power))
    return std::nullopt;
  if (!j.contains("candidates") || !j["candidates"].is_array() ||
      j["candidates"].size() > kMaxCandidates)
    return std::nullopt;
  for (const auto& uuid : j["candidates"]) {
    if (!uuid.is_string()) return std::nullopt;
    f.candidates.emplace_back(uuid.get_ref<const std::string&>());
  }
  return f;
}

// The ticket's fields, or nullopt where the text is not in the exact form serialize_ticket()
// writes (nlohmann's compact dump: keys in byte order, numbers as it prints them): read without
// building a JSON document, on the path of every plan that reaches a waiter's ticket. On what it
// accepts it reads what the full parser would (tests/unit/ticket_test.cc checks both on tickets
// and on every one-character mutation of one).
std::optional<TicketFields> read_canonical(std::string_view bytes) {
  CanonicalJsonReader in(bytes);
  TicketFields f;
  if (!in.member(R"({"allow_foreign":)", f.allow_foreign) || !in.literal(R"(,"candidates":[)"))
    return std::nullopt;
  if (!in.literal("]")) {
    do {
      const auto uuid = in.string();
      if (!uuid || f.candidates.size() == kMaxCandidates) return std::nullopt;
      f.candidates.push_back(*uuid);
    } while (in.literal(","));
    if (!in.literal("]")) return std::nullopt;
  }
  if (!in.member(R"(,"command":)", f.command) || !in.member(R"(,"enqueued_at":)", f.enqueued_at) ||
      !in.member(R"(,"id":)", f.id) || !in.member(R"(,"label":)", f.label) ||
      !in.optional_member(R"(,"max_power":)", f.max_power) ||
      !in.optional_member(R"(,"max_utilization":)", f.max_utilization) ||
      !in.optional_member(R"(,"min_free_memory":)", f.min_free_memory) ||
      !in.member(R"(,"named_gpus":)", f.named_gpus) || !in.member(R"(,"needed":)", f.needed) ||
      !in.optional_member(R"(,"over_limit":)", f.over_limit) || !in.member(R"(,"pid":)", f.pid) ||
      !in.member(R"(,"pid_start":)", f.pid_start) || !in.member(R"(,"priority":)", f.priority) ||
      !in.literal(R"(,"schema":1)") || !in.member(R"(,"seq":)", f.seq) ||
      !in.optional_member(R"(,"shared_slots":)", f.shared_slots) ||
      !in.optional_member(R"(,"shared_units":)", f.shared_units) ||
      !in.optional_member(R"(,"spread":)", f.spread) || !in.member(R"(,"uid":)", f.uid) ||
      !in.member(R"(,"user":)", f.user) || !in.literal("}"))
    return std::nullopt;
  // serialize_ticket() ends the document with a newline.
  in.literal("\n");
  if (!in.at_end()) return std::nullopt;
  return f;
}

}  // namespace

std::optional<Ticket> parse_ticket(std::string_view bytes) {
  if (bytes.size() > kMaxTicketSize) return std::nullopt;
  if (const auto fields = read_canonical(bytes)) return checked_ticket(*fields);
  return parse_ticket_with_full_parser(bytes);
}

std::optional<Ticket> parse_ticket_with_full_parser(std::string_view bytes) {
  if (bytes.size() > kMaxTicketSize) return std::nullopt;
  const json j = json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  const std::optional<TicketFields> fields = read_with_full_parser(j);
  if (!fields) return std::nullopt;
  return checked_ticket(*fields);
}

bool ticket_is_canonical(std::string_view bytes) {
  return bytes.size() <= kMaxTicketSize && read_canonical(bytes).has_value();
}

}  // namespace gpulock
