// RedisJournal: the Redis backend's usage journal, a capped stream in the pool
// ("gpulock:{POOL}:journal", XADD MAXLEN ~), each entry one record's JSON in field "r".
//
// Every host of the pool appends to it and reads it. The server trims the oldest entries past
// kJournalStreamLength. Anyone allowed to write the pool's keys can write the stream (docs/redis.md
// on ACLs): the journal is as trustworthy as the pool's credentials.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "journal/usage_journal.h"
#include "redis/redis_connection_cache.h"

namespace gpulock {

inline constexpr long kJournalStreamLength = 200000;

class RedisJournal final : public UsageJournal {
 public:
  RedisJournal(std::shared_ptr<RedisConnectionCache> connections, std::string key);

  void append(const JournalRecord& record) noexcept override;
  JournalContents read() override;
  std::string location() const override { return "redis stream " + key_; }
  void forget_descriptors() noexcept override;

 private:
  std::shared_ptr<RedisConnectionCache> connections_;
  const std::string key_;
  std::atomic<bool> warned_{false};
};

}  // namespace gpulock
