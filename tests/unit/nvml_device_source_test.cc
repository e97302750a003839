// The NVML DeviceSource (src/devices/nvml_*.cc) against fake driver libraries.
//
// tests/fake_nvml builds libfake_nvml_full.so (a current driver), libfake_nvml_old.so (an old
// driver: unversioned entry points, old struct layouts) and libfake_nvml_no_uuid.so (missing a
// required entry point). Each test writes the machine it wants to a config file, points
// FAKE_NVML_CONFIG at it and loads a fresh source through make_nvml_source(), the same code path
// real machines use. The fake reads its config at the first nvmlInit and forgets it at the last
// nvmlShutdown, and counts calls per entry point (fake_nvml_call_count), which the tests read to
// see which entry points the loader chose.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpulock/device_source.hpp"
#include "gpulock/error.hpp"

namespace gpulock {
namespace {

constexpr std::uint64_t kMiB = 1024ULL * 1024ULL;
constexpr const char* kFull = FAKE_NVML_FULL_PATH;
constexpr const char* kOld = FAKE_NVML_OLD_PATH;
constexpr const char* kNoUuid = FAKE_NVML_NO_UUID_PATH;

const char* const kGpu0 = "GPU-11111111-2222-4333-8444-555555555555";
const char* const kGpu1 = "GPU-66666666-7777-4888-9999-aaaaaaaaaaaa";

// Keeps a fake driver library loaded for the test's lifetime and reads its call counters. The
// source under test dlopen()s the same path and so shares the library's state.
class FakeDriver {
 public:
  explicit FakeDriver(const char* path) : handle_(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ != nullptr)
      count_ = reinterpret_cast<CountFn>(dlsym(handle_, "fake_nvml_call_count"));
  }
  ~FakeDriver() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  FakeDriver(const FakeDriver&) = delete;
  FakeDriver& operator=(const FakeDriver&) = delete;

  bool loaded() const { return count_ != nullptr; }
  unsigned long calls(const char* entry_point) const { return count_(entry_point); }

 private:
  using CountFn = unsigned long (*)(const char*);
  void* handle_;
  CountFn count_ = nullptr;
};

class NvmlDeviceSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gpulock-nvml-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    unsetenv("FAKE_NVML_CONFIG");
    unsetenv("FAKE_NVML_INIT_FAIL");
  }

  void TearDown() override {
    unsetenv("FAKE_NVML_CONFIG");
    unsetenv("FAKE_NVML_INIT_FAIL");
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Makes `text` the machine the fake driver pretends to be at its next first nvmlInit.
  void use_machine(const std::string& text) {
    const std::string path = dir_ + "/machine.conf";
    std::ofstream(path) << text;
    setenv("FAKE_NVML_CONFIG", path.c_str(), 1);
  }

  std::string dir_;
};

// The Error that `action` throws; a test failure if it throws nothing.
Error error_from(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "no gpulock::Error was thrown";
  return Error(ErrorCode::kInternal, "");
}

const Device& find(const std::vector<Device>& devices, const std::string& uuid) {
  for (const Device& device : devices)
    if (device.uuid == uuid) return device;
  static const Device missing;
  ADD_FAILURE() << "no device " << uuid;
  return missing;
}

std::vector<std::uint32_t> pids(const Device& device) {
  std::vector<std::uint32_t> result;
  for (const GpuProcess& process : device.processes) result.push_back(process.pid);
  return result;
}

const std::string kTwoH100s = std::string("system driver=550.54.15 nvml=12.550.54\n") +
                              "gpu uuid=" + kGpu0 +
                              " name=\"NVIDIA H100 80GB HBM3\" bus=00000000:3B:00.0"
                              " total_mib=81920 used_mib=1024 util=37 power_mw=71500"
                              " limit_mw=700000 mode=3\n"
                              "gpu uuid=" +
                              kGpu1 +
                              " name=\"NVIDIA H100 80GB HBM3\" bus=00000000:5e:00.0"
                              " total_mib=81920 used_mib=0 util=0 power_mw=65000"
                              " limit_mw=650000 mode=0\n";

// ---- Inventory -------------------------------------------------------------------------------

TEST_F(NvmlDeviceSourceTest, DefaultMachineHasTwoIdleGpus) {
  auto source = make_nvml_source(kFull);
  const auto devices = source->devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].index, 0u);
  EXPECT_EQ(devices[1].index, 1u);
  EXPECT_EQ(devices[0].uuid.rfind("GPU-", 0), 0u);
  EXPECT_NE(devices[0].uuid, devices[1].uuid);
  EXPECT_TRUE(devices[0].processes.empty());
  EXPECT_FALSE(source->simulated());
}

TEST_F(NvmlDeviceSourceTest, ReportsInventoryFields) {
  use_machine(kTwoH100s);
  const auto devices = make_nvml_source(kFull)->devices();
  ASSERT_EQ(devices.size(), 2u);

  const Device& busy = devices[0];
  EXPECT_EQ(busy.index, 0u);
  EXPECT_EQ(busy.uuid, kGpu0);
  EXPECT_EQ(busy.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(busy.pci_bus_id, "00000000:3B:00.0");
  EXPECT_EQ(busy.memory_total_bytes, 81920 * kMiB);
  EXPECT_EQ(busy.memory_used_bytes, 1024 * kMiB);
  EXPECT_EQ(busy.memory_free_bytes, (81920 - 1024) * kMiB);
  EXPECT_EQ(busy.utilization_percent, 37u);
  ASSERT_TRUE(busy.power_draw_watts.has_value());
  EXPECT_DOUBLE_EQ(*busy.power_draw_watts, 71.5);
  ASSERT_TRUE(busy.power_limit_watts.has_value());
  EXPECT_DOUBLE_EQ(*busy.power_limit_watts, 700.0);
  EXPECT_EQ(busy.compute_mode, ComputeMode::kExclusiveProcess);
  EXPECT_EQ(busy.mig_enabled, false);
  EXPECT_FALSE(busy.is_mig_instance());
  EXPECT_TRUE(busy.parent_uuid.empty());

  const Device& idle = devices[1];
  EXPECT_EQ(idle.index, 1u);
  EXPECT_EQ(idle.uuid, kGpu1);
  EXPECT_EQ(idle.pci_bus_id, "00000000:5E:00.0");  // normalised to upper case
  EXPECT_EQ(idle.utilization_percent, 0u);
  EXPECT_EQ(idle.compute_mode, ComputeMode::kDefault);
  EXPECT_DOUBLE_EQ(idle.power_limit_watts.value_or(0), 650.0);
}

TEST_F(NvmlDeviceSourceTest, DescriptionNamesDriverAndNvmlVersions) {
  use_machine("system driver=535.183.01 nvml=12.535.183\ngpu\n");
  EXPECT_EQ(make_nvml_source(kFull)->description(), "NVML (driver 535.183.01, NVML 12.535.183)");
}

TEST_F(NvmlDeviceSourceTest, UsesTheNewestEntryPointsOfACurrentDriver) {
  FakeDriver driver(kFull);
  ASSERT_TRUE(driver.loaded());
  use_machine(kTwoH100s + "proc gpu=0 pid=10 used_mib=1\n");
  make_nvml_source(kFull)->devices();
  EXPECT_EQ(driver.calls("nvmlInit_v2"), 1u);
  EXPECT_EQ(driver.calls("nvmlInit"), 0u);
  EXPECT_GT(driver.calls("nvmlDeviceGetCount_v2"), 0u);
  EXPECT_EQ(driver.calls("nvmlDeviceGetCount"), 0u);
  EXPECT_GT(driver.calls("nvmlDeviceGetHandleByIndex_v2"), 0u);
  EXPECT_EQ(driver.calls("nvmlDeviceGetHandleByIndex"), 0u);
  EXPECT_GT(driver.calls("nvmlDeviceGetPciInfo_v3"), 0u);
  EXPECT_EQ(driver.calls("nvmlDeviceGetPciInfo"), 0u);
  EXPECT_GT(driver.calls("nvmlDeviceGetMemoryInfo_v2"), 0u);
  EXPECT_EQ(driver.calls("nvmlDeviceGetMemoryInfo"), 0u);
  EXPECT_EQ(driver.calls("version_mismatch"), 0u);  // nvmlMemory_v2_t.version was right
  EXPECT_GT(driver.calls("nvmlDeviceGetComputeRunningProcesses_v3"), 0u);
  EXPECT_EQ(driver.calls("nvmlDeviceGetComputeRunningProcesses"), 0u);
  EXPECT_GT(driver.calls("nvmlDeviceGetEnforcedPowerLimit"), 0u);
  EXPECT_EQ(driver.calls("nvmlShutdown"), 1u);  // the source is gone again
}

TEST_F(NvmlDeviceSourceTest, EachSourceReadsTheMachineAfreshAfterShutdown) {
  FakeDriver driver(kFull);  // keeps the library loaded, so only nvmlShutdown can reset it
  ASSERT_TRUE(driver.loaded());
  use_machine("gpu uuid=GPU-aaaaaaaa-0000-4000-8000-000000000000\n");
  EXPECT_EQ(make_nvml_source(kFull)->devices().size(), 1u);
  use_machine("gpu\ngpu\ngpu\n");
  EXPECT_EQ(make_nvml_source(kFull)->devices().size(), 3u);  // needs nvmlShutdown in between
}

// ---- Processes -------------------------------------------------------------------------------

const std::string kProcesses = kTwoH100s +
                               "proc gpu=0 pid=1234 used_mib=500\n"
                               "proc gpu=0 pid=4321 used_mib=na\n"
                               "proc gpu=0 pid=77 used_mib=2048\n"
                               "proc gpu=1 pid=999 used_mib=1\n";

void expect_canned_processes(const std::vector<Device>& devices) {
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(pids(devices[0]), (std::vector<std::uint32_t>{1234, 4321, 77}));
  ASSERT_EQ(devices[0].processes.size(), 3u);
  EXPECT_EQ(devices[0].processes[0].used_memory_bytes, 500 * kMiB);
  EXPECT_FALSE(devices[0].processes[1].used_memory_bytes.has_value());  // NOT_AVAILABLE
  EXPECT_EQ(devices[0].processes[2].used_memory_bytes, 2048 * kMiB);
  EXPECT_EQ(pids(devices[1]), (std::vector<std::uint32_t>{999}));
}

TEST_F(NvmlDeviceSourceTest, ListsComputeProcessesFromV3) {
  use_machine(kProcesses);
  expect_canned_processes(make_nvml_source(kFull)->devices());
}

TEST_F(NvmlDeviceSourceTest, ReadsThe32ByteEntriesOfR535Drivers) {
  use_machine(kProcesses + "quirk v3_stride=32\n");  // nvitop PR#79
  expect_canned_processes(make_nvml_source(kFull)->devices());
}

TEST_F(NvmlDeviceSourceTest, Reads16ByteEntriesFromV3) {
  use_machine(kProcesses + "quirk v3_stride=16\n");  // nvitop PR#226
  expect_canned_processes(make_nvml_source(kFull)->devices());
}

TEST_F(NvmlDeviceSourceTest, RetriesWhenTheProcessListGrowsBetweenCalls) {
  FakeDriver driver(kFull);
  ASSERT_TRUE(driver.loaded());
  use_machine(kProcesses + "quirk stale_count=1\n");
  expect_canned_processes(make_nvml_source(kFull)->devices());
  // GPU 0: count query, a too-small fetch, a right-sized fetch. GPU 1 has one process, which
  // the stale count cannot hide (it only undercounts lists of two or more): query + fetch.
  EXPECT_EQ(driver.calls("nvmlDeviceGetComputeRunningProcesses_v3"), 5u);
}

TEST_F(NvmlDeviceSourceTest, ListsManyProcesses) {
  std::string machine = "gpu\n";
  for (int pid = 1000; pid < 1300; ++pid)
    machine += "proc gpu=0 pid=" + std::to_string(pid) + " used_mib=3\n";
  use_machine(machine);
  const auto devices = make_nvml_source(kFull)->devices();
  ASSERT_EQ(devices.size(), 1u);
  ASSERT_EQ(devices[0].processes.size(), 300u);
  EXPECT_EQ(devices[0].processes.front().pid, 1000u);
  EXPECT_EQ(devices[0].processes.back().pid, 1299u);
  EXPECT_EQ(devices[0].processes.back().used_memory_bytes, 3 * kMiB);
}

// ---- An old driver ---------------------------------------------------------------------------

TEST_F(NvmlDeviceSourceTest, WorksWithAnOldDriversUnversionedEntryPoints) {
  FakeDriver driver(kOld);
  ASSERT_TRUE(driver.loaded());
  use_machine(kProcesses);
  auto source = make_nvml_source(kOld);
  const auto devices = source->devices();
  expect_canned_processes(devices);  // 16-byte v1 entries

  const Device& gpu = devices[0];
  EXPECT_EQ(gpu.uuid, kGpu0);
  EXPECT_EQ(gpu.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpu.pci_bus_id, "00000000:3B:00.0");  // from the legacy "0000:3B:00.0"
  EXPECT_EQ(gpu.memory_total_bytes, 81920 * kMiB);
  EXPECT_EQ(gpu.memory_used_bytes, 1024 * kMiB);
  EXPECT_EQ(gpu.utilization_percent, 37u);
  EXPECT_DOUBLE_EQ(gpu.power_limit_watts.value_or(0), 700.0);   // nvmlDeviceGetPowerManagementLimit
  EXPECT_FALSE(gpu.mig_enabled.has_value());                    // no nvmlDeviceGetMigMode
  EXPECT_EQ(source->description(), "NVML (driver 550.54.15)");  // no nvmlSystemGetNVMLVersion

  EXPECT_EQ(driver.calls("nvmlInit"), 1u);
  EXPECT_GT(driver.calls("nvmlDeviceGetCount"), 0u);
  EXPECT_GT(driver.calls("nvmlDeviceGetComputeRunningProcesses"), 0u);
}

TEST_F(NvmlDeviceSourceTest, OldDriverWithoutTopologyGivesUnknownDistance) {
  use_machine(kTwoH100s);
  auto source = make_nvml_source(kOld);
  EXPECT_EQ(source->distance(kGpu0, kGpu1), 50);
  EXPECT_EQ(source->distance(kGpu0, kGpu0), 0);
}

// ---- MIG -------------------------------------------------------------------------------------

const char* const kMigA = "MIG-aaaaaaaa-0000-4000-8000-000000000001";
const char* const kMigB = "MIG-bbbbbbbb-0000-4000-8000-000000000002";
const char* const kMigC = "MIG-cccccccc-0000-4000-8000-000000000003";  // shares A's GPU instance

const std::string kMigMachine = kTwoH100s +
                                "gpu uuid=GPU-22222222-0000-4000-8000-000000000000"
                                " name=\"NVIDIA A100-SXM4-40GB\" bus=00000000:87:00.0 mig=1"
                                " total_mib=40960 used_mib=300\n"
                                "mig gpu=2 uuid=" +
                                kMigA +
                                " name=\"NVIDIA A100-SXM4-40GB MIG 3g.20gb\" total_mib=20096"
                                " used_mib=200 gi=1 ci=0 slot=0\n"
                                "mig gpu=2 uuid=" +
                                kMigB +
                                " total_mib=9856 used_mib=100 gi=5 ci=0 slot=2\n"
                                "mig gpu=2 uuid=" +
                                kMigC +
                                " total_mib=20096 gi=1 ci=1 slot=3\n"
                                "proc gpu=2 pid=501 used_mib=150 gi=1 ci=0\n"
                                "proc gpu=2 pid=502 used_mib=50 gi=1 ci=0\n"
                                "proc gpu=2 pid=503 used_mib=90 gi=5 ci=0\n"
                                "proc gpu=2 pid=504 used_mib=10 gi=1 ci=1\n";

TEST_F(NvmlDeviceSourceTest, ListsMigInstancesRightAfterTheirGpu) {
  use_machine(kMigMachine);
  const auto devices = make_nvml_source(kFull)->devices();
  ASSERT_EQ(devices.size(), 6u);
  EXPECT_EQ(devices[0].uuid, kGpu0);
  EXPECT_EQ(devices[1].uuid, kGpu1);

  const Device& gpu = devices[2];
  EXPECT_EQ(gpu.index, 2u);
  EXPECT_EQ(gpu.mig_enabled, true);
  EXPECT_FALSE(gpu.is_mig_instance());
  EXPECT_EQ(pids(gpu), (std::vector<std::uint32_t>{501, 502, 503, 504}));  // the whole GPU's

  // Slot 1 is empty (NOT_FOUND) and must be skipped, not end the list.
  const Device& a = devices[3];
  const Device& b = devices[4];
  const Device& c = devices[5];
  EXPECT_EQ(a.uuid, kMigA);
  EXPECT_EQ(b.uuid, kMigB);
  EXPECT_EQ(c.uuid, kMigC);
  for (const Device* instance : {&a, &b, &c}) {
    EXPECT_TRUE(instance->is_mig_instance());
    EXPECT_EQ(instance->index, 2u);
    EXPECT_EQ(instance->parent_uuid, gpu.uuid);
    EXPECT_EQ(instance->pci_bus_id, "00000000:87:00.0");
    EXPECT_FALSE(instance->mig_enabled.has_value());
    EXPECT_FALSE(instance->power_draw_watts.has_value());  // board-wide, not per instance
  }
  EXPECT_EQ(a.mig_index, 0u);
  EXPECT_EQ(b.mig_index, 1u);
  EXPECT_EQ(c.mig_index, 2u);
  EXPECT_EQ(a.name, "NVIDIA A100-SXM4-40GB MIG 3g.20gb");
  EXPECT_EQ(a.memory_total_bytes, 20096 * kMiB);
  EXPECT_EQ(a.memory_used_bytes, 200 * kMiB);
  EXPECT_EQ(b.memory_total_bytes, 9856 * kMiB);
  EXPECT_EQ(pids(a), (std::vector<std::uint32_t>{501, 502}));
  EXPECT_EQ(pids(b), (std::vector<std::uint32_t>{503}));
  EXPECT_EQ(pids(c), (std::vector<std::uint32_t>{504}));
}

TEST_F(NvmlDeviceSourceTest, MigProcessesComeFromGpuInstanceIdsWhenTheDriverRefuses) {
  FakeDriver driver(kFull);
  ASSERT_TRUE(driver.loaded());
  use_machine(kMigMachine + "fail func=nvmlDeviceGetComputeRunningProcesses target=mig code=3\n");
  const auto devices = make_nvml_source(kFull)->devices();
  EXPECT_EQ(pids(find(devices, kMigA)), (std::vector<std::uint32_t>{501, 502}));
  EXPECT_EQ(pids(find(devices, kMigB)), (std::vector<std::uint32_t>{503}));
  EXPECT_EQ(pids(find(devices, kMigC)), (std::vector<std::uint32_t>{504}));  // same GI as A
  EXPECT_EQ(find(devices, kMigA).processes[0].used_memory_bytes, 150 * kMiB);
  EXPECT_GT(driver.calls("nvmlDeviceGetGpuInstanceId"), 0u);
}

TEST_F(NvmlDeviceSourceTest, UnattributableMigProcessesMakeEveryInstanceBusy) {
  use_machine(kMigMachine +
              "fail func=nvmlDeviceGetComputeRunningProcesses target=mig code=3\n"
              "fail func=nvmlDeviceGetGpuInstanceId code=4\n");
  const auto devices = make_nvml_source(kFull)->devices();
  const std::vector<std::uint32_t> all = {501, 502, 503, 504};
  EXPECT_EQ(pids(find(devices, kMigA)), all);
  EXPECT_EQ(pids(find(devices, kMigB)), all);
  EXPECT_EQ(pids(find(devices, kMigC)), all);
}

// ---- Topology --------------------------------------------------------------------------------

// GPUs 0 and 1 share a PCIe switch; 0-2 is overridden to MULTIPLE; 2 and 3 share NUMA node 1;
// 1 and 3 have an NVLink both report; 0 reports a link to 2 that 2 does not report back.
const std::string kTopologyMachine =
    "gpu switch=1 numa=0\n"
    "gpu switch=1 numa=0\n"
    "gpu switch=2 numa=1\n"
    "gpu switch=3 numa=1 mig=1\n"
    "mig gpu=3 uuid=MIG-33333333-0000-4000-8000-000000000000 gi=1\n"
    "topo a=0 b=2 level=20\n"
    "nvlink a=1 b=3\n"
    "nvlink a=0 b=2 oneway=1\n";

TEST_F(NvmlDeviceSourceTest, DistanceFollowsTheTopologyAndNvlink) {
  use_machine(kTopologyMachine);
  auto source = make_nvml_source(kFull);
  const auto devices = source->devices();
  ASSERT_EQ(devices.size(), 5u);
  const std::string& g0 = devices[0].uuid;
  const std::string& g1 = devices[1].uuid;
  const std::string& g2 = devices[2].uuid;
  const std::string& g3 = devices[3].uuid;
  const std::string mig = "MIG-33333333-0000-4000-8000-000000000000";

  EXPECT_EQ(source->distance(g0, g0), 0);
  EXPECT_EQ(source->distance(g0, g1), 10);  // one PCIe switch
  EXPECT_EQ(source->distance(g0, g2), 20);  // one-way NVLink does not count
  EXPECT_EQ(source->distance(g2, g3), 40);  // same NUMA node
  EXPECT_EQ(source->distance(g0, g3), 50);  // across sockets
  EXPECT_EQ(source->distance(g1, g3), 0);   // NVLink both ways
  EXPECT_EQ(source->distance(g3, g1), 0);
  EXPECT_EQ(source->distance(mig, g3), 0);  // a MIG instance and its GPU
  EXPECT_EQ(source->distance(mig, g1), 0);  // MIG instances use their GPU's links
  EXPECT_EQ(source->distance(mig, g2), 40);
  EXPECT_EQ(source->distance(g0, "GPU-not-on-this-machine"), 50);
}

TEST_F(NvmlDeviceSourceTest, DistanceWorksBeforeAnyInventory) {
  use_machine(kTopologyMachine);
  auto source = make_nvml_source(kFull);
  EXPECT_EQ(source->distance("GPU-fa4e0000-0000-4000-8000-000000000000",
                             "MIG-33333333-0000-4000-8000-000000000000"),
            50);
  EXPECT_EQ(source->distance("GPU-fa4e0000-0000-4000-8000-000000000001",
                             "MIG-33333333-0000-4000-8000-000000000000"),
            0);
}

TEST_F(NvmlDeviceSourceTest, DistancesAreCached) {
  FakeDriver driver(kFull);
  ASSERT_TRUE(driver.loaded());
  use_machine(kTopologyMachine);
  auto source = make_nvml_source(kFull);
  const auto devices = source->devices();
  EXPECT_EQ(source->distance(devices[0].uuid, devices[2].uuid), 20);
  const unsigned long topology_calls = driver.calls("nvmlDeviceGetTopologyCommonAncestor");
  const unsigned long nvlink_calls = driver.calls("nvmlDeviceGetNvLinkState");
  EXPECT_EQ(topology_calls, 1u);
  EXPECT_EQ(source->distance(devices[0].uuid, devices[2].uuid), 20);
  EXPECT_EQ(source->distance(devices[2].uuid, devices[0].uuid), 20);
  EXPECT_EQ(driver.calls("nvmlDeviceGetTopologyCommonAncestor"), topology_calls);
  EXPECT_EQ(driver.calls("nvmlDeviceGetNvLinkState"), nvlink_calls);
}

TEST_F(NvmlDeviceSourceTest, TheMigModeIsReadAtMostOnceASecond) {
  FakeDriver driver(kFull);
  ASSERT_TRUE(driver.loaded());
  use_machine(kTwoH100s);
  auto source = make_nvml_source(kFull);
  const unsigned long before = driver.calls("nvmlDeviceGetMigMode");
  source->devices();
  const unsigned long first_look = driver.calls("nvmlDeviceGetMigMode") - before;
  EXPECT_EQ(first_look, 2u);  // one per GPU
  source->devices();
  source->devices();
  EXPECT_EQ(driver.calls("nvmlDeviceGetMigMode") - before, first_look);
  // Readings older than a second are made again (the mode changes with a GPU reset).
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  source->devices();
  EXPECT_EQ(driver.calls("nvmlDeviceGetMigMode") - before, 2 * first_look);
}

// ---- Fields the driver will not give ---------------------------------------------------------

TEST_F(NvmlDeviceSourceTest, UnsupportedFieldsAreLeftUnset) {
  use_machine(kProcesses +
              "fail func=nvmlDeviceGetName code=3\n"
              "fail func=nvmlDeviceGetPciInfo code=3\n"
              "fail func=nvmlDeviceGetMemoryInfo code=3\n"
              "fail func=nvmlDeviceGetUtilizationRates code=3\n"
              "fail func=nvmlDeviceGetPowerUsage code=3\n"
              "fail func=nvmlDeviceGetEnforcedPowerLimit code=3\n"
              "fail func=nvmlDeviceGetPowerManagementLimit code=4\n"
              "fail func=nvmlDeviceGetComputeMode code=4\n"
              "fail func=nvmlDeviceGetMigMode code=3\n"
              "fail func=nvmlDeviceGetComputeRunningProcesses code=4\n");
  const auto devices = make_nvml_source(kFull)->devices();
  ASSERT_EQ(devices.size(), 2u);
  const Device& gpu = devices[0];
  EXPECT_EQ(gpu.uuid, kGpu0);
  EXPECT_EQ(gpu.name, "");
  EXPECT_EQ(gpu.pci_bus_id, "");
  EXPECT_FALSE(gpu.memory_total_bytes.has_value());
  EXPECT_FALSE(gpu.memory_used_bytes.has_value());
  EXPECT_FALSE(gpu.memory_free_bytes.has_value());
  EXPECT_FALSE(gpu.utilization_percent.has_value());
  EXPECT_FALSE(gpu.power_draw_watts.has_value());
  EXPECT_FALSE(gpu.power_limit_watts.has_value());
  EXPECT_EQ(gpu.compute_mode, ComputeMode::kUnknown);
  EXPECT_FALSE(gpu.mig_enabled.has_value());
  EXPECT_TRUE(gpu.processes.empty());
}

TEST_F(NvmlDeviceSourceTest, OneFieldFailingLeavesTheOthers) {
  use_machine(kProcesses + "fail func=nvmlDeviceGetPowerUsage gpu=0 code=3\n");
  const auto devices = make_nvml_source(kFull)->devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_FALSE(devices[0].power_draw_watts.has_value());
  EXPECT_EQ(devices[0].utilization_percent, 37u);
  EXPECT_EQ(devices[0].processes.size(), 3u);
  EXPECT_DOUBLE_EQ(devices[1].power_draw_watts.value_or(0), 65.0);
}

TEST_F(NvmlDeviceSourceTest, PowerLimitFallsBackToTheManagementLimit) {
  FakeDriver driver(kFull);
  ASSERT_TRUE(driver.loaded());
  use_machine(kTwoH100s + "fail func=nvmlDeviceGetEnforcedPowerLimit code=3\n");
  const auto devices = make_nvml_source(kFull)->devices();
  EXPECT_DOUBLE_EQ(devices[0].power_limit_watts.value_or(0), 700.0);
  EXPECT_GT(driver.calls("nvmlDeviceGetPowerManagementLimit"), 0u);
}

TEST_F(NvmlDeviceSourceTest, MemoryFallsBackToV1WhenV2RejectsItsVersion) {
  FakeDriver driver(kFull);
  ASSERT_TRUE(driver.loaded());
  use_machine(kTwoH100s + "fail func=nvmlDeviceGetMemoryInfo_v2 code=25\n");
  const auto devices = make_nvml_source(kFull)->devices();
  EXPECT_EQ(devices[0].memory_used_bytes, 1024 * kMiB);
  EXPECT_GT(driver.calls("nvmlDeviceGetMemoryInfo"), 0u);
}

TEST_F(NvmlDeviceSourceTest, GpuWithoutAReadableUuidIsSkipped) {
  use_machine(kTwoH100s + "fail func=nvmlDeviceGetUUID gpu=0 code=15\n");
  const auto devices = make_nvml_source(kFull)->devices();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].uuid, kGpu1);
  EXPECT_EQ(devices[0].index, 1u);  // NVML's index, not a renumbering
}

// ---- Failures that are errors ----------------------------------------------------------------

TEST_F(NvmlDeviceSourceTest, FailingToCountGpusIsAnEnvironmentError) {
  use_machine(kTwoH100s + "fail func=nvmlDeviceGetCount code=15\n");
  auto source = make_nvml_source(kFull);
  const Error error = error_from([&] { source->devices(); });
  EXPECT_EQ(error.code(), ErrorCode::kEnvironment);
  EXPECT_NE(std::string(error.what()).find("GPU is lost"), std::string::npos) << error.what();
}

TEST_F(NvmlDeviceSourceTest, InitFailureIsAnEnvironmentError) {
  setenv("FAKE_NVML_INIT_FAIL", "9", 1);
  const Error error = error_from([] { make_nvml_source(kFull); });
  EXPECT_EQ(error.code(), ErrorCode::kEnvironment);
  const std::string message = error.what();
  EXPECT_NE(message.find("Driver Not Loaded"), std::string::npos) << message;
  EXPECT_NE(message.find("9"), std::string::npos) << message;
  EXPECT_NE(message.find(kFull), std::string::npos) << message;
  EXPECT_NE(message.find("GPULOCK_FAKE_GPUS"), std::string::npos) << message;
}

TEST_F(NvmlDeviceSourceTest, MissingLibraryIsAnEnvironmentErrorWithAdvice) {
  const std::string path = dir_ + "/libnvidia-ml.so.1";  // does not exist
  const Error error = error_from([&] { make_nvml_source(path); });
  EXPECT_EQ(error.code(), ErrorCode::kEnvironment);
  const std::string message = error.what();
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("NVIDIA driver"), std::string::npos) << message;
  EXPECT_NE(message.find("GPULOCK_FAKE_GPUS"), std::string::npos) << message;
}

TEST_F(NvmlDeviceSourceTest, LibraryWithoutARequiredEntryPointIsRejected) {
  const Error error = error_from([] { make_nvml_source(kNoUuid); });
  EXPECT_EQ(error.code(), ErrorCode::kEnvironment);
  const std::string message = error.what();
  EXPECT_NE(message.find("nvmlDeviceGetUUID"), std::string::npos) << message;
  EXPECT_NE(message.find(kNoUuid), std::string::npos) << message;
}

}  // namespace
}  // namespace gpulock
