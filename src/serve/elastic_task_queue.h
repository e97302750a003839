// ElasticTaskQueue: the task queue `gpulock serve` gives cpp-httplib, which hands it one task per
// accepted connection. It starts another thread whenever every thread is busy, up to a limit,
// so that idle or slow connections (a browser's preconnected sockets, a stalled client), each of
// which holds its thread until the read timeout, cannot make everyone else wait: with httplib's
// fixed pool, as many idle connections as threads stopped the server for seconds at a time.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace gpulock::serve {

class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  // `max_threads`: at most this many threads (then tasks wait their turn); at least 1.
  explicit ElasticTaskQueue(std::size_t max_threads);
  ~ElasticTaskQueue() override;  // shutdown()

  void enqueue(std::function<void()> task) override;
  // Runs the tasks already queued, then joins every thread. Called by httplib once it stops
  // accepting; idempotent.
  void shutdown() override;

 private:
  void work();

  const std::size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;  // threads waiting for a task
  bool stopping_ = false;
};

}  // namespace gpulock::serve
