// StatusCache (serve/status_cache.h): one reading of the pool per interval, shared by all
// requests.
#include "serve/status_cache.h"

#include "gpulock/json_output.hpp"
#include "serve/redaction.h"

namespace gpulock::serve {
namespace {

constexpr std::chrono::seconds kLeaseCountInterval{5};

}  // namespace

StatusCache::StatusCache(GpuPool& pool, bool show_commands, std::chrono::milliseconds interval)
    : pool_(pool), show_commands_(show_commands), interval_(interval) {
  snapshot_ = read();
  refresher_ = std::thread([this] { refresh_until_stopped(); });
}

StatusCache::~StatusCache() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_requested_.notify_all();
  refresher_.join();
}

std::shared_ptr<const Snapshot> StatusCache::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot_;
}

std::shared_ptr<const Snapshot> StatusCache::read() {
  auto snapshot = std::make_shared<Snapshot>();
  try {
    PoolStatus status = pool_.status();
    idle_tracker_.observe(status, pool_.config().idle_after);
    QueueStatus queue = pool_.queue();
    if (!show_commands_) {
      redact_commands(status);
      redact_commands(queue);
    }
    snapshot->status_json = status_to_json(status);
    snapshot->queue_json = queue_to_json(queue);
    const auto now = std::chrono::steady_clock::now();
    if (lease_counts_read_at_ == std::chrono::steady_clock::time_point{} ||
        now - lease_counts_read_at_ >= kLeaseCountInterval) {
      pool_.follow_lease_counts(lease_counts_);
      lease_counts_read_at_ = now;
    }
    snapshot->metrics = metrics_text(status, queue, &lease_counts_.counts());
  } catch (const std::exception& e) {
    *snapshot = Snapshot{};
    snapshot->error = e.what();
  }
  return snapshot;
}

void StatusCache::refresh_until_stopped() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_requested_.wait_for(lock, interval_, [this] { return stopping_; })) {
    lock.unlock();
    auto fresh = read();
    lock.lock();
    snapshot_ = std::move(fresh);
  }
}

}  // namespace gpulock::serve
