// The cost of one plan of the local queue as it grows: a request that may not wait
// (`--no-wait`) on a machine whose only GPU is held, with N requests already waiting. Its
// acquire() reads the queue's index, plans the queue with itself placed last, and fails: that
// plan is the one every newcomer makes, and the one a served waiter makes in a drain.
//
// The N waiters are registered from this process through a second QueueDirectory (OFD locks of
// different open file descriptions conflict within one process too, so the planning pool sees
// them as live). Issue 12: a plan's cost should not grow with N; side by side with N = 0.
#include <sys/resource.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include <gpulock/gpulock.hpp>

#include "bench_support.h"
#include "local/lock_directory.h"
#include "local/queue_directory.h"
#include "process/process_identity.h"
#include "queue/ticket.h"
#include "util/random_id.h"

namespace {

void raise_open_file_limit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// Registers `waiting` requests of this user for one GPU: any (its candidate is `uuid`) or, when
// `named`, exactly that GPU. What the index holds for `gpulock run -n 1` or `--gpus 0`.
std::vector<gpulock::OwnTicket> queue_waiters(const gpulock::QueueDirectory& queue,
                                              std::size_t waiting, const std::string& uuid,
                                              bool named) {
  std::vector<gpulock::OwnTicket> tickets;
  tickets.reserve(waiting);
  for (std::size_t i = 0; i < waiting; ++i) {
    gpulock::Ticket t;
    t.id = gpulock::make_lease_id();
    t.uid = ::geteuid();
    t.process = gpulock::self_process_id();
    t.needed = 1;
    t.named_gpus = named;
    t.candidates = {uuid};
    tickets.push_back(queue.enter(t));
  }
  return tickets;
}

// Both benchmarks at these queue lengths, side by side with an empty queue.
void queue_sizes(benchmark::internal::Benchmark* b) {
  b->ArgName("waiting")->Arg(0)->Arg(100)->Arg(1000)->Arg(4000);
  b->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true);
}

// The plan behind N waiters for one held GPU; with `churned`, behind a queue as a churn leaves
// it: N times a random waiter leaves and a new one registers, into the slot it freed, with the
// newest seq. The index's slots are then no longer in arrival order, as with hundreds of
// processes that acquire, release and queue again.
void no_wait_plans(benchmark::State& state, bool churned) {
  raise_open_file_limit();
  const auto waiting = static_cast<std::size_t>(state.range(0));
  gpulock_bench::TempDir scratch;
  gpulock::PoolOptions options;
  options.lock_dir = scratch.lock_dir();
  gpulock::GpuPool pool(gpulock::make_simulated_source(1), options);
  gpulock::LeaseRequest request;
  request.count = 1;
  request.wait = false;
  gpulock::Lease holder = pool.acquire(request);

  // The waiters: what the index holds for `gpulock run -n 1` of this user.
  const gpulock::LockDirectory locks = gpulock::LockDirectory::open(scratch.lock_dir());
  const auto queue = gpulock::QueueDirectory::open(locks, true);
  const std::string uuid = holder.gpus().front().uuid;
  std::vector<gpulock::OwnTicket> tickets = queue_waiters(*queue, waiting, uuid, false);
  std::minstd_rand pick(12);
  for (std::size_t round = 0; churned && round < waiting; ++round) {
    gpulock::OwnTicket& leaving = tickets[pick() % waiting];
    leaving.leave();
    leaving = std::move(queue_waiters(*queue, 1, uuid, false).front());
  }

  // A pool of its own, as another process would have (nothing cached from the registrations).
  gpulock::GpuPool planner(gpulock::make_simulated_source(1), options);
  for (auto _ : state) {
    try {
      planner.acquire(request).release();
      state.SkipWithError("acquired a held GPU");
      break;
    } catch (const gpulock::Error& e) {
      if (e.code() != gpulock::ErrorCode::kTimedOut) {
        state.SkipWithError(e.what());
        break;
      }
    }
  }
  state.counters["waiting"] = static_cast<double>(waiting);
}

void BM_NoWaitPlanBehindQueue(benchmark::State& state) {
  no_wait_plans(state, false);
}
BENCHMARK(BM_NoWaitPlanBehindQueue)->Apply(queue_sizes);

void BM_NoWaitPlanBehindChurnedQueue(benchmark::State& state) {
  no_wait_plans(state, true);
}
BENCHMARK(BM_NoWaitPlanBehindChurnedQueue)->Apply(queue_sizes);

// A free GPU that none of the waiters can use: on 2 GPUs, GPU 0 is held and N waiters named it
// (`gpulock run -g 0`); a newcomer for any GPU takes free GPU 1 and releases it. Its plan must
// look past every waiter to learn that nobody ahead of it takes GPU 1.
void BM_FreeGpuBehindNamedWaiters(benchmark::State& state) {
  raise_open_file_limit();
  const auto waiting = static_cast<std::size_t>(state.range(0));
  gpulock_bench::TempDir scratch;
  gpulock::PoolOptions options;
  options.lock_dir = scratch.lock_dir();
  gpulock::GpuPool pool(gpulock::make_simulated_source(2), options);
  gpulock::LeaseRequest first;
  first.gpus = {"0"};
  first.wait = false;
  gpulock::Lease holder = pool.acquire(first);

  const gpulock::LockDirectory locks = gpulock::LockDirectory::open(scratch.lock_dir());
  const auto queue = gpulock::QueueDirectory::open(locks, true);
  const auto tickets = queue_waiters(*queue, waiting, holder.gpus().front().uuid, true);

  gpulock::GpuPool planner(gpulock::make_simulated_source(2), options);
  gpulock::LeaseRequest any;
  any.count = 1;
  any.wait = false;
  for (auto _ : state) {
    try {
      planner.acquire(any).release();
    } catch (const gpulock::Error& e) {
      state.SkipWithError(e.what());
      break;
    }
  }
  state.counters["waiting"] = static_cast<double>(waiting);
}
BENCHMARK(BM_FreeGpuBehindNamedWaiters)->Apply(queue_sizes);

// Reading one waiter's ticket, as a plan does for each waiter it reaches while a GPU is free:
// what `gpulock run -n 1 -- python train.py` registers on a 4-GPU machine, read by
// parse_ticket() (the reader of the form gpulock writes) and, side by side, by the full JSON
// parser alone (what every reading cost before).
gpulock::Ticket typical_ticket() {
  gpulock::Ticket t;
  t.id = gpulock::make_lease_id();
  t.seq = 1234;
  t.uid = 1000;
  t.user = "alice";
  t.process = gpulock::ProcessId{123456, 98765432};
  t.enqueued_at = 1764302400.123456;
  for (int g = 0; g < 4; ++g)
    t.candidates.push_back("GPU-5e1f0a7e-0000-4000-8000-00000000000" + std::to_string(g));
  t.label = "sweep 17/200";
  t.command = "python train.py --lr 0.001 --seed 17";
  return t;
}

void BM_ParseTicket(benchmark::State& state) {
  const std::string text = gpulock::serialize_ticket(typical_ticket());
  const bool full_parser = state.range(0) == 1;
  for (auto _ : state)
    benchmark::DoNotOptimize(full_parser ? gpulock::parse_ticket_with_full_parser(text)
                                         : gpulock::parse_ticket(text));
  state.SetLabel(full_parser ? "full JSON parser" : "parse_ticket");
}
BENCHMARK(BM_ParseTicket)->ArgName("full_parser")->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
