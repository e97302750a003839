// RedisJournal: appending records to the pool's capped stream, and reading them back.
#include "redis/redis_journal.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "journal/journal_line.h"

namespace gpulock {
namespace {

constexpr int kReadBatch = 1000;
constexpr auto kAppendTimeout = std::chrono::milliseconds(2000);

}  // namespace

RedisJournal::RedisJournal(std::shared_ptr<RedisConnectionCache> connections, std::string key)
    : connections_(std::move(connections)), key_(std::move(key)) {}

void RedisJournal::forget_descriptors() noexcept {
  try {
    connections_->abandon_after_fork();
    connections_ =
        std::make_shared<RedisConnectionCache>(connections_->endpoint(), connections_->timeout());
  } catch (...) {
  }
}

void RedisJournal::append(const JournalRecord& record) noexcept {
  std::string problem;
  try {
    RedisConnectionLoan connection(*connections_, kAppendTimeout);
    const RedisValue reply =
        connection->command({"XADD", key_, "MAXLEN", "~", std::to_string(kJournalStreamLength), "*",
                             "r", journal_record_json(record)});
    if (!reply.is_error()) return;
    problem = reply.text;
  } catch (const std::exception& error) {
    problem = error.what();
  }
  if (warned_.exchange(true)) return;
  std::fprintf(stderr,
               "gpulock: warning: usage journal (%s): %s; leases work, but are not recorded\n",
               key_.c_str(), problem.c_str());
}

JournalContents RedisJournal::read() {
  JournalContents contents;
  contents.location = location();
  RedisConnectionLoan connection(*connections_);
  std::string from = "-";
  while (true) {
    const RedisValue reply =
        connection->command({"XRANGE", key_, from, "+", "COUNT", std::to_string(kReadBatch)});
    if (reply.is_error())
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("cannot read the usage journal {}: {}", key_, reply.text));
    if (reply.type != RedisValue::Type::kArray || reply.elements.empty()) break;
    for (const RedisValue& entry : reply.elements) {
      if (entry.type != RedisValue::Type::kArray || entry.elements.size() != 2) continue;
      const std::string& id = entry.elements[0].text;
      from = "(" + id;
      const RedisValue& fields = entry.elements[1];
      std::string why = "no record field";
      bool parsed = false;
      for (std::size_t i = 0; i + 1 < fields.elements.size(); i += 2) {
        if (fields.elements[i].text != "r") continue;
        if (auto record = parse_journal_record_json(fields.elements[i + 1].text, &why)) {
          contents.records.push_back(std::move(*record));
          parsed = true;
        }
        break;
      }
      if (!parsed)
        contents.warnings.push_back(
            fmt::format("{} entry {}: damaged record skipped: {}", key_, id, why));
    }
    if (static_cast<int>(reply.elements.size()) < kReadBatch) break;
  }
  std::stable_sort(contents.records.begin(), contents.records.end(),
                   [](const JournalRecord& a, const JournalRecord& b) { return a.time < b.time; });
  return contents;
}

}  // namespace gpulock
