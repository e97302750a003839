// The usability hint of a queue index slot, and the sieve of waiters behind a plan's head.
#include "local/usability_hint.h"

#include "backend/device_fitness.h"

namespace gpulock {
namespace {

constexpr std::uint8_t kKnown = 1;
constexpr std::uint8_t kForeignCheckOnly = 2;
constexpr std::uint8_t kAllowForeign = 4;

}  // namespace

std::uint64_t UsabilityHint::bit_of(std::string_view uuid) {
  // FNV-1a: fixed, so that every process and version sets the same bit for a UUID.
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : uuid) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return std::uint64_t{1} << (h % kCandidateBits);
}

UsabilityHint UsabilityHint::of(const Ticket& ticket) {
  UsabilityHint hint;
  hint.known = true;
  hint.foreign_check_only =
      !ticket.min_free_memory_bytes && !ticket.max_utilization_percent && !ticket.max_power_watts;
  hint.allow_foreign = ticket.allow_foreign_processes;
  for (const auto& uuid : ticket.candidates) hint.candidate_bits |= bit_of(uuid);
  return hint;
}

std::array<std::uint8_t, UsabilityHint::kStoredSize> UsabilityHint::stored() const {
  std::array<std::uint8_t, kStoredSize> bytes{};
  if (!known) return bytes;
  bytes[0] = static_cast<std::uint8_t>(kKnown | (foreign_check_only ? kForeignCheckOnly : 0) |
                                       (allow_foreign ? kAllowForeign : 0));
  for (std::size_t i = 1; i < kStoredSize; ++i)
    bytes[i] = static_cast<std::uint8_t>(candidate_bits >> (8 * (i - 1)));
  return bytes;
}

UsabilityHint UsabilityHint::from_stored(const std::array<std::uint8_t, kStoredSize>& bytes) {
  UsabilityHint hint;
  if ((bytes[0] & kKnown) == 0 || (bytes[0] & ~(kKnown | kForeignCheckOnly | kAllowForeign)) != 0)
    return hint;
  hint.known = true;
  hint.foreign_check_only = (bytes[0] & kForeignCheckOnly) != 0;
  hint.allow_foreign = (bytes[0] & kAllowForeign) != 0;
  for (std::size_t i = 1; i < kStoredSize; ++i)
    hint.candidate_bits |= std::uint64_t{bytes[i]} << (8 * (i - 1));
  return hint;
}

bool UsabilityHint::admits(const UsabilityHint& exact) const {
  if (!known) return true;
  if ((candidate_bits & exact.candidate_bits) != exact.candidate_bits) return false;
  return !foreign_check_only ||
         (exact.foreign_check_only && (allow_foreign || !exact.allow_foreign));
}

ClaimSieve::ClaimSieve(const std::vector<ClaimableGpu>& claimable,
                       const std::function<const Device*(const std::string&)>& device_of) {
  for (const ClaimableGpu& o : claimable) {
    Gpu& g = gpus_.emplace_back();
    g.bit = UsabilityHint::bit_of(o.uuid);
    g.whole = o.whole;
    g.shared_use = o.shared_use;
    if (const Device* d = device_of(o.uuid)) {
      for (const bool allow : {false, true}) {
        LeaseRequest filter;
        filter.allow_foreign_processes = allow;
        g.fails_default_filter[allow ? 1 : 0] = !unready_reason(*d, filter).empty();
      }
    }
    any_bits_ |= g.bit;
  }
}

bool ClaimSieve::may_claim(const UsabilityHint& hint, bool shared_request,
                           bool* refused_by_health) const {
  if (!hint.known) return true;
  if ((hint.candidate_bits & any_bits_) == 0) return false;
  bool unhealthy = false;
  for (const Gpu& g : gpus_) {
    if ((hint.candidate_bits & g.bit) == 0) continue;
    // A shared request reserves the GPUs it waits on whatever their health; an exclusive one
    // holds back GPUs in shared use so that they drain.
    if (shared_request || g.shared_use) return true;
    if (!g.whole) continue;
    if (!(hint.foreign_check_only && g.fails_default_filter[hint.allow_foreign])) return true;
    unhealthy = true;
  }
  if (unhealthy && refused_by_health) *refused_by_health = true;
  return false;
}

}  // namespace gpulock
