// Choosing which free GPUs to lease (src/selection.h): lowest indices without topology, close
// GPUs when there is one, ties to the lowest indices, and the greedy path for large machines.
#include "queue/selection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gpulock {
namespace {

using Positions = std::vector<std::size_t>;

std::vector<std::string> Uuids(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back("GPU-" + std::to_string(i));
  return out;
}

int Flat(const std::string&, const std::string&) {
  return 50;
}

// Distances of GPUs on PCIe switches: 10 on the same switch, 50 across; missing: no switch.
DistanceFunction Switches(std::map<std::string, int> switch_of) {
  return [switch_of = std::move(switch_of)](const std::string& a, const std::string& b) {
    if (a == b) return 0;
    const auto ia = switch_of.find(a), ib = switch_of.find(b);
    if (ia == switch_of.end() || ib == switch_of.end()) return 50;
    return ia->second == ib->second ? 10 : 50;
  };
}

// Switch number i for GPU-i, from a list.
DistanceFunction SwitchList(const std::vector<int>& switches) {
  std::map<std::string, int> switch_of;
  for (std::size_t i = 0; i < switches.size(); ++i)
    if (switches[i] >= 0) switch_of["GPU-" + std::to_string(i)] = switches[i];
  return Switches(std::move(switch_of));
}

void ExpectDistinctAscending(const Positions& positions, std::size_t count, std::size_t n) {
  ASSERT_EQ(positions.size(), count);
  EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end()));
  EXPECT_EQ(std::set<std::size_t>(positions.begin(), positions.end()).size(), count);
  for (std::size_t p : positions) EXPECT_LT(p, n);
}

TEST(ChooseGpusTest, LowestIndicesWithoutTopology) {
  EXPECT_EQ(choose_gpus(Uuids(4), 1, Flat), (Positions{0}));
  EXPECT_EQ(choose_gpus(Uuids(4), 2, Flat), (Positions{0, 1}));
  EXPECT_EQ(choose_gpus(Uuids(8), 3, Flat), (Positions{0, 1, 2}));
}

TEST(ChooseGpusTest, AllWhenCountEqualsFree) {
  EXPECT_EQ(choose_gpus(Uuids(3), 3, SwitchList({0, 1, 0})), (Positions{0, 1, 2}));
}

TEST(ChooseGpusTest, TooFewIsNullopt) {
  EXPECT_EQ(choose_gpus(Uuids(3), 4, Flat), std::nullopt);
  EXPECT_EQ(choose_gpus({}, 1, Flat), std::nullopt);
}

TEST(ChooseGpusTest, ZeroIsNullopt) {
  EXPECT_EQ(choose_gpus(Uuids(3), 0, Flat), std::nullopt);
}

TEST(ChooseGpusTest, PrefersPairsOnTheSameSwitch) {
  // GPUs 0 and 2 share switch 0, 1 and 3 share switch 1.
  EXPECT_EQ(choose_gpus(Uuids(4), 2, SwitchList({0, 1, 0, 1})), (Positions{0, 2}));
  // Only 1 and 3 share a switch.
  EXPECT_EQ(choose_gpus(Uuids(4), 2, SwitchList({0, 1, 2, 1})), (Positions{1, 3}));
  // GPUs without a known switch are far from everyone.
  EXPECT_EQ(choose_gpus(Uuids(5), 2, SwitchList({-1, -1, 7, -1, 7})), (Positions{2, 4}));
}

TEST(ChooseGpusTest, PrefersTheSetWithTheSmallestWorstDistance) {
  // Three on switch 1 (3, 4, 5) beat any set spanning switches.
  EXPECT_EQ(choose_gpus(Uuids(6), 3, SwitchList({0, 0, 2, 1, 1, 1})), (Positions{3, 4, 5}));
  // No three share a switch: the worst distance is 50 for all sets, so the total decides:
  // {0, 1, x} has one close pair, like every set with a pair; the lowest such set wins.
  EXPECT_EQ(choose_gpus(Uuids(4), 3, SwitchList({0, 0, 1, 1})), (Positions{0, 1, 2}));
}

TEST(ChooseGpusTest, TiesGoToTheLowestIndices) {
  EXPECT_EQ(choose_gpus(Uuids(4), 2, SwitchList({0, 0, 1, 1})), (Positions{0, 1}));
  EXPECT_EQ(choose_gpus(Uuids(6), 2, SwitchList({0, 1, 2, 2, 1, 0})), (Positions{0, 5}));
  EXPECT_EQ(choose_gpus(Uuids(8), 4, SwitchList({0, 0, 0, 0, 1, 1, 1, 1})),
            (Positions{0, 1, 2, 3}));
}

TEST(ChooseGpusTest, SingleGpuIsTheLowestWhateverTheTopology) {
  EXPECT_EQ(choose_gpus(Uuids(4), 1, SwitchList({0, 1, 1, 1})), (Positions{0}));
}

TEST(ChooseGpusTest, AsksOnlyAboutTheGivenGpus) {
  const std::vector<std::string> free = {"GPU-a", "GPU-b", "GPU-c"};
  std::set<std::string> asked;
  const auto result = choose_gpus(free, 2, [&](const std::string& a, const std::string& b) {
    asked.insert(a);
    asked.insert(b);
    return a == "GPU-b" || b == "GPU-b" ? 50 : 10;
  });
  EXPECT_EQ(result, (Positions{0, 2}));
  EXPECT_EQ(asked, (std::set<std::string>{"GPU-a", "GPU-b", "GPU-c"}));
}

TEST(ChooseGpusTest, LargeMachineGreedyPathReturnsDistinctAscendingPositions) {
  // C(64, 8) is far beyond the exhaustive limit. Switches: GPU i is on switch i % 8, so the
  // close sets are {0, 8, ..., 56}, {1, 9, ..., 57}, ...
  const std::size_t n = 64, count = 8;
  std::vector<int> switches(n);
  for (std::size_t i = 0; i < n; ++i) switches[i] = static_cast<int>(i % 8);
  const auto distance = SwitchList(switches);
  const auto result = choose_gpus(Uuids(n), count, distance);
  ASSERT_TRUE(result.has_value());
  ExpectDistinctAscending(*result, count, n);
  for (std::size_t p : *result) EXPECT_EQ(switches[p], switches[result->front()]) << p;
  EXPECT_EQ(result->front(), 0u);  // the lowest of the equally good sets
}

TEST(ChooseGpusTest, LargeMachineGreedyPathWithMixedTopology) {
  const std::size_t n = 100;
  std::vector<int> switches(n);
  for (std::size_t i = 0; i < n; ++i) switches[i] = i % 3 == 0 ? -1 : static_cast<int>(i % 7);
  for (std::size_t count : {std::size_t{5}, std::size_t{17}, std::size_t{50}, std::size_t{99}}) {
    const auto result = choose_gpus(Uuids(n), count, SwitchList(switches));
    ASSERT_TRUE(result.has_value()) << count;
    ExpectDistinctAscending(*result, count, n);
  }
}

TEST(ChooseGpusTest, LargeMachineWithoutTopologyTakesLowestIndices) {
  const auto result = choose_gpus(Uuids(128), 16, Flat);
  ASSERT_TRUE(result.has_value());
  Positions expected(16);
  for (std::size_t i = 0; i < 16; ++i) expected[i] = i;
  EXPECT_EQ(*result, expected);
}

}  // namespace
}  // namespace gpulock
