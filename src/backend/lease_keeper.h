// LeaseKeeper: what keeps a lease alive when the kernel does not (the Redis backend): it renews
// the lease while the Lease exists and releases it when destroyed.
//
// Local leases have no keeper: their lock descriptors are the lease. A keeper belongs to the
// process that acquired; `gpulock acquire --for-pid` hands it to the detached holder across a
// fork (prepare_fork, then disown in the parent and resume_in_child in the child).
#pragma once

#include <functional>
#include <string>

namespace gpulock {

class LeaseKeeper {
 public:
  virtual ~LeaseKeeper() = default;  // releases the lease unless disowned
  // The holder's details (JSON HolderRecord) to publish with the next renewal, done at once.
  virtual void update_record(const std::string& record_json) = 0;
  // True once the lease is known lost: it expired before it could be renewed, or another lease
  // holds one of its GPUs. A lost lease stays lost.
  virtual bool lost() const = 0;
  // Called (from the keeper's thread) when the lease is lost, with the reason; without a
  // callback the keeper prints a warning on stderr.
  virtual void on_lost(std::function<void(const std::string& reason)> callback) = 0;
  // Fork: stop renewing (no lock is held across fork); then the parent disowns the lease (it no
  // longer renews or releases it) and the child resumes renewing with its own connection.
  virtual void prepare_fork() = 0;
  // False in a process forked without prepare_fork() (Python's multiprocessing, a C fork): that
  // copy must not even be destroyed, since its thread's mutex and condition variable were in use
  // by a thread that does not exist there; the Lease leaks it.
  virtual bool belongs_to_this_process() const = 0;
  virtual void disown() = 0;
  virtual void resume_in_child() = 0;
};

}  // namespace gpulock
