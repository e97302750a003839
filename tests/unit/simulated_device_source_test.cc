// Simulated GPUs (src/devices/simulated_device_source.cc): N idle devices, and devices described
// by a JSON file (docs/simulated-gpus.md) that is validated strictly and re-read on every query.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpulock/device_source.hpp"
#include "gpulock/error.hpp"
#include "temp_dir.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kMiB = 1024ULL * 1024;
constexpr std::uint64_t kGiB = 1024ULL * kMiB;

using test_support::TempDir;

class SimulatedFileTest : public ::testing::Test {
 protected:
  // Writes the file (atomically, as a test changing it under a running pool would).
  void Write(const std::string& text) {
    const fs::path temporary = file_.string() + ".new";
    std::ofstream(temporary) << text;
    fs::rename(temporary, file_);
  }

  std::unique_ptr<DeviceSource> Open() { return make_simulated_source_from_file(file_.string()); }

  // Expects opening the current file to fail with kInvalidArgument, naming the file and `field`.
  void ExpectRefused(const std::string& text, const std::string& field) {
    Write(text);
    try {
      Open();
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << message;
      EXPECT_NE(message.find(file_.string()), std::string::npos) << "file not named: " << message;
      EXPECT_NE(message.find(field), std::string::npos)
          << "'" << field << "' not named: " << message;
    }
  }

  TempDir dir_;
  fs::path file_ = dir_.path() / "gpus.json";
};

// --- make_simulated_source(N) -------------------------------------------------------------

TEST(SimulatedCountTest, HasNIdleDevices) {
  auto source = make_simulated_source(4);
  const auto devices = source->devices();
  ASSERT_EQ(devices.size(), 4u);
  std::set<std::string> uuids;
  for (unsigned i = 0; i < 4; ++i) {
    const Device& d = devices[i];
    EXPECT_EQ(d.index, i);
    EXPECT_FALSE(d.is_mig_instance());
    EXPECT_EQ(d.display_index(), std::to_string(i));
    EXPECT_EQ(d.name, "Simulated GPU");
    EXPECT_EQ(d.memory_total_bytes, 80 * kGiB);
    EXPECT_EQ(d.memory_used_bytes, 0u);
    EXPECT_EQ(d.memory_free_bytes, 80 * kGiB);
    EXPECT_EQ(d.utilization_percent, 0u);
    EXPECT_EQ(d.power_draw_watts, 60.0);
    EXPECT_EQ(d.power_limit_watts, 700.0);
    EXPECT_EQ(d.compute_mode, ComputeMode::kDefault);
    EXPECT_EQ(d.mig_enabled, false);
    EXPECT_TRUE(d.processes.empty());
    EXPECT_TRUE(d.parent_uuid.empty());
    EXPECT_TRUE(d.uuid.starts_with("GPU-")) << d.uuid;
    uuids.insert(d.uuid);
  }
  EXPECT_EQ(uuids.size(), 4u) << "UUIDs are not distinct";
  EXPECT_TRUE(source->simulated());
  EXPECT_EQ(source->description(), "4 simulated GPUs");
}

TEST(SimulatedCountTest, UuidsAreStableAcrossCallsAndSources) {
  auto a = make_simulated_source(3);
  auto b = make_simulated_source(5);
  const auto first = a->devices(), again = a->devices(), other = b->devices();
  for (unsigned i = 0; i < 3; ++i) {
    EXPECT_EQ(first[i].uuid, again[i].uuid);
    EXPECT_EQ(first[i].uuid, other[i].uuid);
  }
  EXPECT_EQ(first[0].uuid, "GPU-5e1f0a7e-0000-4000-8000-000000000000");  // documented
  EXPECT_EQ(other[4].uuid, "GPU-5e1f0a7e-0000-4000-8000-000000000004");
}

TEST(SimulatedCountTest, ZeroDevices) {
  EXPECT_TRUE(make_simulated_source(0)->devices().empty());
}

TEST(SimulatedCountTest, NoTopology) {
  auto source = make_simulated_source(2);
  const auto d = source->devices();
  EXPECT_EQ(source->distance(d[0].uuid, d[1].uuid), 50);
}

// --- from a file: contents ----------------------------------------------------------------

TEST_F(SimulatedFileTest, AllFields) {
  Write(R"({"comment": "test machine", "gpus": [
    {"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000", "name": "Sim A100",
     "pci_bus_id": "00000000:3B:00.0", "switch": 0, "memory_total": "40G", "memory_used": "1G",
     "utilization": 37, "power_draw": 71.5, "power_limit": 400,
     "compute_mode": "exclusive_process", "comment": "first",
     "processes": [{"pid": 4711, "used_memory": "512M"}, {"pid": 4712}]}
  ]})");
  auto source = Open();
  const auto devices = source->devices();
  ASSERT_EQ(devices.size(), 1u);
  const Device& d = devices[0];
  EXPECT_EQ(d.index, 0u);
  EXPECT_EQ(d.uuid, "GPU-aaaa0000-0000-0000-0000-000000000000");
  EXPECT_EQ(d.name, "Sim A100");
  EXPECT_EQ(d.pci_bus_id, "00000000:3B:00.0");
  EXPECT_EQ(d.memory_total_bytes, 40 * kGiB);
  EXPECT_EQ(d.memory_used_bytes, 1 * kGiB);
  EXPECT_EQ(d.memory_free_bytes, 39 * kGiB);
  EXPECT_EQ(d.utilization_percent, 37u);
  EXPECT_EQ(d.power_draw_watts, 71.5);
  EXPECT_EQ(d.power_limit_watts, 400.0);
  EXPECT_EQ(d.compute_mode, ComputeMode::kExclusiveProcess);
  EXPECT_EQ(d.mig_enabled, false);
  ASSERT_EQ(d.processes.size(), 2u);
  EXPECT_EQ(d.processes[0].pid, 4711u);
  EXPECT_EQ(d.processes[0].used_memory_bytes, 512 * kMiB);
  EXPECT_EQ(d.processes[1].pid, 4712u);
  EXPECT_EQ(d.processes[1].used_memory_bytes, std::nullopt);
  EXPECT_TRUE(source->simulated());
  EXPECT_NE(source->description().find(file_.string()), std::string::npos);
  EXPECT_NE(source->description().find("1 simulated"), std::string::npos);
}

TEST_F(SimulatedFileTest, EveryComputeMode) {
  Write(R"({"gpus": [{"compute_mode": "default"}, {"compute_mode": "exclusive_thread"},
                     {"compute_mode": "prohibited"}, {"compute_mode": "exclusive_process"}]})");
  const auto d = Open()->devices();
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].compute_mode, ComputeMode::kDefault);
  EXPECT_EQ(d[1].compute_mode, ComputeMode::kExclusiveThread);
  EXPECT_EQ(d[2].compute_mode, ComputeMode::kProhibited);
  EXPECT_EQ(d[3].compute_mode, ComputeMode::kExclusiveProcess);
}

TEST_F(SimulatedFileTest, DefaultsMatchIdleDevices) {
  Write(R"({"gpus": [{}, {}]})");
  const auto from_file = Open()->devices();
  const auto idle = make_simulated_source(2)->devices();
  ASSERT_EQ(from_file.size(), 2u);
  for (unsigned i = 0; i < 2; ++i) {
    EXPECT_EQ(from_file[i].index, i);
    EXPECT_EQ(from_file[i].uuid, idle[i].uuid);
    EXPECT_EQ(from_file[i].name, idle[i].name);
    EXPECT_EQ(from_file[i].pci_bus_id, idle[i].pci_bus_id);
    EXPECT_EQ(from_file[i].memory_total_bytes, 80 * kGiB);
    EXPECT_EQ(from_file[i].memory_used_bytes, 0u);
    EXPECT_EQ(from_file[i].memory_free_bytes, 80 * kGiB);
    EXPECT_EQ(from_file[i].utilization_percent, 0u);
    EXPECT_EQ(from_file[i].power_draw_watts, 60.0);
    EXPECT_EQ(from_file[i].power_limit_watts, 700.0);
    EXPECT_EQ(from_file[i].compute_mode, ComputeMode::kDefault);
    EXPECT_EQ(from_file[i].mig_enabled, false);
    EXPECT_TRUE(from_file[i].processes.empty());
  }
}

TEST_F(SimulatedFileTest, NoGpus) {
  Write(R"({"gpus": []})");
  auto source = Open();
  EXPECT_TRUE(source->devices().empty());
}

TEST_F(SimulatedFileTest, MemoryUsedDefaultsToTheSumOfProcessMemory) {
  Write(R"({"gpus": [
    {"processes": [{"pid": 10, "used_memory": "1G"}, {"pid": 11, "used_memory": 1048576},
                   {"pid": 12}]},
    {"memory_used": "2G", "processes": [{"pid": 13, "used_memory": "1G"}]}
  ]})");
  const auto d = Open()->devices();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].memory_used_bytes, kGiB + kMiB);
  EXPECT_EQ(d[0].memory_free_bytes, 80 * kGiB - kGiB - kMiB);
  EXPECT_EQ(d[1].memory_used_bytes, 2 * kGiB);  // given explicitly: not the sum
}

TEST_F(SimulatedFileTest, SizesAsNumbersOfBytes) {
  Write(R"({"gpus": [{"memory_total": 1073741824, "memory_used": 0}]})");
  const auto d = Open()->devices();
  EXPECT_EQ(d[0].memory_total_bytes, kGiB);
  EXPECT_EQ(d[0].memory_free_bytes, kGiB);
}

TEST_F(SimulatedFileTest, MigInstancesFollowTheirParent) {
  Write(R"({"gpus": [
    {"uuid": "GPU-p0"},
    {"uuid": "GPU-p1", "name": "Sim H100", "pci_bus_id": "00000000:9A:00.0",
     "compute_mode": "exclusive_process",
     "mig": [{"memory_total": "10G"},
             {"uuid": "MIG-custom", "memory_total": "20G", "memory_used": "5G",
              "processes": [{"pid": 4712, "used_memory": "1G"}]}]},
    {"uuid": "GPU-p2"}
  ]})");
  const auto d = Open()->devices();
  ASSERT_EQ(d.size(), 5u);
  EXPECT_EQ(d[0].uuid, "GPU-p0");
  EXPECT_EQ(d[1].uuid, "GPU-p1");
  EXPECT_EQ(d[1].mig_enabled, true);
  EXPECT_FALSE(d[1].is_mig_instance());

  const Device& m0 = d[2];
  EXPECT_TRUE(m0.is_mig_instance());
  EXPECT_EQ(m0.index, 1u);
  EXPECT_EQ(m0.mig_index, 0u);
  EXPECT_EQ(m0.display_index(), "1:0");
  EXPECT_TRUE(m0.uuid.starts_with("MIG-")) << m0.uuid;
  EXPECT_EQ(m0.parent_uuid, "GPU-p1");
  EXPECT_EQ(m0.pci_bus_id, "00000000:9A:00.0");
  EXPECT_EQ(m0.compute_mode, ComputeMode::kExclusiveProcess);
  EXPECT_EQ(m0.memory_total_bytes, 10 * kGiB);
  EXPECT_EQ(m0.memory_used_bytes, 0u);
  EXPECT_EQ(m0.mig_enabled, std::nullopt);

  const Device& m1 = d[3];
  EXPECT_EQ(m1.uuid, "MIG-custom");
  EXPECT_EQ(m1.display_index(), "1:1");
  EXPECT_EQ(m1.parent_uuid, "GPU-p1");
  EXPECT_EQ(m1.memory_total_bytes, 20 * kGiB);
  EXPECT_EQ(m1.memory_used_bytes, 5 * kGiB);
  EXPECT_EQ(m1.memory_free_bytes, 15 * kGiB);
  ASSERT_EQ(m1.processes.size(), 1u);
  EXPECT_EQ(m1.processes[0].pid, 4712u);

  EXPECT_EQ(d[4].uuid, "GPU-p2");
  EXPECT_EQ(d[4].index, 2u);
}

TEST_F(SimulatedFileTest, DefaultMigUuidsAreDistinct) {
  Write(R"({"gpus": [{"mig": [{}, {}]}, {"mig": [{}, {}]}]})");
  const auto d = Open()->devices();
  ASSERT_EQ(d.size(), 6u);
  std::set<std::string> uuids;
  for (const auto& device : d) uuids.insert(device.uuid);
  EXPECT_EQ(uuids.size(), 6u);
}

TEST_F(SimulatedFileTest, SwitchBasedDistance) {
  Write(R"({"gpus": [
    {"uuid": "GPU-a", "switch": 0}, {"uuid": "GPU-b", "switch": 0}, {"uuid": "GPU-c", "switch": 1},
    {"uuid": "GPU-d"}, {"uuid": "GPU-e", "switch": 1, "mig": [{"uuid": "MIG-e0"}]}
  ]})");
  auto source = Open();
  source->devices();
  EXPECT_EQ(source->distance("GPU-a", "GPU-b"), 10);
  EXPECT_EQ(source->distance("GPU-b", "GPU-a"), 10);
  EXPECT_EQ(source->distance("GPU-a", "GPU-c"), 50);
  EXPECT_EQ(source->distance("GPU-a", "GPU-d"), 50);  // no switch: unknown
  EXPECT_EQ(source->distance("GPU-d", "GPU-d"), 0);
  EXPECT_EQ(source->distance("GPU-c", "MIG-e0"), 10);  // MIG instances share their GPU's switch
  EXPECT_EQ(source->distance("GPU-a", "GPU-unknown"), 50);
}

TEST_F(SimulatedFileTest, FileIsReadAgainOnEveryQuery) {
  Write(R"({"gpus": [{"utilization": 10, "switch": 0}, {"switch": 0}]})");
  auto source = Open();
  auto d = source->devices();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].utilization_percent, 10u);
  EXPECT_EQ(source->distance(d[0].uuid, d[1].uuid), 10);

  Write(R"({"gpus": [{"utilization": 90, "processes": [{"pid": 99}], "switch": 0},
                     {"switch": 1}, {}]})");
  d = source->devices();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].utilization_percent, 90u);
  ASSERT_EQ(d[0].processes.size(), 1u);
  EXPECT_EQ(source->distance(d[0].uuid, d[1].uuid), 50);
  EXPECT_NE(source->description().find("3 simulated"), std::string::npos) << source->description();

  // A file broken later is reported by the query, not silently ignored.
  Write("{ not json");
  EXPECT_THROW(source->devices(), Error);
}

// Regression test for a fixed bug: FileSimulatedSource (src/devices/simulated_device_source.cc) is
// not thread-safe: devices() reassigns the members switches_ and count_ on every call,
// unsynchronised, while other threads read them in devices(), distance() and description(). GpuPool
// promises "Thread-safe: one pool may serve several threads" and calls devices() from acquire(),
// status() and devices() without holding a lock around the source, so two threads of one pool over
// a GPULOCK_FAKE_GPUS=file.json source race; this test aborts the process with "double free or
// corruption" within a few runs (--gtest_repeat=20). Expected: concurrent queries are safe
// (a mutex in the source, or GpuPool serialising calls into its DeviceSource).
TEST_F(SimulatedFileTest, ConcurrentQueriesOnOneSource) {
  Write(R"({"gpus": [{"uuid": "GPU-a", "switch": 0}, {"uuid": "GPU-b", "switch": 0},
                     {"uuid": "GPU-c", "switch": 1}]})");
  auto source = Open();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        if (source->devices().size() != 3) ++wrong;
        if (source->distance("GPU-a", "GPU-b") != 10) ++wrong;
        if (source->description().empty()) ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

// --- from a file: refusals ----------------------------------------------------------------

TEST_F(SimulatedFileTest, MissingFile) {
  try {
    make_simulated_source_from_file((dir_.path() / "absent.json").string());
    ADD_FAILURE() << "accepted a missing file";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("absent.json"), std::string::npos) << error.what();
  }
}

TEST_F(SimulatedFileTest, InvalidJson) {
  ExpectRefused("{\"gpus\": [", "not valid JSON");
  ExpectRefused("", "not valid JSON");
  ExpectRefused(std::string(R"({"gpus": [{"name": "a)") + '\0' + R"(b"}]})", "not valid JSON");
}

TEST_F(SimulatedFileTest, WrongTopLevel) {
  ExpectRefused("[]", "top level");
  ExpectRefused("null", "top level");
  ExpectRefused("{}", "top level");
  ExpectRefused(R"({"gpus": {}})", "top level");
  ExpectRefused(R"({"gpus": [], "gpu": []})", "unknown field 'gpu'");
}

TEST_F(SimulatedFileTest, UnknownFields) {
  ExpectRefused(R"({"gpus": [{"utilisation": 5}]})", "gpus[0]");
  ExpectRefused(R"({"gpus": [{"utilisation": 5}]})", "unknown field 'utilisation'");
  ExpectRefused(R"({"gpus": [{}, {"processes": [{"pid": 1, "memory": "1G"}]}]})",
                "gpus[1].processes[0]");
  ExpectRefused(R"({"gpus": [{"mig": [{"utilization": 5}]}]})", "gpus[0].mig[0]");
}

TEST_F(SimulatedFileTest, WrongTypes) {
  ExpectRefused(R"({"gpus": [1]})", "gpus[0]");
  ExpectRefused(R"({"gpus": [{"uuid": 5}]})", "gpus[0].uuid");
  ExpectRefused(R"({"gpus": [{"name": null}]})", "gpus[0].name");
  ExpectRefused(R"({"gpus": [{"pci_bus_id": []}]})", "gpus[0].pci_bus_id");
  ExpectRefused(R"({"gpus": [{"utilization": "high"}]})", "gpus[0].utilization");
  ExpectRefused(R"({"gpus": [{"power_draw": "300W"}]})", "gpus[0].power_draw");
  ExpectRefused(R"({"gpus": [{"power_limit": true}]})", "gpus[0].power_limit");
  ExpectRefused(R"({"gpus": [{"memory_total": -5}]})", "gpus[0].memory_total");
  ExpectRefused(R"({"gpus": [{"memory_total": 1.5}]})", "gpus[0].memory_total");
  ExpectRefused(R"({"gpus": [{"memory_total": "80"}]})", "gpus[0].memory_total");
  ExpectRefused(R"({"gpus": [{"memory_used": "lots"}]})", "gpus[0].memory_used");
  ExpectRefused(R"({"gpus": [{"compute_mode": 1}]})", "gpus[0].compute_mode");
  ExpectRefused(R"({"gpus": [{"compute_mode": "shared"}]})", "gpus[0].compute_mode");
  ExpectRefused(R"({"gpus": [{"switch": "a"}]})", "gpus[0].switch");
  ExpectRefused(R"({"gpus": [{"processes": {"pid": 1}}]})", "gpus[0].processes");
  ExpectRefused(R"({"gpus": [{"processes": [{"used_memory": "1G"}]}]})", "gpus[0].processes[0]");
  ExpectRefused(R"({"gpus": [{"processes": [{"pid": "1"}]}]})", "gpus[0].processes[0].pid");
  ExpectRefused(R"({"gpus": [{"processes": [{"pid": 1, "used_memory": "x"}]}]})",
                "gpus[0].processes[0].used_memory");
  ExpectRefused(R"({"gpus": [{"mig": {}}]})", "gpus[0].mig");
  ExpectRefused(R"({"gpus": [{"mig": [5]}]})", "gpus[0].mig[0]");
  ExpectRefused(R"({"gpus": [{"mig": [{"uuid": 5}]}]})", "gpus[0].mig[0].uuid");
}

TEST_F(SimulatedFileTest, ImpossibleValues) {
  ExpectRefused(R"({"gpus": [{"utilization": 101}]})", "gpus[0].utilization");
  ExpectRefused(R"({"gpus": [{"utilization": -1}]})", "gpus[0].utilization");
  ExpectRefused(R"({"gpus": [{"power_draw": -1}]})", "gpus[0].power_draw");
  ExpectRefused(R"({"gpus": [{"processes": [{"pid": 0}]}]})", "gpus[0].processes[0].pid");
  ExpectRefused(R"({"gpus": [{"processes": [{"pid": 99999999}]}]})", "gpus[0].processes[0].pid");
  ExpectRefused(R"({"gpus": [{"switch": -1}]})", "gpus[0].switch");
}

TEST_F(SimulatedFileTest, MemoryUsedBeyondTotal) {
  ExpectRefused(R"({"gpus": [{"memory_total": "10G", "memory_used": "11G"}]})", "gpus[0]");
  ExpectRefused(R"({"gpus": [{"memory_total": "10G", "memory_used": "11G"}]})", "memory_used");
  ExpectRefused(R"({"gpus": [{"memory_total": "1G", "processes": [{"pid": 5,
                  "used_memory": "2G"}]}]})",
                "memory_used");
  ExpectRefused(R"({"gpus": [{"mig": [{"memory_total": "1G", "memory_used": "2G"}]}]})",
                "gpus[0].mig[0]");
}

TEST_F(SimulatedFileTest, DuplicateUuids) {
  ExpectRefused(R"({"gpus": [{"uuid": "GPU-x"}, {"uuid": "GPU-x"}]})", "gpus[1]");
  ExpectRefused(R"({"gpus": [{"uuid": "GPU-x"}, {"uuid": "GPU-x"}]})", "duplicate uuid GPU-x");
  // An explicit UUID equal to another GPU's default one.
  ExpectRefused(R"({"gpus": [{}, {"uuid": "GPU-5e1f0a7e-0000-4000-8000-000000000000"}]})",
                "duplicate uuid");
  ExpectRefused(R"({"gpus": [{"uuid": "GPU-x", "mig": [{"uuid": "GPU-x"}]}]})", "gpus[0].mig[0]");
  ExpectRefused(R"({"gpus": [{"mig": [{"uuid": "MIG-y"}, {"uuid": "MIG-y"}]}]})", "gpus[0].mig[1]");
}

TEST_F(SimulatedFileTest, UntrustedFieldNamesAreShownSafely) {
  Write("{\"gpus\": [{\"\\u001b[2Jevil\": 1}]}");
  try {
    Open();
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).find('\x1b'), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace gpulock
