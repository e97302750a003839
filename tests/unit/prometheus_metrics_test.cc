// metrics_text() (gpulock/monitor.hpp): the Prometheus text format's rules that a parser checks
// only in part: label values escaped (backslash, double quote, newline), numbers that are not
// finite in the format's own words, every family once with its HELP and TYPE, no series twice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>

#include "gpulock/monitor.hpp"

namespace gpulock {
namespace {

// Two leased GPUs held by a user whose name and label need every escape.
PoolStatus awkward_status() {
  PoolStatus status;
  status.host = "node1";
  status.taken_at = std::chrono::system_clock::time_point(std::chrono::seconds(1'800'000'000));
  for (unsigned i = 0; i < 2; ++i) {
    GpuStatus gpu;
    gpu.device.index = i;
    gpu.device.uuid = "GPU-" + std::to_string(i);
    gpu.device.name = "Sim";
    gpu.state = GpuState::kLeased;
    HolderInfo holder;
    holder.lease_id = "aaaaaaaaaaaaaaaa";
    holder.user = "al\\ice\"x";
    holder.label = "two\nlines";
    holder.started_at = status.taken_at;
    gpu.holder = holder;
    status.gpus.push_back(gpu);
  }
  return status;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(PrometheusMetricsTest, LabelValuesAreEscaped) {
  const std::string text = metrics_text(awkward_status(), QueueStatus{});
  EXPECT_NE(text.find(R"(user="al\\ice\"x")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(label="two\nlines")"), std::string::npos) << text;
  for (const auto& line : lines_of(text)) EXPECT_FALSE(line.empty()) << text;
}

TEST(PrometheusMetricsTest, LabelValuesThatAreNotUtf8AreMadeSafe) {
  PoolStatus status = awkward_status();
  status.gpus[0].holder->label = "bad\xff\xfe";
  const std::string text = metrics_text(status, QueueStatus{});
  EXPECT_EQ(text.find('\xff'), std::string::npos);
  EXPECT_NE(text.find("label=\"bad??\""), std::string::npos) << text;
}

TEST(PrometheusMetricsTest, NumbersThatAreNotFiniteUseTheFormatsWords) {
  PoolStatus status = awkward_status();
  status.gpus[0].device.power_draw_watts = std::numeric_limits<double>::quiet_NaN();
  status.gpus[1].device.power_draw_watts = std::numeric_limits<double>::infinity();
  status.gpus[0].device.memory_total_bytes = std::numeric_limits<std::uint64_t>::max();
  const std::string text = metrics_text(status, QueueStatus{});
  EXPECT_NE(
      text.find("gpulock_gpu_power_draw_watts{host=\"node1\",gpu=\"0\",uuid=\"GPU-0\"} NaN\n"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find("gpulock_gpu_power_draw_watts{host=\"node1\",gpu=\"1\",uuid=\"GPU-1\"} +Inf\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("gpulock_gpu_memory_total_bytes{host=\"node1\",gpu=\"0\",uuid=\"GPU-0\"} "
                      "1.8446744073709552e+19\n"),
            std::string::npos)
      << text;
}

TEST(PrometheusMetricsTest, EveryFamilyOnceAndNoSeriesTwice) {
  QueueStatus queue;
  QueueEntry entry;
  entry.user = "bob";
  entry.gpus_requested = 1;
  queue.entries = {entry, entry};
  const std::string text = metrics_text(awkward_status(), queue);
  std::set<std::string> helps, types, series;
  for (const auto& line : lines_of(text)) {
    if (line.rfind("# HELP ", 0) == 0) {
      EXPECT_TRUE(helps.insert(line.substr(7, line.find(' ', 7) - 7)).second) << line;
    } else if (line.rfind("# TYPE ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(types.insert(name).second) << line;
      EXPECT_EQ(helps.count(name), 1u) << "TYPE before HELP: " << line;
      // Only counters may end in _total, and there are none yet.
      EXPECT_EQ(line.substr(line.rfind(' ') + 1), "gauge") << line;
      EXPECT_FALSE(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0) << line;
    } else {
      const std::string key = line.substr(0, line.rfind(' '));
      EXPECT_TRUE(series.insert(key).second) << "series twice: " << line;
      EXPECT_EQ(key.rfind("gpulock_", 0), 0u) << line;
    }
  }
  EXPECT_EQ(helps, types);
}

}  // namespace
}  // namespace gpulock
