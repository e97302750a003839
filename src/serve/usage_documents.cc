// UsageDocuments: /api/usage's documents, from the usage journal, kept for a while.
#include "serve/usage_documents.h"

#include <cmath>
#include <ctime>

#include <nlohmann/json.hpp>

#include "gpulock/error.hpp"
#include "gpulock/usage.hpp"

namespace gpulock::serve {
namespace {

constexpr double kDay = 86400.0;
// The chart's window is at most this many days (and so is the work of one document).
constexpr double kMaxChartDays = 366;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc_day(double seconds) {
  const auto t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &tm);
  return text;
}

}  // namespace

UsageDocuments::UsageDocuments(std::function<GpuPool()> open_pool, std::chrono::seconds max_age)
    : open_pool_(std::move(open_pool)), max_age_(max_age) {}

std::string UsageDocuments::document(const std::string& since_text, const std::string& by) {
  if (by != "user,day" && !usage_grouping_named(by))
    throw Error(ErrorCode::kInvalidArgument, "'by' must be user, gpu, label, job, day or user,day");
  const double now = unix_now();
  const double since = parse_time_bound(since_text, now);  // throws kInvalidArgument
  if (since > now) throw Error(ErrorCode::kInvalidArgument, "'since' is in the future");

  std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_pair(since_text, by);
  const auto made = std::chrono::steady_clock::now();
  if (const auto it = kept_.find(key); it != kept_.end() && made - it->second.made < max_age_)
    return it->second.document;
  std::string document = build(since, now, by);
  if (kept_.size() > 64) kept_.clear();  // bounded: query strings are the clients' to choose
  kept_[key] = Kept{made, document};
  return document;
}

std::string UsageDocuments::build(double since, double until, const std::string& by) {
  if (!pool_) pool_.emplace(open_pool_());
  if (const auto grouping = usage_grouping_named(by))
    return usage_to_json(pool_->usage(since, until, *grouping));

  // user,day: each UTC day of the window, summed per user, from one reading of the journal.
  since = std::max(since, until - kMaxChartDays * kDay);
  const JournalContents contents = pool_->journal();
  const std::vector<UsageLease> leases = pair_journal_records(contents.records);
  nlohmann::json rows = nlohmann::json::array();
  for (double day = std::floor(since / kDay) * kDay; day < until; day += kDay) {
    const UsageReport report = summarize_usage(
        leases, std::max(day, since), std::min(day + kDay, until), UsageGrouping::kUser, until);
    for (const UsageGroup& group : report.groups)
      if (group.gpu_hours > 0)
        rows.push_back(
            {{"user", group.key}, {"day", utc_day(day)}, {"gpu_hours", group.gpu_hours}});
  }
  nlohmann::json doc = {{"since", since},          {"until", until},
                        {"by", "user,day"},        {"available", contents.available},
                        {"rows", std::move(rows)}, {"warnings", contents.warnings}};
  return doc.dump();
}

}  // namespace gpulock::serve
