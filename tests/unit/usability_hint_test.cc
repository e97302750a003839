// UsabilityHint (src/local/usability_hint.h): what a queue index slot says of its request's
// candidates and health filters, and the sieve that passes over waiters behind a plan's head.
#include "local/usability_hint.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

namespace gpulock {
namespace {

const std::string kA = "GPU-5e1f0a7e-0000-4000-8000-000000000000";
const std::string kB = "GPU-5e1f0a7e-0000-4000-8000-000000000001";

UsabilityHint HintOf(std::vector<std::string> candidates, bool allow_foreign = false,
                     bool other_filter = false) {
  Ticket t;
  t.candidates = std::move(candidates);
  t.allow_foreign_processes = allow_foreign;
  if (other_filter) t.min_free_memory_bytes = 1;
  return UsabilityHint::of(t);
}

TEST(UsabilityHint, KeepsItsFieldsThroughTheSlotsSixBytes) {
  for (const UsabilityHint& hint :
       {HintOf({kA}), HintOf({kA, kB}, true), HintOf({kB}, false, true), HintOf({})}) {
    EXPECT_TRUE(hint.known);
    EXPECT_EQ(UsabilityHint::from_stored(hint.stored()), hint);
  }
  EXPECT_FALSE(HintOf({kA}, false, true).foreign_check_only);
  EXPECT_TRUE(HintOf({kA}, true).allow_foreign);
}

TEST(UsabilityHint, ZeroOrUnknownFlagsAreUnknown) {
  EXPECT_FALSE(UsabilityHint::from_stored({}).known) << "slots of versions before hints";
  std::array<std::uint8_t, UsabilityHint::kStoredSize> bytes = HintOf({kA}).stored();
  bytes[0] |= 0x80;
  EXPECT_FALSE(UsabilityHint::from_stored(bytes).known);
  EXPECT_EQ(UsabilityHint::from_stored({}), UsabilityHint());
  EXPECT_FALSE(UsabilityHint().stored()[0]) << "an unknown hint is stored as zero";
}

TEST(UsabilityHint, TheBitOfAUuidIsFixedAcrossVersions) {
  // Slots written by one version are read by another: the hash must never change.
  // FNV-1a 64 of the UUID, modulo 40 (computed apart from the code under test).
  EXPECT_EQ(UsabilityHint::bit_of(kA), std::uint64_t{1} << 2);
  EXPECT_EQ(UsabilityHint::bit_of(kB), std::uint64_t{1} << 13);
  const UsabilityHint hint = HintOf({kA, kB});
  EXPECT_EQ(hint.candidate_bits, UsabilityHint::bit_of(kA) | UsabilityHint::bit_of(kB));
  EXPECT_LT(hint.candidate_bits, std::uint64_t{1} << UsabilityHint::kCandidateBits);
}

TEST(UsabilityHint, ASlotAdmitsItsTicketOnlyIfItRulesOutNothingTheTicketCouldUse) {
  const UsabilityHint exact = HintOf({kA});
  EXPECT_TRUE(exact.admits(exact));
  EXPECT_TRUE(UsabilityHint().admits(exact)) << "no hint rules out nothing";
  EXPECT_TRUE(HintOf({kA, kB}).admits(exact)) << "more candidates";
  EXPECT_TRUE(HintOf({kA}, false, true).admits(exact)) << "health not judged";
  EXPECT_TRUE(HintOf({kA}, true).admits(exact)) << "allows what the ticket refuses";
  EXPECT_FALSE(HintOf({kB}).admits(exact)) << "a candidate missing";
  EXPECT_FALSE(exact.admits(HintOf({kA}, true))) << "refuses what the ticket allows";
  EXPECT_FALSE(exact.admits(HintOf({kA}, false, true))) << "judges a filter it does not know";
}

class ClaimSieveTest : public ::testing::Test {
 protected:
  ClaimSieveTest() {
    devices_.resize(2);
    devices_[0].uuid = kA;
    devices_[1].uuid = kB;
    devices_[1].processes.push_back(GpuProcess{4711, std::nullopt});  // outside gpulock
  }
  ClaimSieve Sieve(std::vector<ClaimableGpu> open) const {
    return ClaimSieve(open, [this](const std::string& uuid) -> const Device* {
      for (const Device& d : devices_)
        if (d.uuid == uuid) return &d;
      return nullptr;
    });
  }
  std::vector<Device> devices_;
};

TEST_F(ClaimSieveTest, PassesOverOnlyWhomNoOpenGpuCouldServe) {
  ASSERT_NE(UsabilityHint::bit_of(kA), UsabilityHint::bit_of(kB)) << "the test needs two bits";
  const ClaimSieve free_a = Sieve({{kA, true, false}});
  EXPECT_TRUE(free_a.may_claim(HintOf({kA}), false));
  EXPECT_TRUE(free_a.may_claim(HintOf({kA, kB}), false));
  EXPECT_FALSE(free_a.may_claim(HintOf({kB}), false)) << "not a candidate";
  EXPECT_FALSE(free_a.may_claim(HintOf({kB}), true));
  EXPECT_TRUE(free_a.may_claim(UsabilityHint(), false)) << "unknown: its ticket is read";
  EXPECT_FALSE(Sieve({}).may_claim(HintOf({kA, kB}), false));
}

TEST_F(ClaimSieveTest, JudgesTheDefaultFilterOnlyForWhomItIsTheOnlyOne) {
  const ClaimSieve free_b = Sieve({{kB, true, false}});  // runs a process outside gpulock
  bool refused_by_health = false;
  EXPECT_FALSE(free_b.may_claim(HintOf({kB}), false, &refused_by_health));
  EXPECT_TRUE(refused_by_health) << "the dispatchers then re-read the devices";
  refused_by_health = false;
  EXPECT_FALSE(free_b.may_claim(HintOf({kA}), false, &refused_by_health));
  EXPECT_FALSE(refused_by_health) << "not a candidate: its health is not the reason";
  EXPECT_TRUE(free_b.may_claim(HintOf({kB}, true), false)) << "--allow-foreign";
  EXPECT_TRUE(free_b.may_claim(HintOf({kB}, false, true), false)) << "another filter: unknown";
  // A shared request reserves the GPUs it waits on whatever their health.
  EXPECT_TRUE(free_b.may_claim(HintOf({kB}), true));
}

TEST_F(ClaimSieveTest, GpusInSharedUseOrPartlyGiven) {
  // In shared use (with memory left or not): an exclusive request holds it back so that it
  // drains, a shared one waits on it.
  EXPECT_TRUE(Sieve({{kB, false, true}}).may_claim(HintOf({kB}), false));
  EXPECT_TRUE(Sieve({{kB, false, true}}).may_claim(HintOf({kB}), true));
  // Free, with part of it given in this plan: only shared requests may use it.
  const ClaimSieve part_given = Sieve({{kA, false, false}});
  EXPECT_FALSE(part_given.may_claim(HintOf({kA}), false));
  EXPECT_TRUE(part_given.may_claim(HintOf({kA}), true));
}

}  // namespace
}  // namespace gpulock
