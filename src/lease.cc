// Lease: move-only ownership of a granted lease; its backend's keeper does the holding.
#include "gpulock/lease.hpp"

#include "backend/lease_state.h"
#include "backend/visible_devices.h"
#include "gpulock/error.hpp"
#include "process/process_identity.h"

namespace gpulock {

LeaseState::~LeaseState() {
  journal_lease_end(*this);
  // A forked copy of a keeper that renews from a thread stays untouched (see LeaseKeeper): the
  // lease is the renewing process's.
  if (keeper && !keeper->belongs_to_this_process()) (void)keeper.release();
}

Lease::Lease() = default;
Lease::Lease(std::unique_ptr<LeaseState> state) : state_(std::move(state)) {}
Lease::Lease(Lease&&) noexcept = default;
Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
  }
  return *this;
}
Lease::~Lease() {
  release();
}

bool Lease::active() const {
  return state_ != nullptr;
}

const std::string& Lease::id() const {
  static const std::string empty;
  return state_ ? state_->id : empty;
}

const std::vector<LeasedGpu>& Lease::gpus() const {
  static const std::vector<LeasedGpu> empty;
  return state_ ? state_->gpus : empty;
}

std::chrono::system_clock::time_point Lease::started_at() const {
  return state_ ? state_->started_at : std::chrono::system_clock::time_point{};
}

std::uint64_t Lease::memory_bytes() const {
  return state_ ? state_->record.memory_bytes.value_or(0) : 0;
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
  return state_ ? state_->keeper->lock_fds() : std::span<const int>{};
}

std::uint64_t Lease::fencing_token() const {
  return state_ ? state_->keeper->fencing_token() : 0;
}

const std::string& Lease::host() const {
  static const std::string empty;
  return state_ ? state_->keeper->gpu_host() : empty;
}

std::uint64_t Lease::verify() {
  if (!state_) throw Error(ErrorCode::kInvalidArgument, "the lease was released");
  return state_->keeper->verify();
}

bool Lease::lost() const {
  return state_ && state_->keeper->lost();
}

void Lease::on_lost(std::function<void(const std::string&)> callback) {
  if (state_) state_->keeper->on_lost(std::move(callback));
}

void Lease::set_holder(pid_t holder_pid, const std::string& kind, pid_t member, pid_t session) {
  if (!state_) return;
  HolderRecord& record = state_->record;
  record.holder = process_id_of(holder_pid).value_or(ProcessId{holder_pid, 0});
  record.kind = kind == "run"        ? HolderKind::kRun
                : kind == "detached" ? HolderKind::kDetached
                                     : HolderKind::kProcess;
  if (member > 0) {
    if (const auto id = process_id_of(member)) record.members.push_back(*id);
  }
  record.session = session > 0 ? session : 0;
  state_->keeper->publish_record(record);
}

void Lease::add_member(pid_t pid) {
  if (!state_) return;
  if (const auto id = process_id_of(pid)) {
    state_->record.members.push_back(*id);
    state_->keeper->publish_record(state_->record);
  }
}

void Lease::set_outcome(const CommandOutcome& outcome) {
  if (state_) state_->outcome = outcome;
}

std::optional<CommandOutcome> Lease::outcome() const {
  return state_ ? state_->outcome : std::nullopt;
}

void Lease::release() {
  // Destroying the keeper ends this process's hold: a local lease's descriptors close (the
  // kernel releases each lock when its last descriptor, in any process, is closed); a Redis
  // lease is released.
  state_.reset();
}

}  // namespace gpulock
