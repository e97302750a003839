// Simulated GPUs: N idle devices, or devices described by a JSON file (docs/simulated-gpus.md).
//
// The file is read again on every query, so tests and demos can change memory use, utilisation,
// power and processes while gpulock runs. A malformed file is an error naming the file and the
// offending field, never a crash.
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpulock/device_source.hpp"
#include "gpulock/error.hpp"
#include "gpulock/parse.hpp"
#include "util/strings.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr std::uint64_t kGiB = 1024ULL * 1024 * 1024;
constexpr std::uint64_t kDefaultMemory = 80 * kGiB;

// With GPULOCK_HOST set (fake hosts of a Redis pool on one machine), the UUIDs differ per host
// name, as real GPUs' do; otherwise they are fixed.
std::uint32_t host_hash() {
  std::uint32_t hash = 0;
  if (const char* host = std::getenv("GPULOCK_HOST"); host != nullptr && *host != '\0') {
    hash = 2166136261u;  // FNV-1a
    for (const char* c = host; *c != '\0'; ++c)
      hash = (hash ^ static_cast<unsigned char>(*c)) * 16777619u;
  }
  return hash;
}

std::string simulated_uuid(unsigned index) {
  const std::uint32_t hash = host_hash();
  return fmt::format("GPU-5e1f0a7e-{:04x}-4{:03x}-8000-{:012x}", hash >> 16, hash & 0xfff, index);
}

std::string simulated_mig_uuid(unsigned instance, unsigned gpu) {
  const std::uint32_t hash = host_hash();
  return fmt::format("MIG-5e1f0a7e-{:04x}-4{:03x}-8{:03x}-{:012x}", instance, hash >> 20,
                     (hash >> 8) & 0xfff, gpu);
}

Device idle_device(unsigned index) {
  Device device;
  device.index = index;
  device.uuid = simulated_uuid(index);
  device.name = "Simulated GPU";
  device.pci_bus_id = fmt::format("00000000:{:02X}:00.0", 0x10 + index);
  device.memory_total_bytes = kDefaultMemory;
  device.memory_used_bytes = 0;
  device.memory_free_bytes = kDefaultMemory;
  device.utilization_percent = 0;
  device.power_draw_watts = 60.0;
  device.power_limit_watts = 700.0;
  device.compute_mode = ComputeMode::kDefault;
  device.mig_enabled = false;
  return device;
}

class IdleSimulatedSource final : public DeviceSource {
 public:
  explicit IdleSimulatedSource(unsigned count) : count_(count) {}
  std::vector<Device> devices() override {
    std::vector<Device> out;
    out.reserve(count_);
    for (unsigned i = 0; i < count_; ++i) out.push_back(idle_device(i));
    return out;
  }
  int distance(const std::string& a, const std::string& b) override { return a == b ? 0 : 50; }
  std::string description() const override { return fmt::format("{} simulated GPUs", count_); }
  bool simulated() const override { return true; }

 private:
  unsigned count_;
};

// Reads one described device; `where` names it in error messages ("gpus[2]").
class FileReader {
 public:
  explicit FileReader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("simulated GPU file {}: {}: {}", path_, where, what));
  }

  void check_keys(const json& object, const std::string& where,
                  const std::set<std::string>& allowed) const {
    if (!object.is_object()) fail(where, "expected an object");
    for (const auto& [key, value] : object.items()) {
      (void)value;
      if (!allowed.contains(key))
        fail(where, fmt::format("unknown field '{}'", sanitize_for_display(key, 40)));
    }
  }

  std::uint64_t size(const json& value, const std::string& where) const {
    if (value.is_number_unsigned()) return value.get<std::uint64_t>();
    if (value.is_string()) {
      try {
        return parse_size(value.get<std::string>());
      } catch (const Error& error) {
        fail(where, error.what());
      }
    }
    fail(where, "expected a size such as \"80G\" or a number of bytes");
  }

  double number(const json& value, const std::string& where, double low, double high) const {
    if (!value.is_number()) fail(where, "expected a number");
    const double x = value.get<double>();
    if (!(x >= low && x <= high)) fail(where, fmt::format("must be within {}..{}", low, high));
    return x;
  }

  std::string text(const json& value, const std::string& where) const {
    if (!value.is_string()) fail(where, "expected a string");
    return value.get<std::string>();
  }

  std::vector<GpuProcess> processes(const json& list, const std::string& where) const {
    if (!list.is_array()) fail(where, "expected a list");
    std::vector<GpuProcess> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string at = fmt::format("{}[{}]", where, i);
      check_keys(list[i], at, {"pid", "used_memory"});
      GpuProcess process;
      if (!list[i].contains("pid")) fail(at, "missing 'pid'");
      process.pid = static_cast<std::uint32_t>(number(list[i]["pid"], at + ".pid", 1, 4194304));
      if (list[i].contains("used_memory"))
        process.used_memory_bytes = size(list[i]["used_memory"], at + ".used_memory");
      out.push_back(process);
    }
    return out;
  }

  // Memory: total given or 80 GiB; used given or the sum of the processes' memory.
  void fill_memory(Device& device, const json& spec, const std::string& where) const {
    device.memory_total_bytes = spec.contains("memory_total")
                                    ? size(spec["memory_total"], where + ".memory_total")
                                    : kDefaultMemory;
    std::uint64_t used = 0;
    if (spec.contains("memory_used")) {
      used = size(spec["memory_used"], where + ".memory_used");
    } else {
      for (const auto& p : device.processes) used += p.used_memory_bytes.value_or(0);
    }
    if (used > *device.memory_total_bytes) fail(where, "memory_used exceeds memory_total");
    device.memory_used_bytes = used;
    device.memory_free_bytes = *device.memory_total_bytes - used;
  }

  static ComputeMode compute_mode(const std::string& name) {
    if (name == "default") return ComputeMode::kDefault;
    if (name == "exclusive_process") return ComputeMode::kExclusiveProcess;
    if (name == "exclusive_thread") return ComputeMode::kExclusiveThread;
    if (name == "prohibited") return ComputeMode::kProhibited;
    return ComputeMode::kUnknown;
  }

  std::vector<Device> read(std::map<std::string, int>& switches) const {
    std::ifstream in(path_);
    if (!in) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("cannot read simulated GPU file {} (GPULOCK_FAKE_GPUS)", path_));
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    json root;
    try {
      root = json::parse(buffer.str());
    } catch (const json::exception& error) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("simulated GPU file {} is not valid JSON: {}", path_, error.what()));
    }
    check_keys(root, "top level", {"gpus", "comment"});
    if (!root.contains("gpus") || !root["gpus"].is_array())
      fail("top level", "expected \"gpus\": [...]");

    std::vector<Device> out;
    std::set<std::string> uuids;
    const auto& gpus = root["gpus"];
    for (std::size_t i = 0; i < gpus.size(); ++i) {
      const std::string where = fmt::format("gpus[{}]", i);
      const json& spec = gpus[i];
      check_keys(
          spec, where,
          {"uuid", "name", "pci_bus_id", "memory_total", "memory_used", "utilization", "power_draw",
           "power_limit", "compute_mode", "processes", "switch", "mig", "idle_since", "comment"});
      Device device = idle_device(static_cast<unsigned>(i));
      if (spec.contains("uuid")) device.uuid = text(spec["uuid"], where + ".uuid");
      if (spec.contains("name")) device.name = text(spec["name"], where + ".name");
      if (spec.contains("pci_bus_id"))
        device.pci_bus_id = text(spec["pci_bus_id"], where + ".pci_bus_id");
      if (spec.contains("processes"))
        device.processes = processes(spec["processes"], where + ".processes");
      fill_memory(device, spec, where);
      if (spec.contains("utilization"))
        device.utilization_percent =
            static_cast<unsigned>(number(spec["utilization"], where + ".utilization", 0, 100));
      if (spec.contains("idle_since")) {
        if (device.utilization_percent.value_or(0) != 0)
          fail(where + ".idle_since", "a GPU idle since a time must have utilization 0");
        device.idle_since =
            from_unix_seconds(number(spec["idle_since"], where + ".idle_since", 0, 1e11));
      }
      if (spec.contains("power_draw"))
        device.power_draw_watts = number(spec["power_draw"], where + ".power_draw", 0, 1e5);
      if (spec.contains("power_limit"))
        device.power_limit_watts = number(spec["power_limit"], where + ".power_limit", 0, 1e5);
      if (spec.contains("compute_mode")) {
        device.compute_mode = compute_mode(text(spec["compute_mode"], where + ".compute_mode"));
        if (device.compute_mode == ComputeMode::kUnknown)
          fail(where + ".compute_mode",
               "use default, exclusive_process, exclusive_thread or prohibited");
      }
      if (spec.contains("switch"))
        switches[device.uuid] = static_cast<int>(number(spec["switch"], where + ".switch", 0, 1e6));
      if (!uuids.insert(device.uuid).second) fail(where, "duplicate uuid " + device.uuid);

      std::vector<Device> instances;
      if (spec.contains("mig")) {
        const json& migs = spec["mig"];
        if (!migs.is_array()) fail(where + ".mig", "expected a list of MIG instances");
        device.mig_enabled = true;
        for (std::size_t m = 0; m < migs.size(); ++m) {
          const std::string at = fmt::format("{}.mig[{}]", where, m);
          check_keys(migs[m], at, {"uuid", "memory_total", "memory_used", "processes"});
          Device instance;
          instance.index = device.index;
          instance.mig_index = static_cast<unsigned>(m);
          instance.uuid = migs[m].contains("uuid") ? text(migs[m]["uuid"], at + ".uuid")
                                                   : simulated_mig_uuid(m, i);
          instance.name = device.name + " MIG";
          instance.pci_bus_id = device.pci_bus_id;
          instance.parent_uuid = device.uuid;
          instance.compute_mode = device.compute_mode;
          if (migs[m].contains("processes"))
            instance.processes = processes(migs[m]["processes"], at + ".processes");
          fill_memory(instance, migs[m], at);
          if (!uuids.insert(instance.uuid).second) fail(at, "duplicate uuid " + instance.uuid);
          if (switches.contains(device.uuid)) switches[instance.uuid] = switches[device.uuid];
          instances.push_back(std::move(instance));
        }
      }
      out.push_back(std::move(device));
      for (auto& instance : instances) out.push_back(std::move(instance));
    }
    return out;
  }

 private:
  std::string path_;
};

class FileSimulatedSource final : public DeviceSource {
 public:
  explicit FileSimulatedSource(std::string path) : path_(std::move(path)) { devices(); }

  std::vector<Device> devices() override {
    std::map<std::string, int> switches;
    auto out = FileReader(path_).read(switches);
    std::lock_guard<std::mutex> lock(mutex_);
    switches_ = std::move(switches);
    count_ = out.size();
    return out;
  }

  int distance(const std::string& a, const std::string& b) override {
    if (a == b) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto ia = switches_.find(a), ib = switches_.find(b);
    if (ia == switches_.end() || ib == switches_.end()) return 50;
    return ia->second == ib->second ? 10 : 50;
  }

  std::string description() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return fmt::format("{} simulated devices from {}", count_, path_);
  }
  bool simulated() const override { return true; }

 private:
  const std::string path_;
  mutable std::mutex mutex_;  // guards what devices() learns for distance() and description()
  std::map<std::string, int> switches_;
  std::size_t count_ = 0;
};

}  // namespace

std::unique_ptr<DeviceSource> make_simulated_source(unsigned count) {
  return std::make_unique<IdleSimulatedSource>(count);
}

std::unique_ptr<DeviceSource> make_simulated_source_from_file(const std::string& path) {
  return std::make_unique<FileSimulatedSource>(path);
}

}  // namespace gpulock
