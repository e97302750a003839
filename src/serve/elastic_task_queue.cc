// ElasticTaskQueue (serve/elastic_task_queue.h): a thread per task in flight, up to a limit.
#include "serve/elastic_task_queue.h"

#include <algorithm>
#include <system_error>

namespace gpulock::serve {

ElasticTaskQueue::ElasticTaskQueue(std::size_t max_threads)
    : max_threads_(std::max<std::size_t>(1, max_threads)) {}

ElasticTaskQueue::~ElasticTaskQueue() {
  shutdown();
}

void ElasticTaskQueue::enqueue(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_.push_back(std::move(task));
  // Every waiting thread is already spoken for by a queued task: one more is needed.
  if (idle_ < tasks_.size() && threads_.size() < max_threads_) {
    try {
      threads_.emplace_back([this] { work(); });
    } catch (const std::system_error&) {
      // Out of threads for now: the task waits for a running one, if there is any.
      if (threads_.empty()) throw;
    }
  }
  ready_.notify_one();
}

void ElasticTaskQueue::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  ready_.notify_all();
  for (auto& thread : threads) thread.join();
}

void ElasticTaskQueue::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace gpulock::serve
