// `gpulock usage` and `gpulock log`: GPU-hours per group, and the usage journal's raw records
// (the library does the work: GpuPool::usage(), GpuPool::journal()).
#include <string.h>

#include <cmath>
#include <cstdio>
#include <ctime>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc_text(double seconds) {
  const std::time_t t = static_cast<std::time_t>(std::floor(seconds));
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%SZ", &tm);
  return text;
}

std::string wait_text(double seconds) {
  return format_duration(std::chrono::seconds(static_cast<long long>(std::llround(seconds))));
}

// The window from --since and --until ("" = their defaults: 30 days ago, and now).
void window(const std::string& since_text, const std::string& until_text, double& since,
            double& until) {
  const double now = now_seconds();
  since = since_text.empty() ? now - 30 * 86400.0 : parse_time_bound(since_text, now);
  until = until_text.empty() ? now : parse_time_bound(until_text, now);
  if (until <= since)
    throw Error(ErrorCode::kInvalidArgument, "--until must be later than --since");
}

void print_warnings(const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) std::fprintf(stderr, "gpulock: warning: %s\n", w.c_str());
}

void print_usage_table(const UsageReport& report) {
  fmt::print("usage {} .. {} by {}\n", utc_text(report.since), utc_text(report.until),
             usage_grouping_name(report.grouping));
  fmt::print("{:<40} {:>10} {:>7} {:>12} {:>10}\n", "KEY", "GPU-HOURS", "LEASES", "MEDIAN WAIT",
             "MAX WAIT");
  const auto row = [](const UsageGroup& g) {
    fmt::print("{:<40} {:>10.2f} {:>7} {:>12} {:>10}{}\n", g.key.empty() ? "(none)" : g.key,
               g.gpu_hours, g.leases, wait_text(g.median_wait_seconds),
               wait_text(g.max_wait_seconds),
               g.gpu_index.empty() && g.gpu_name.empty()
                   ? ""
                   : fmt::format("  GPU {}{}", g.gpu_index.empty() ? "?" : g.gpu_index,
                                 g.gpu_name.empty() ? "" : " " + g.gpu_name));
  };
  for (const auto& g : report.groups) row(g);
  row(report.total);
}

// " (SIGKILL)" for 9; "" for a number without a name.
std::string signal_suffix(int number) {
  const char* name = ::sigabbrev_np(number);
  return name ? fmt::format(" (SIG{})", name) : std::string();
}

// "exited 0", "signal 9 (SIGKILL)", "timeout, signal 15 (SIGTERM)".
std::string outcome_text(const CommandOutcome& outcome) {
  const std::string status =
      outcome.signal ? fmt::format("signal {}{}", outcome.signal, signal_suffix(outcome.signal))
                     : fmt::format("exit {}", outcome.exit_status);
  switch (outcome.how) {
    case CommandEnd::kExited:
      return fmt::format("exited {}", outcome.exit_status);
    case CommandEnd::kSignal:
      return status;
    default:
      return fmt::format("{}, {}", command_end_name(outcome.how), status);
  }
}

void print_log_table(const JournalContents& contents, double since, double until) {
  for (const auto& r : contents.records) {
    if (r.time < since || r.time >= until) continue;
    if (r.kind == JournalRecord::Kind::kEnd) {
      fmt::print("{}  end    {}  {}{}{}\n", utc_text(r.time), r.lease_id, lease_end_name(r.end),
                 r.inferred ? " (inferred)" : "", r.outcome ? "  " + outcome_text(*r.outcome) : "");
      continue;
    }
    std::string gpus;
    for (const auto& g : r.gpus) gpus += (gpus.empty() ? "" : ",") + std::to_string(g.index);
    fmt::print("{}  start  {}  {}@{} gpus {} waited {}{}{}\n", utc_text(r.time), r.lease_id, r.user,
               r.host, gpus, wait_text(r.waited_seconds),
               r.label.empty() ? "" : " [" + r.label + "]",
               r.command.empty() ? "" : "  " + r.command);
  }
}

}  // namespace

void add_usage_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "usage", "GPU-hours, leases and median wait per user, GPU, label or day (usage journal)");
  struct Options {
    std::string since, until, by = "user", backend;
    bool json = false, csv = false;
  };
  auto options = std::make_shared<Options>();
  command->add_option("--since", options->since,
                      "Start of the window: 7d, 12h, 30m ago, or a date (UTC); default 30d");
  command->add_option("--until", options->until, "End of the window, as --since; default now");
  command->add_option("--by", options->by, "Group by user, gpu, label, job or day (UTC)")
      ->check(CLI::IsMember({"user", "gpu", "label", "job", "day"}));
  auto* json = command->add_flag("--json", options->json, "Machine-readable output (docs/json.md)");
  command->add_flag("--csv", options->csv, "Comma-separated values, one line per group")
      ->excludes(json);
  add_backend_option(*command, options->backend);
  command->callback([options, exit_status] {
    double since = 0, until = 0;
    window(options->since, options->until, since, until);
    const UsageGrouping by = usage_grouping_named(options->by).value_or(UsageGrouping::kUser);
    GpuPool pool = open_pool(options->backend);
    const UsageReport report = pool.usage(since, until, by);
    print_warnings(report.warnings);
    if (options->json)
      fmt::print("{}\n", usage_to_json(report));
    else if (options->csv)
      fmt::print("{}", usage_to_csv(report));
    else
      print_usage_table(report);
    *exit_status = 0;
  });
}

void add_log_command(CLI::App& app, int* exit_status) {
  auto* command =
      app.add_subcommand("log", "The usage journal's records: every lease start and end");
  struct Options {
    std::string since, until, backend;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  command->add_option("--since", options->since, "Only records from then on: 7d, 12h, or a date");
  command->add_option("--until", options->until, "Only records before then, as --since");
  command->add_flag("--json", options->json, "Machine-readable output (docs/json.md)");
  add_backend_option(*command, options->backend);
  command->callback([options, exit_status] {
    const double now = now_seconds();
    const double since = options->since.empty() ? 0 : parse_time_bound(options->since, now);
    const double until =
        options->until.empty() ? now + 86400.0 : parse_time_bound(options->until, now);
    GpuPool pool = open_pool(options->backend);
    JournalContents contents = pool.journal();
    print_warnings(contents.warnings);
    if (!contents.available)
      print_warnings({"no usage journal at " + contents.location +
                      " (`gpulock init` makes it; docs/operations.md)"});
    if (options->json) {
      std::erase_if(contents.records,
                    [&](const JournalRecord& r) { return r.time < since || r.time >= until; });
      fmt::print("{}\n", journal_to_json(contents));
    } else {
      print_log_table(contents, since, until);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
