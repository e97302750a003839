// Lease: move-only ownership of GPU locks.
#include "gpulock/lease.hpp"

#include <sys/stat.h>

#include <cstdio>

#include "lease_impl.h"
#include "local/gpu_lock_file.h"
#include "process/process_identity.h"
#include "backend/visible_devices.h"

namespace gpulock {

Lease::Impl::~Impl() {
  // A forked copy of a Redis lease's keeper stays untouched (see LeaseKeeper): the lease is the
  // renewing process's.
  if (keeper && !keeper->belongs_to_this_process()) (void)keeper.release();
  keeper.reset();  // releases a Redis lease; a local one goes with its descriptors
}

void Lease::Impl::write_records() {
  if (keeper) {
    keeper->update_record(holder_record_json(record));
    return;
  }
  const std::string bytes = serialize_holder_record(record);
  for (const auto& fd : fds) {
    // A lock file with other hard links may be someone's file too: lock it, never write it.
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || st.st_nlink != 1) continue;
    if (const auto problem = write_record_bytes(fd.get(), bytes)) {
      std::fprintf(stderr, "gpulock: warning: lease %s: %s (the lease itself is held)\n",
                   id.c_str(), problem->c_str());
      return;
    }
  }
}

Lease::Lease() = default;
Lease::Lease(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Lease::Lease(Lease&&) noexcept = default;
Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
Lease::~Lease() {
  release();
}

bool Lease::active() const {
  return impl_ != nullptr;
}

const std::string& Lease::id() const {
  static const std::string empty;
  return impl_ ? impl_->id : empty;
}

const std::vector<LeasedGpu>& Lease::gpus() const {
  static const std::vector<LeasedGpu> empty;
  return impl_ ? impl_->gpus : empty;
}

std::chrono::system_clock::time_point Lease::started_at() const {
  return impl_ ? impl_->started_at : std::chrono::system_clock::time_point{};
}

std::string Lease::cuda_visible_devices(VisibleFormat format) const {
  return format_visible_devices(gpus(), format);
}

std::string Lease::uuid_list() const {
  std::string out;
  for (const auto& gpu : gpus()) {
    if (!out.empty()) out += ',';
    out += gpu.uuid;
  }
  return out;
}

std::span<const int> Lease::lock_fds() const {
  if (!impl_) return {};
  return impl_->raw_fds;
}

std::uint64_t Lease::fencing_token() const {
  return impl_ ? impl_->fencing_token : 0;
}

const std::string& Lease::host() const {
  static const std::string empty;
  return impl_ ? impl_->host : empty;
}

bool Lease::lost() const {
  return impl_ && impl_->keeper && impl_->keeper->lost();
}

void Lease::on_lost(std::function<void(const std::string&)> callback) {
  if (impl_ && impl_->keeper) impl_->keeper->on_lost(std::move(callback));
}

void Lease::set_holder(pid_t holder_pid, const std::string& kind, pid_t member) {
  if (!impl_) return;
  impl_->record.holder = process_id_of(holder_pid).value_or(ProcessId{holder_pid, 0});
  impl_->record.kind = kind == "run"        ? HolderKind::kRun
                       : kind == "detached" ? HolderKind::kDetached
                                            : HolderKind::kProcess;
  if (member > 0) {
    if (const auto id = process_id_of(member)) impl_->record.members.push_back(*id);
  }
  impl_->write_records();
}

void Lease::add_member(pid_t pid) {
  if (!impl_) return;
  if (const auto id = process_id_of(pid)) {
    impl_->record.members.push_back(*id);
    impl_->write_records();
  }
}

void Lease::release() {
  // Closing the descriptors drops this process's share of the locks; the kernel releases each
  // lock when its last descriptor (in any process) is closed.
  impl_.reset();
}

}  // namespace gpulock
