// The JSON a host registers its GPUs with in Redis (device_record.h): a round trip keeps every
// field, unset fields stay unset, and anything malformed gives nullopt (static part) or unknown
// readings, never an exception.
#include "redis/device_record.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpulock {
namespace {

using nlohmann::json;

constexpr std::uint64_t kGiB = 1024ULL * 1024 * 1024;

Device FullGpu() {
  Device d;
  d.index = 3;
  d.uuid = "GPU-0b1c2d3e-0000-4000-8000-000000000003";
  d.name = "NVIDIA H100 80GB HBM3";
  d.pci_bus_id = "00000000:3B:00.0";
  d.memory_total_bytes = 80 * kGiB;
  d.memory_used_bytes = 2 * kGiB;
  d.memory_free_bytes = 78 * kGiB;
  d.utilization_percent = 37;
  d.power_draw_watts = 71.5;
  d.power_limit_watts = 700;
  d.compute_mode = ComputeMode::kExclusiveProcess;
  d.mig_enabled = false;
  d.processes = {GpuProcess{4711, 1 * kGiB}, GpuProcess{4712, std::nullopt}};
  d.processes_known = true;
  return d;
}

Device MigInstance() {
  Device d;
  d.index = 1;
  d.mig_index = 2;
  d.uuid = "MIG-7f000000-1111-5222-8333-444444444444";
  d.name = "NVIDIA A100-SXM4-40GB MIG 1g.5gb";
  d.pci_bus_id = "00000000:1B:00.0";
  d.parent_uuid = "GPU-7f000000-0000-4000-8000-000000000001";
  d.memory_total_bytes = 5 * kGiB;
  d.compute_mode = ComputeMode::kDefault;
  d.processes_known = true;
  return d;
}

void ExpectSameDevice(const Device& a, const Device& b) {
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.mig_index, b.mig_index);
  EXPECT_EQ(a.uuid, b.uuid);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.pci_bus_id, b.pci_bus_id);
  EXPECT_EQ(a.parent_uuid, b.parent_uuid);
  EXPECT_EQ(a.memory_total_bytes, b.memory_total_bytes);
  EXPECT_EQ(a.memory_used_bytes, b.memory_used_bytes);
  EXPECT_EQ(a.memory_free_bytes, b.memory_free_bytes);
  EXPECT_EQ(a.utilization_percent, b.utilization_percent);
  EXPECT_EQ(a.power_draw_watts, b.power_draw_watts);
  EXPECT_EQ(a.power_limit_watts, b.power_limit_watts);
  EXPECT_EQ(a.compute_mode, b.compute_mode);
  EXPECT_EQ(a.mig_enabled, b.mig_enabled);
  EXPECT_EQ(a.processes_known, b.processes_known);
  ASSERT_EQ(a.processes.size(), b.processes.size());
  for (std::size_t i = 0; i < a.processes.size(); ++i) {
    EXPECT_EQ(a.processes[i].pid, b.processes[i].pid);
    EXPECT_EQ(a.processes[i].used_memory_bytes, b.processes[i].used_memory_bytes);
  }
}

std::optional<Device> RoundTrip(const Device& d) {
  return parse_registered_device(device_static_json(d), device_readings_json(d));
}

// Parses without letting an exception escape the test (an exception is a failure).
std::optional<Device> Parse(const std::string& static_json, const std::string& readings_json) {
  std::optional<Device> out;
  EXPECT_NO_THROW(out = parse_registered_device(static_json, readings_json))
      << static_json << " / " << readings_json;
  return out;
}

std::string StaticWith(const std::string& field, const json& value) {
  json j = json::parse(device_static_json(FullGpu()));
  j[field] = value;
  return j.dump();
}

std::string StaticWithout(const std::string& field) {
  json j = json::parse(device_static_json(FullGpu()));
  j.erase(field);
  return j.dump();
}

std::string ReadingsWith(const std::string& field, const json& value) {
  json j = json::parse(device_readings_json(FullGpu()));
  j[field] = value;
  return j.dump();
}

const std::string kGoodStatic = device_static_json(FullGpu());
const std::string kGoodReadings = device_readings_json(FullGpu());

TEST(RedisDeviceRecordTest, RoundTripOfAWholeGpu) {
  const auto parsed = RoundTrip(FullGpu());
  ASSERT_TRUE(parsed);
  ExpectSameDevice(*parsed, FullGpu());
  EXPECT_FALSE(parsed->is_mig_instance());
}

TEST(RedisDeviceRecordTest, RoundTripOfAMigInstanceKeepsUnsetFieldsUnset) {
  const Device mig = MigInstance();
  const auto parsed = RoundTrip(mig);
  ASSERT_TRUE(parsed);
  ExpectSameDevice(*parsed, mig);
  EXPECT_TRUE(parsed->is_mig_instance());
  EXPECT_EQ(parsed->display_index(), "1:2");
  EXPECT_FALSE(parsed->memory_used_bytes);
  EXPECT_FALSE(parsed->memory_free_bytes);
  EXPECT_FALSE(parsed->utilization_percent);
  EXPECT_FALSE(parsed->power_draw_watts);
  EXPECT_FALSE(parsed->power_limit_watts);
  EXPECT_FALSE(parsed->mig_enabled);
  EXPECT_TRUE(parsed->processes.empty());
  EXPECT_TRUE(parsed->processes_known);
}

TEST(RedisDeviceRecordTest, RoundTripOfAGpuWhoseProcessesAreUnknown) {
  Device d = FullGpu();
  d.processes.clear();
  d.processes_known = false;
  d.mig_enabled = true;
  d.compute_mode = ComputeMode::kUnknown;
  const auto parsed = RoundTrip(d);
  ASSERT_TRUE(parsed);
  ExpectSameDevice(*parsed, d);
}

TEST(RedisDeviceRecordTest, RoundTripOfExtremeValues) {
  Device d = FullGpu();
  d.index = 1u << 16;
  d.memory_total_bytes = UINT64_MAX;
  d.memory_used_bytes = 0;
  d.utilization_percent = 100;
  d.power_draw_watts = 0;
  d.processes = {GpuProcess{UINT32_MAX, UINT64_MAX}};
  d.name = std::string(256, 'n');
  const auto parsed = RoundTrip(d);
  ASSERT_TRUE(parsed);
  ExpectSameDevice(*parsed, d);
}

TEST(RedisDeviceRecordTest, EveryComputeModeRoundTrips) {
  for (const ComputeMode mode : {ComputeMode::kDefault, ComputeMode::kExclusiveThread,
                                 ComputeMode::kProhibited, ComputeMode::kExclusiveProcess}) {
    Device d = FullGpu();
    d.compute_mode = mode;
    const auto parsed = RoundTrip(d);
    ASSERT_TRUE(parsed);
    EXPECT_EQ(parsed->compute_mode, mode) << compute_mode_name(mode);
  }
  const auto unknown = Parse(StaticWith("compute_mode", "turbo"), kGoodReadings);
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->compute_mode, ComputeMode::kUnknown);
}

TEST(RedisDeviceRecordTest, ANonJsonOrNonObjectStaticPartIsRejected) {
  for (const std::string& bad : std::vector<std::string>{
           "", "not json", "{", "{\"uuid\": \"GPU-1\",}", "[]", "null", "42", "\"GPU-1\"",
           "{\"index\": 0, \"uuid\": \"GPU-1\", \"name\": \"x\"} x", "\xff\xfe",
           std::string("{\"index\": 0, \"uuid\": \"GPU-1\", "
                       "\"name\": \"\xc3\x28\"}")})
    EXPECT_FALSE(Parse(bad, kGoodReadings)) << bad;
}

TEST(RedisDeviceRecordTest, MissingOrMalformedIdentityIsRejected) {
  EXPECT_FALSE(Parse(StaticWithout("uuid"), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWithout("index"), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWithout("name"), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("uuid", ""), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("uuid", 7), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("uuid", nullptr), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("uuid", json::array({"GPU-1"})), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("uuid", std::string(257, 'u')), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("name", std::string(257, 'n')), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("name", 1), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("index", -1), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("index", "3"), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("index", 1.5), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("index", (1u << 16) + 1), kGoodReadings));
  EXPECT_FALSE(Parse(StaticWith("index", true), kGoodReadings));
  // A string of exactly the limit is fine.
  EXPECT_TRUE(Parse(StaticWith("uuid", "GPU-" + std::string(252, 'u')), kGoodReadings));
}

TEST(RedisDeviceRecordTest, MalformedOptionalStaticFieldsAreLeftUnset) {
  auto d = Parse(StaticWith("mig_index", -1), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->mig_index);
  d = Parse(StaticWith("mig_index", "2"), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->mig_index);
  d = Parse(StaticWith("memory_total", -5), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->memory_total_bytes);
  d = Parse(StaticWith("memory_total", "80G"), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->memory_total_bytes);
  d = Parse(StaticWith("memory_total", 1e30), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->memory_total_bytes);
  d = Parse(StaticWith("memory_total", json::parse("18446744073709551616")), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->memory_total_bytes);
  d = Parse(StaticWith("mig_enabled", "yes"), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->mig_enabled);
  d = Parse(StaticWith("pci_bus_id", std::string(300, 'p')), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->pci_bus_id, "");
  d = Parse(StaticWith("parent_uuid", 12), kGoodReadings);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->parent_uuid, "");
}

// The readings that a device parsed from `readings` has: all unknown when they are malformed.
void ExpectReadingsUnknown(const std::string& readings) {
  const auto d = Parse(kGoodStatic, readings);
  ASSERT_TRUE(d) << readings;
  EXPECT_FALSE(d->memory_used_bytes) << readings;
  EXPECT_FALSE(d->memory_free_bytes) << readings;
  EXPECT_FALSE(d->utilization_percent) << readings;
  EXPECT_FALSE(d->power_draw_watts) << readings;
  EXPECT_FALSE(d->power_limit_watts) << readings;
  EXPECT_FALSE(d->processes_known) << readings;
  EXPECT_TRUE(d->processes.empty()) << readings;
}

TEST(RedisDeviceRecordTest, MissingOrNonJsonReadingsAreUnknown) {
  for (const std::string bad : {"", "not json", "[]", "null", "{", "\"x\"", "{}"})
    ExpectReadingsUnknown(bad);
}

TEST(RedisDeviceRecordTest, MalformedReadingsAreUnknownOneByOne) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"memory_used", -1},
           {"memory_used", "2G"},
           {"memory_used", 1.5},
           {"memory_free", nullptr},
           {"utilization", 101},
           {"utilization", -3},
           {"utilization", "37"},
           {"power_draw", -1.0},
           {"power_draw", 1e8},
           {"power_draw", "71"},
           {"power_limit", json::object()},
       }) {
    const auto d = Parse(kGoodStatic, ReadingsWith(field, value));
    ASSERT_TRUE(d) << field;
    const Device good = FullGpu();
    if (field == "memory_used") {
      EXPECT_FALSE(d->memory_used_bytes) << value;
      EXPECT_EQ(d->memory_free_bytes, good.memory_free_bytes);
    } else if (field == "memory_free") {
      EXPECT_FALSE(d->memory_free_bytes) << value;
    } else if (field == "utilization") {
      EXPECT_FALSE(d->utilization_percent) << value;
    } else if (field == "power_draw") {
      EXPECT_FALSE(d->power_draw_watts) << value;
      EXPECT_EQ(d->power_limit_watts, good.power_limit_watts);
    } else {
      EXPECT_FALSE(d->power_limit_watts) << value;
    }
    // The processes are still known.
    EXPECT_TRUE(d->processes_known) << field;
    EXPECT_EQ(d->processes.size(), 2u) << field;
  }
}

TEST(RedisDeviceRecordTest, ProcessesThatAreNotAnArrayAreUnknown) {
  for (const json& bad : {json("4711"), json(4711), json::object({{"pid", 1}}), json(nullptr)}) {
    const auto d = Parse(kGoodStatic, ReadingsWith("processes", bad));
    ASSERT_TRUE(d) << bad;
    EXPECT_FALSE(d->processes_known) << bad;
    EXPECT_TRUE(d->processes.empty()) << bad;
    EXPECT_TRUE(d->memory_used_bytes) << "other readings stay";
  }
}

TEST(RedisDeviceRecordTest, AMalformedProcessMakesTheProcessesUnknown) {
  for (const json& bad : {json::array({{{"pid", 1}}, {{"used_memory", 5}}}),  // no pid
                          json::array({{{"pid", -1}}}),                       // negative
                          json::array({{{"pid", "1"}}}),                      // a string
                          json::array({{{"pid", 4294967296ULL}}}),            // above uint32
                          json::array({{{"pid", 1.5}}}),                      // not an integer
                          json::array({{{"pid", 1}}, 7}),                     // not an object
                          json::array({json::array({1})})}) {
    const auto d = Parse(kGoodStatic, ReadingsWith("processes", bad));
    ASSERT_TRUE(d) << bad;
    EXPECT_FALSE(d->processes_known) << bad;
    EXPECT_TRUE(d->processes.empty()) << bad;
  }
  // A process's malformed memory figure is only unknown.
  const auto d = Parse(kGoodStatic,
                       ReadingsWith("processes", json::array({{{"pid", 9}, {"used_memory", -1}}})));
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->processes_known);
  ASSERT_EQ(d->processes.size(), 1u);
  EXPECT_EQ(d->processes[0].pid, 9u);
  EXPECT_FALSE(d->processes[0].used_memory_bytes);
}

TEST(RedisDeviceRecordTest, ProcessesKnownMustBeABoolean) {
  for (const json& bad : {json("true"), json(1), json(nullptr)}) {
    const auto d = Parse(kGoodStatic, ReadingsWith("processes_known", bad));
    ASSERT_TRUE(d);
    EXPECT_FALSE(d->processes_known) << bad;
    EXPECT_TRUE(d->processes.empty()) << bad;
  }
  json j = json::parse(kGoodReadings);
  j.erase("processes_known");
  const auto d = Parse(kGoodStatic, j.dump());
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->processes_known);
}

TEST(RedisDeviceRecordTest, TooManyProcessesAreUnknown) {
  json processes = json::array();
  for (unsigned pid = 1; pid <= 1025; ++pid) processes.push_back({{"pid", pid}});
  const auto d = Parse(kGoodStatic, ReadingsWith("processes", processes));
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->processes_known);
  EXPECT_TRUE(d->processes.empty());
  processes.erase(processes.size() - 1);
  const auto limit = Parse(kGoodStatic, ReadingsWith("processes", processes));
  ASSERT_TRUE(limit);
  EXPECT_TRUE(limit->processes_known);
  EXPECT_EQ(limit->processes.size(), 1024u);
}

TEST(RedisDeviceRecordTest, HostileInputNeverThrows) {
  const std::string deep_array = std::string(100000, '[') + std::string(100000, ']');
  const std::string deep_object = [] {
    std::string s;
    for (int i = 0; i < 50000; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(50000, '}');
    return s;
  }();
  const std::string huge_string = "{\"uuid\": \"" + std::string(1 << 20, 'x') + "\"}";
  for (const std::string* text : {&deep_array, &deep_object, &huge_string}) {
    EXPECT_FALSE(Parse(*text, kGoodReadings));
    ExpectReadingsUnknown(*text);
  }
  std::string nul_inside = kGoodStatic;
  nul_inside.insert(nul_inside.size() / 2, 1, '\0');
  EXPECT_FALSE(Parse(nul_inside, kGoodReadings));
}

}  // namespace
}  // namespace gpulock
