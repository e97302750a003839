// RedisLeaseKeeper: the renewal thread of a Redis lease.
#include "redis/redis_lease_keeper.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "redis/redis_scripts.h"
#include "util/current_pid.h"
#include "util/random_id.h"
#include "util/signals_blocked.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using namespace std::chrono_literals;

// How long one renewal or the final release may take: a third of the TTL at most, so that a
// stuck server is noticed while there is time to retry.
std::chrono::milliseconds call_timeout(std::chrono::milliseconds ttl) {
  return std::clamp(ttl / 3, std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
}

}  // namespace

RedisLeaseKeeper::RedisLeaseKeeper(RedisLeaseTerms terms, std::string record_json,
                                   std::shared_ptr<RedisConnectionCache> connections,
                                   Clock::time_point confirmed_at)
    : terms_(std::move(terms)),
      connections_(std::move(connections)),
      record_json_(std::move(record_json)),
      confirmed_at_(confirmed_at.time_since_epoch().count()) {
  start();
}

RedisLeaseKeeper::~RedisLeaseKeeper() {
  stop();
  if (disowned_) return;
  // Compare-and-delete: a lease that expired and went to someone else is left alone.
  try {
    RedisConnectionLoan connection(*connections_, call_timeout(terms_.ttl));
    std::vector<std::string> args{terms_.lease_id};
    args.insert(args.end(), terms_.uuids.begin(), terms_.uuids.end());
    connection->run(redis_scripts::kRelease, {terms_.version_key}, args);
  } catch (const Error& error) {
    std::fprintf(stderr,
                 "gpulock: warning: lease %s: cannot release it now (%s); its GPUs return when "
                 "it expires, within %lld ms\n",
                 terms_.lease_id.c_str(), error.what(), static_cast<long long>(terms_.ttl.count()));
  }
}

void RedisLeaseKeeper::start() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = false;
  }
  // The thread takes no signals: they belong to the program (run_command reads them from a
  // signalfd; a Python program handles them in its main thread).
  const SignalsBlocked for_the_thread;
  thread_ = std::make_unique<std::thread>([this] { run(); });
  thread_process_ = current_pid();
}

void RedisLeaseKeeper::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  published_.notify_all();
  if (!thread_) return;
  if (thread_process_ != current_pid()) {
    (void)thread_.release();  // a forked copy: the thread is the parent's
    return;
  }
  if (thread_->joinable()) thread_->join();
  thread_.reset();
}

void RedisLeaseKeeper::publish_record(const HolderRecord& record) {
  update_record(holder_record_json(record));
}

void RedisLeaseKeeper::update_record(const std::string& record_json) {
  std::unique_lock<std::mutex> lock(mutex_);
  record_json_ = record_json;
  record_dirty_ = true;
  const std::uint64_t version = ++record_version_;
  const std::uint64_t tried = renewals_tried_;
  wake_.notify_all();
  // Wait for the renewal that carries it, unless nothing renews here (no thread in this process,
  // stopped for a fork) or this is the renewal thread itself (an on_lost callback).
  const bool renewing_here = thread_ && thread_process_ == current_pid() && !stopping_ &&
                             std::this_thread::get_id() != thread_->get_id();
  if (!renewing_here) return;
  published_.wait_for(lock, call_timeout(terms_.ttl), [&] {
    return record_confirmed_ >= version || renewals_tried_ > tried + 1 || stopping_ || lost_.load();
  });
}

void RedisLeaseKeeper::on_lost(std::function<void(const std::string&)> callback) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_lost_ = std::move(callback);
}

bool RedisLeaseKeeper::belongs_to_this_process() const {
  return !thread_ || thread_process_ == current_pid();
}

void RedisLeaseKeeper::prepare_fork() {
  stop();
}

void RedisLeaseKeeper::disown() {
  stop();
  disowned_ = true;
}

void RedisLeaseKeeper::resume_in_child() {
  connections_->abandon_after_fork();
  connections_ =
      std::make_shared<RedisConnectionCache>(connections_->endpoint(), connections_->timeout());
  start();
}

void RedisLeaseKeeper::warn_once(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (warned_) return;
    warned_ = true;
  }
  std::fprintf(stderr, "gpulock: warning: lease %s: %s; retrying\n", terms_.lease_id.c_str(),
               message.c_str());
}

std::uint64_t RedisLeaseKeeper::verify() {
  const auto lost_error = [&](const std::string& why) {
    return Error(ErrorCode::kNotFound, fmt::format("lease {} is lost: {}", terms_.lease_id, why));
  };
  if (lost()) throw lost_error("it was not renewed in time, or was taken or released");
  // The keys' prefix is the version key's ("gpulock:{POOL}:version").
  const std::string prefix =
      terms_.version_key.substr(0, terms_.version_key.size() - std::string_view("version").size());
  std::vector<std::string> command{"MGET"};
  for (const auto& uuid : terms_.uuids) command.push_back(prefix + "lock:" + uuid);
  const bool shared = !terms_.shared_units.empty();
  std::unique_ptr<RedisConnection> own;
  std::optional<RedisConnectionLoan> loan;
  RedisConnection* connection = nullptr;
  if (thread_process_ == current_pid()) {
    loan.emplace(*connections_, call_timeout(terms_.ttl));
    connection = &**loan;
  } else {
    // A forked copy: the cached connections' sockets are the parent's.
    own = RedisConnection::connect(connections_->endpoint(), call_timeout(terms_.ttl));
    connection = own.get();
  }
  const RedisValue reply = connection->command(command);
  for (std::size_t i = 0; i < terms_.uuids.size(); ++i) {
    const RedisValue* value = reply.type == RedisValue::Type::kArray && i < reply.elements.size()
                                  ? &reply.elements[i]
                                  : nullptr;
    if (shared && value != nullptr && value->text == redis_scripts::kSharedMark) {
      // Held by shared leases: this one's reservation must be among them.
      const RedisValue score =
          connection->command({"ZSCORE", prefix + "shares:" + terms_.uuids[i], terms_.lease_id});
      // An error: the GPU's reservation keys are damaged. No lease is given the GPU while they
      // are (every script sees the damage), and renewals keep its mark: this one holds it.
      if (score.type == RedisValue::Type::kString || score.is_error()) continue;
      const std::string why = fmt::format("its reservation on GPU {} is gone", terms_.uuids[i]);
      declare_lost(why);
      throw lost_error(why);
    }
    if (value == nullptr || value->text != terms_.lease_id) {
      const std::string holder =
          value == nullptr || value->is_nil() ? "nobody" : sanitize_for_display(value->text, 40);
      const std::string why = fmt::format("GPU {} is held by {} in Redis", terms_.uuids[i], holder);
      declare_lost(why);
      throw lost_error(why);
    }
  }
  // Confirmed: unless the lease's own clock ran out meanwhile (then lost() already said so).
  if (lost()) throw lost_error("it was not renewed in time");
  return terms_.token;
}

RedisLeaseKeeper::Clock::time_point RedisLeaseKeeper::lost_at() const {
  return Clock::time_point(Clock::duration(confirmed_at_.load())) + terms_.ttl;
}

bool RedisLeaseKeeper::lost() const {
  return lost_.load() || Clock::now() >= lost_at();
}

void RedisLeaseKeeper::declare_lost(const std::string& reason) {
  if (lost_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // so that a waiting update_record() sees it
  }
  published_.notify_all();
  std::function<void(const std::string&)> callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    callback = on_lost_;
  }
  if (callback) {
    callback(reason);
  } else {
    std::fprintf(stderr, "gpulock: warning: lease %s lost: %s. Its GPUs may be given to others.\n",
                 terms_.lease_id.c_str(), reason.c_str());
  }
}

void RedisLeaseKeeper::run() {
  const auto period = terms_.ttl / 3;
  auto retry_pause = std::chrono::milliseconds(100);
  // The first renewal a third of the TTL after the acquire was sent, not after this thread
  // started: a lease taken back after an outage (its acquire's answer was lost) may have used
  // most of its TTL already, and is then renewed at once.
  Clock::time_point next = Clock::time_point(Clock::duration(confirmed_at_.load())) + period;
  std::unique_lock<std::mutex> lock(mutex_);
  const std::string ttl_passed =
      fmt::format("it could not be renewed for its whole TTL ({} ms)", terms_.ttl.count());
  while (!stopping_) {
    const Clock::time_point lost_at = this->lost_at();
    wake_.wait_until(lock, std::min(next, lost_at), [&] {
      return stopping_ || record_dirty_ || Clock::now() >= std::min(next, lost_at);
    });
    if (stopping_) break;
    if (Clock::now() >= lost_at) {
      lock.unlock();
      declare_lost(ttl_passed);
      return;  // a lost lease is not renewed: someone else may hold its GPUs now
    }
    const std::string record = record_json_;
    const std::uint64_t version = record_version_;
    record_dirty_ = false;
    lock.unlock();

    const Clock::time_point sent = Clock::now();
    std::string lost_reason;
    bool renewed = false;
    try {
      const auto timeout =
          std::max(std::chrono::duration_cast<std::chrono::milliseconds>(lost_at - sent),
                   std::chrono::milliseconds(50));
      RedisConnectionLoan connection(*connections_, std::min(timeout, call_timeout(terms_.ttl)));
      std::vector<std::string> args{terms_.lease_id,
                                    std::to_string(terms_.ttl.count()),
                                    std::to_string(terms_.token),
                                    record,
                                    terms_.user,
                                    terms_.gpu_host};
      const bool shared = !terms_.shared_units.empty();
      for (std::size_t i = 0; i < terms_.uuids.size(); ++i) {
        args.push_back(terms_.uuids[i]);
        if (shared) args.push_back(std::to_string(terms_.shared_units[i]));
      }
      const RedisValue reply = connection->run(
          shared ? redis_scripts::kRenewShared : redis_scripts::kRenew, {terms_.version_key}, args);
      const std::string outcome = reply.type == RedisValue::Type::kArray && !reply.elements.empty()
                                      ? reply.elements[0].text
                                      : std::string();
      if (outcome == "ok" || outcome == "restored") {
        renewed = true;
      } else if (outcome == "damaged") {
        renewed = true;
        if (!warned_damage_) {
          warned_damage_ = true;
          std::fprintf(
              stderr,
              "gpulock: warning: lease %s: the reservation keys of GPU %s in Redis are "
              "damaged (see `gpulock doctor`); the lease keeps the GPU, and no other "
              "lease is given it until they are repaired or its shared leases end\n",
              terms_.lease_id.c_str(),
              sanitize_for_display(
                  reply.elements.size() > 1 ? reply.elements[1].text : std::string("?"), 80)
                  .c_str());
        }
      } else if (outcome == "lost") {
        const std::string uuid = reply.elements.size() > 1 ? reply.elements[1].text : "?";
        const std::string holder = reply.elements.size() > 2 ? reply.elements[2].text : "?";
        lost_reason = holder == "released"  ? "it was released by `gpulock release`"
                      : holder == "expired" ? fmt::format("its reservation on GPU {} expired", uuid)
                      : is_lease_id(holder)
                          ? fmt::format("GPU {} is held by another lease ({})", uuid, holder)
                          : fmt::format(
                                "the lock key of GPU {} in Redis was overwritten with something "
                                "that is not a lease (see `gpulock doctor`)",
                                uuid);
      } else {
        warn_once("the renew script gave an unexpected reply");
      }
    } catch (const Error& error) {
      warn_once(fmt::format("cannot renew it: {}", error.what()));
    }
    // A reply that came after the lease's TTL had passed (the process was stopped, or the server
    // was slow) cannot undo the loss: lost() has answered true since then, and the GPUs may
    // have been someone else's meanwhile, even if the script found them free again.
    if (lost_reason.empty() && Clock::now() >= lost_at) lost_reason = ttl_passed;
    if (!lost_reason.empty()) {
      declare_lost(lost_reason);
      return;
    }
    lock.lock();
    ++renewals_tried_;
    if (renewed) record_confirmed_ = version;
    published_.notify_all();
    if (renewed) {
      confirmed_at_ = sent.time_since_epoch().count();
      next = sent + period;
      retry_pause = std::chrono::milliseconds(100);
      if (warned_) {
        warned_ = false;
        std::fprintf(stderr, "gpulock: lease %s: renewed again\n", terms_.lease_id.c_str());
      }
    } else {
      next = Clock::now() + retry_pause;
      retry_pause = std::min(retry_pause * 2, std::max(period / 2, std::chrono::milliseconds(100)));
    }
  }
}

}  // namespace gpulock
