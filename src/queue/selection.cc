// GPU set selection: exhaustive over small choices, greedy beyond.
#include "queue/selection.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace gpulock {
namespace {

constexpr std::size_t kMaxExhaustiveSets = 20000;

struct Score {
  int worst = 0;
  long total = 0;
  bool operator<(const Score& other) const {
    return worst != other.worst ? worst < other.worst : total < other.total;
  }
};

std::size_t combinations(std::size_t n, std::size_t k) {
  std::size_t result = 1;
  for (std::size_t i = 1; i <= k; ++i) {
    result = result * (n - k + i) / i;
    if (result > kMaxExhaustiveSets) return result;
  }
  return result;
}

}  // namespace

std::optional<std::vector<std::size_t>> choose_gpus(const std::vector<std::string>& free_uuids,
                                                    std::size_t count,
                                                    const DistanceFunction& distance) {
  const std::size_t n = free_uuids.size();
  if (count == 0 || n < count) return std::nullopt;
  std::vector<std::size_t> first(count);
  std::iota(first.begin(), first.end(), 0);
  if (count == 1 || n == count) return first;

  std::vector<std::vector<int>> d(n, std::vector<int>(n, 0));
  bool uniform = true;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j < n; ++j) {
      d[i][j] = d[j][i] = distance(free_uuids[i], free_uuids[j]);
      if (d[i][j] != d[0][1]) uniform = false;
    }
  }
  if (uniform) return first;  // no topology to prefer: lowest indices

  const auto score = [&](const std::vector<std::size_t>& set) {
    Score s;
    for (std::size_t a = 0; a < set.size(); ++a)
      for (std::size_t b = a + 1; b < set.size(); ++b) {
        s.worst = std::max(s.worst, d[set[a]][set[b]]);
        s.total += d[set[a]][set[b]];
      }
    return s;
  };

  if (combinations(n, count) <= kMaxExhaustiveSets) {
    // Visit sets in lexicographic order; the first best one wins ties (lowest indices).
    std::vector<std::size_t> set = first, best = first;
    Score best_score = score(first);
    while (true) {
      std::size_t i = count;
      while (i > 0 && set[i - 1] == n - count + (i - 1)) --i;
      if (i == 0) break;
      ++set[i - 1];
      for (std::size_t j = i; j < count; ++j) set[j] = set[j - 1] + 1;
      const Score s = score(set);
      if (s < best_score) {
        best_score = s;
        best = set;
      }
    }
    return best;
  }

  // Greedy for large machines: from each start, add the GPU closest to those chosen so far.
  std::vector<std::size_t> best;
  Score best_score{std::numeric_limits<int>::max(), 0};
  for (std::size_t start = 0; start < n; ++start) {
    std::vector<std::size_t> set{start};
    std::vector<bool> used(n, false);
    used[start] = true;
    while (set.size() < count) {
      std::size_t pick = n;
      int pick_cost = std::numeric_limits<int>::max();
      for (std::size_t c = 0; c < n; ++c) {
        if (used[c]) continue;
        int cost = 0;
        for (std::size_t s : set) cost = std::max(cost, d[s][c]);
        if (cost < pick_cost) {
          pick_cost = cost;
          pick = c;
        }
      }
      used[pick] = true;
      set.push_back(pick);
    }
    std::sort(set.begin(), set.end());
    const Score s = score(set);
    if (best.empty() || s < best_score) {
      best_score = s;
      best = set;
    }
  }
  return best;
}

}  // namespace gpulock
