// Running programs under a lease: `gpulock run` and `gpulock acquire` as library calls.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "gpulock/gpu_pool.hpp"
#include "gpulock/lease.hpp"

namespace gpulock {

// The environment a leased command gets, as NAME=VALUE pairs: CUDA_VISIBLE_DEVICES,
// CUDA_DEVICE_ORDER=PCI_BUS_ID, GPULOCK_LEASE_ID and GPULOCK_GPUS; on the Redis backend also
// GPULOCK_FENCING_TOKEN and GPULOCK_LEASE_HOST (the host whose GPUs these are; GPULOCK_HOST
// is not set, since it names the host gpulock itself registers as).
std::vector<std::pair<std::string, std::string>> lease_environment(const Lease& lease,
                                                                   VisibleFormat format);

// Runs argv (looked up in PATH) with the lease environment, handing it the lease's lock
// descriptors so the GPUs stay leased while any process of its tree holds them, even if this
// process dies. Signals sent to this process (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
// SIGUSR2) are forwarded, except those a terminal already sent to the whole process group.
// Returns the command's exit status, or 128+N if a signal N killed it; 127 if it was not found,
// 126 if it could not be executed (with a message on stderr).
// REQUIRES: a single-threaded caller (it forks and manages the signal mask).
//
// On the Redis backend this process renews the lease while the command runs. If the lease is
// lost (not renewable for a whole TTL, or taken over), `on_loss` decides: kWarn prints a
// warning and lets the command run; kKill sends it SIGTERM, then SIGKILL after
// kLeaseLossGrace, and the command's status is returned as usual (143 for SIGTERM).
enum class LeaseLossAction { kWarn, kKill };
inline constexpr int kLeaseLossGraceSeconds = 10;
//
// `check`, when set, is called every `check_period` while the command runs; when it returns
// true the command is stopped as for a lost lease with kKill (SIGTERM, then SIGKILL).
//
// `dies_with_runner`: the command gets SIGKILL if this process dies first (a job's supervisor:
// its job must not run on unsupervised). Its own children are not covered.
int run_command(Lease& lease, const std::vector<std::string>& argv, VisibleFormat format,
                LeaseLossAction on_loss = LeaseLossAction::kWarn,
                const std::function<bool()>& check = {},
                std::chrono::milliseconds check_period = std::chrono::seconds(2),
                bool dies_with_runner = false);

// A shared lease's memory watch, for run_command's `check`: reads the pool's status, and when
// the lease's processes use more memory on one of its GPUs than it reserved, prints a warning
// (once, until it is back within) and, with kTerm, asks to stop the command.
enum class OverMemoryAction { kWarn, kTerm };
std::function<bool()> over_memory_check(GpuPool& pool, const Lease& lease, OverMemoryAction action);

// Hands the lease to a detached holder process (its own session, no terminal) that keeps it
// until `watched_pid` exits or `gpulock release` stops it, and returns the holder's pid once it
// holds the lease. Throws Error(kInvalidArgument) if watched_pid is not a running process.
// REQUIRES: a single-threaded caller.
pid_t detach_lease(Lease& lease, pid_t watched_pid);

// Checks `pid` as the process to hold a detached lease for, before waiting for GPUs: throws
// Error(kInvalidArgument) where the lease would end at once (no such process, or the caller
// itself: `$BASHPID` inside `$(…)` or `<(…)` names the process that runs gpulock), and returns
// warnings where it is likely to end too early (pid writes to the same pipe as the caller's
// standard output: a subshell of the same `$(…)` or `<(…)`).
std::vector<std::string> check_detached_owner(pid_t pid);
// True if `pid` is a strict ancestor of the calling process (its parent, the parent's parent…).
bool is_ancestor_of_caller(pid_t pid);

// The same, held for the caller's session instead (`gpulock acquire` without --for-pid): until
// `gpulock release` or until no process of that session is left, however its processes are
// arranged (background subshells, `nohup`, a shell that has exited while its jobs run on).
// Throws Error(kInvalidArgument) if the caller is the only process of its session.
// REQUIRES: a single-threaded caller.
pid_t detach_lease_for_session(Lease& lease);

}  // namespace gpulock
