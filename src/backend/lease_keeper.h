// LeaseKeeper: how a backend keeps a granted lease, behind one small interface.
//
// The local backend's keeper is the lease's kernel-locked descriptors (local/local_lease_keeper.h):
// nothing can take the lease away, and a child that inherits the descriptors shares it. The Redis
// backend's keeper renews the lease's keys from a thread (redis/redis_lease_keeper.h), and the
// lease is lost if it cannot. A Lease owns one keeper; destroying the keeper ends its hold.
//
// Fork: a keeper belongs to the process that acquired. `gpulock acquire --for-pid` hands it to
// the detached holder across a fork: prepare_fork(), then disown() in the parent and
// resume_in_child() in the child.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "backend/holder_record.h"

namespace gpulock {

class LeaseKeeper {
 public:
  virtual ~LeaseKeeper() = default;  // ends this process's hold on the lease unless disowned

  // Makes the holder's details visible to others (`gpulock status`, `gpulock release`). A
  // failure (a full disk) loses only these details, never the lease; it is reported on stderr.
  virtual void publish_record(const HolderRecord& record) = 0;
  // The descriptors that hold the lease; a child process that inherits them keeps it. Empty
  // where the lease is not held by descriptors.
  virtual std::span<const int> lock_fds() const = 0;
  // The lease's fencing token, strictly increasing per pool; 0 where there is none.
  virtual std::uint64_t fencing_token() const = 0;
  // The host whose GPUs these are, where the backend spans hosts; "" otherwise.
  virtual const std::string& gpu_host() const = 0;

  // Asks the backend, in one round trip, whether the lease still holds every one of its GPUs, and
  // returns its fencing token. Throws Error(kNotFound) when it does not (lost() is true from then
  // on), kEnvironment when the backend cannot be asked. A lease the kernel holds asks nothing.
  virtual std::uint64_t verify() = 0;
  // True once the lease is known lost: it expired before it could be renewed, or another lease
  // holds one of its GPUs. A lost lease stays lost. Never, for a lease the kernel holds.
  virtual bool lost() const = 0;
  // Called (from a background thread) when the lease is lost, with the reason; without a
  // callback the keeper prints a warning on stderr.
  virtual void on_lost(std::function<void(const std::string& reason)> callback) = 0;

  // Fork: stop any background work (no lock is held across fork); then the parent disowns the
  // lease (it no longer renews or releases it) and the child resumes with its own resources.
  virtual void prepare_fork() = 0;
  // False in a process forked without prepare_fork() (Python's multiprocessing, a C fork): that
  // copy must not even be destroyed, since its thread's mutex and condition variable were in use
  // by a thread that does not exist there; the Lease leaks it.
  virtual bool belongs_to_this_process() const = 0;
  virtual void disown() = 0;
  virtual void resume_in_child() = 0;
};

}  // namespace gpulock
