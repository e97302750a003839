// Usage accounting from journal records: pairing starts with ends, GPU-hours and waits per
// group, and the JSON and CSV documents of `gpulock usage` and `gpulock log`.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpulock/error.hpp"
#include "gpulock/jobs.hpp"
#include "gpulock/json_output.hpp"
#include "gpulock/usage.hpp"
#include "journal/journal_line.h"

namespace gpulock {
namespace {

using nlohmann::json;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::string utc_day(double seconds) {
  const std::time_t t = static_cast<std::time_t>(std::floor(seconds));
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
}

// The start of the UTC day after the one containing `seconds`.
double next_utc_midnight(double seconds) {
  return (std::floor(seconds / 86400.0) + 1) * 86400.0;
}

struct Accumulator {
  std::string gpu_index;  // by GPU: the index its latest lease recorded
  double gpu_seconds = 0;
  std::vector<double> waits;
  std::map<std::string, bool> leases;  // counted once per group
};

void add(Accumulator& acc, const UsageLease& lease, double gpu_seconds) {
  acc.gpu_seconds += gpu_seconds;
  if (acc.leases.emplace(lease.start.lease_id, true).second)
    acc.waits.push_back(lease.start.waited_seconds);
}

UsageGroup finish(const std::string& key, const Accumulator& acc) {
  UsageGroup group;
  group.key = key;
  group.gpu_hours = acc.gpu_seconds / 3600.0;
  group.gpu_index = acc.gpu_index;
  group.leases = static_cast<unsigned>(acc.leases.size());
  group.median_wait_seconds = median(acc.waits);
  group.max_wait_seconds =
      acc.waits.empty() ? 0 : *std::max_element(acc.waits.begin(), acc.waits.end());
  return group;
}

json record_json(const JournalRecord& r) {
  return json::parse(journal_record_json(r));
}

json group_json(const UsageGroup& g, UsageGrouping grouping) {
  json j = {{"key", g.key},
            {"gpu_hours", g.gpu_hours},
            {"leases", g.leases},
            {"median_wait_seconds", g.median_wait_seconds},
            {"max_wait_seconds", g.max_wait_seconds}};
  if (grouping == UsageGrouping::kGpu) {
    j["gpu_index"] = g.gpu_index.empty() ? json(nullptr) : json(g.gpu_index);
    j["gpu_name"] = g.gpu_name.empty() ? json(nullptr) : json(g.gpu_name);
  }
  return j;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

const char* lease_end_name(LeaseEnd end) noexcept {
  switch (end) {
    case LeaseEnd::kReleased:
      return "released";
    case LeaseEnd::kHolderDied:
      return "holder_died";
    case LeaseEnd::kLost:
      return "lost";
  }
  return "released";
}

const char* command_end_name(CommandEnd end) noexcept {
  switch (end) {
    case CommandEnd::kExited:
      return "exited";
    case CommandEnd::kSignal:
      return "signal";
    case CommandEnd::kTimeout:
      return "timeout";
    case CommandEnd::kCancelled:
      return "cancelled";
    case CommandEnd::kOverMemory:
      return "over_memory";
    case CommandEnd::kLeaseLost:
      return "lease_lost";
  }
  return "exited";
}

std::optional<CommandEnd> command_end_named(std::string_view name) noexcept {
  for (const CommandEnd end :
       {CommandEnd::kExited, CommandEnd::kSignal, CommandEnd::kTimeout, CommandEnd::kCancelled,
        CommandEnd::kOverMemory, CommandEnd::kLeaseLost})
    if (name == command_end_name(end)) return end;
  return std::nullopt;
}

const char* usage_grouping_name(UsageGrouping grouping) noexcept {
  switch (grouping) {
    case UsageGrouping::kUser:
      return "user";
    case UsageGrouping::kGpu:
      return "gpu";
    case UsageGrouping::kLabel:
      return "label";
    case UsageGrouping::kDay:
      return "day";
    case UsageGrouping::kJob:
      return "job";
  }
  return "user";
}

std::optional<UsageGrouping> usage_grouping_named(std::string_view name) noexcept {
  for (const UsageGrouping grouping :
       {UsageGrouping::kUser, UsageGrouping::kGpu, UsageGrouping::kLabel, UsageGrouping::kDay,
        UsageGrouping::kJob})
    if (name == usage_grouping_name(grouping)) return grouping;
  return std::nullopt;
}

std::vector<UsageLease> pair_journal_records(const std::vector<JournalRecord>& records) {
  const auto written_by = [](const JournalRecord& r, unsigned uid) {
    return !r.writer_uid || *r.writer_uid == uid || *r.writer_uid == 0;
  };
  std::vector<UsageLease> leases;
  std::unordered_map<std::string, std::size_t> by_id;
  for (const auto& r : records) {
    if (r.kind != JournalRecord::Kind::kStart || by_id.contains(r.lease_id)) continue;
    if (!written_by(r, r.uid)) continue;  // a start claimed for someone else
    by_id.emplace(r.lease_id, leases.size());
    leases.push_back(UsageLease{r, std::nullopt, std::nullopt, false, std::nullopt});
  }
  for (const auto& r : records) {
    if (r.kind != JournalRecord::Kind::kEnd) continue;
    const auto it = by_id.find(r.lease_id);
    if (it == by_id.end()) continue;  // its start rotated away or was damaged
    UsageLease& lease = leases[it->second];
    if (!r.inferred && !written_by(r, lease.start.uid)) continue;  // not the holder's to write
    // The first end written wins; a written end beats an inferred one.
    if (lease.ended_at && (!lease.end_inferred || r.inferred)) continue;
    lease.ended_at = std::max(r.time, lease.start.time);
    lease.end = r.end;
    lease.end_inferred = r.inferred;
    lease.outcome = r.outcome;
  }
  return leases;
}

UsageReport summarize_usage(const std::vector<UsageLease>& leases, double since, double until,
                            UsageGrouping grouping, double now) {
  UsageReport report;
  report.since = since;
  report.until = until;
  report.grouping = grouping;
  std::map<std::string, Accumulator> groups;
  Accumulator total;
  const double window_end = std::min(until, now);
  for (const auto& lease : leases) {
    const double begin = std::max(lease.start.time, since);
    const double end = std::min(lease.ended_at.value_or(window_end), window_end);
    if (end < begin || (end == begin && !(lease.start.time >= since && lease.start.time < until)))
      continue;  // outside the window
    const double gpus = static_cast<double>(lease.start.gpus.size());
    add(total, lease, (end - begin) * gpus);
    switch (grouping) {
      case UsageGrouping::kUser:
        add(groups[lease.start.user], lease, (end - begin) * gpus);
        break;
      case UsageGrouping::kLabel:
        add(groups[lease.start.label], lease, (end - begin) * gpus);
        break;
      case UsageGrouping::kJob:
        add(groups[job_of_lease_label(lease.start.label)], lease, (end - begin) * gpus);
        break;
      case UsageGrouping::kGpu:
        for (const auto& gpu : lease.start.gpus) {
          Accumulator& acc = groups[gpu.uuid];
          add(acc, lease, end - begin);
          if (gpu.index >= 0) acc.gpu_index = std::to_string(gpu.index);  // leases come in order
        }
        break;
      case UsageGrouping::kDay: {
        double from = begin;
        do {
          const double to = std::min(end, next_utc_midnight(from));
          add(groups[utc_day(from)], lease, (to - from) * gpus);
          from = to;
        } while (from < end);
        break;
      }
    }
  }
  for (const auto& [key, acc] : groups) report.groups.push_back(finish(key, acc));
  if (grouping != UsageGrouping::kDay)
    std::stable_sort(
        report.groups.begin(), report.groups.end(),
        [](const UsageGroup& a, const UsageGroup& b) { return a.gpu_hours > b.gpu_hours; });
  report.total = finish("total", total);
  return report;
}

std::string usage_to_json(const UsageReport& report) {
  json groups = json::array();
  for (const auto& g : report.groups) groups.push_back(group_json(g, report.grouping));
  const json doc = {{"schema_version", kJsonSchemaVersion},
                    {"since", report.since},
                    {"until", report.until},
                    {"by", usage_grouping_name(report.grouping)},
                    {"groups", groups},
                    {"total", group_json(report.total, UsageGrouping::kUser)},
                    {"warnings", report.warnings}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string usage_to_csv(const UsageReport& report) {
  const bool by_gpu = report.grouping == UsageGrouping::kGpu;
  std::string out =
      fmt::format("{},gpu_hours,leases,median_wait_seconds,max_wait_seconds{}\n",
                  usage_grouping_name(report.grouping), by_gpu ? ",gpu_index,gpu_name" : "");
  for (const auto& g : report.groups) {
    out += fmt::format("{},{:.6f},{},{:.3f},{:.3f}", csv_field(g.key), g.gpu_hours, g.leases,
                       g.median_wait_seconds, g.max_wait_seconds);
    if (by_gpu) out += "," + csv_field(g.gpu_index) + "," + csv_field(g.gpu_name);
    out += '\n';
  }
  return out;
}

std::string journal_to_json(const JournalContents& contents) {
  json records = json::array();
  for (const auto& r : contents.records) records.push_back(record_json(r));
  const json doc = {{"schema_version", kJsonSchemaVersion},
                    {"journal", contents.location},
                    {"records", records},
                    {"warnings", contents.warnings}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace);
}

double parse_time_bound(const std::string& text, double now) {
  const auto bad = [&text](const char* what) {
    return Error(ErrorCode::kInvalidArgument,
                 fmt::format("'{}': {} (use e.g. 7d, 12h, 30m, 2026-11-01 or 2026-11-01T08:00)",
                             text, what));
  };
  if (text.empty()) throw bad("empty time");
  if (text == "now") return now;
  // A duration before now: digits and one unit.
  const char unit = text.back();
  if (text.size() >= 2 && std::string("smhdw").find(unit) != std::string::npos &&
      text.find_first_not_of("0123456789.") == text.size() - 1) {
    double amount = 0;
    try {
      std::size_t used = 0;
      amount = std::stod(text.substr(0, text.size() - 1), &used);
      if (used != text.size() - 1) throw bad("not a number");
    } catch (const std::logic_error&) {
      throw bad("not a number");
    }
    const double scale = unit == 's'   ? 1
                         : unit == 'm' ? 60
                         : unit == 'h' ? 3600
                         : unit == 'd' ? 86400
                                       : 604800;
    if (!std::isfinite(amount) || amount * scale > 100.0 * 365 * 86400) throw bad("too long ago");
    return now - amount * scale;
  }
  if (text.find_first_not_of("0123456789.") == std::string::npos) {
    try {
      return std::stod(text);
    } catch (const std::logic_error&) {
      throw bad("not a number");
    }
  }
  std::tm tm{};
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  char tail = 0;
  const int n = std::sscanf(text.c_str(), "%4d-%2d-%2d%c%2d:%2d:%2d", &year, &month, &day, &tail,
                            &hour, &minute, &second);
  const bool date_only = n == 3 && text.size() == 10;
  const bool with_time = n >= 6 && (tail == 'T' || tail == ' ');
  if (!date_only && !with_time) throw bad("not a duration or a date");
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60 ||
      year < 1970 || year > 2999)
    throw bad("no such date");
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  return static_cast<double>(::timegm(&tm));
}

}  // namespace gpulock
