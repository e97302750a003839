// Helpers shared by the benchmarks: a scratch lock directory and percentiles of samples.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <benchmark/benchmark.h>

namespace gpulock_bench {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
// lock_dir() is a path inside it that does not exist yet, so GpuPool creates it as it would
// create /run/lock/gpulock (mode 1777).
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "gpulock-bench-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path lock_dir() const { return path_ / "locks"; }

 private:
  std::filesystem::path path_;
};

// The q-quantile (0..1) of samples, nearest-rank; sorts the vector in place.
inline double quantile(std::vector<double>& samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  return samples[std::min(samples.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// Adds <prefix>p50_us, p90, p99 and max counters (microseconds) for samples given in seconds.
inline void add_percentile_counters(benchmark::State& state, std::vector<double> samples,
                                    const std::string& prefix = "") {
  if (samples.empty()) return;
  constexpr double kMicro = 1e6;
  state.counters[prefix + "p50_us"] = quantile(samples, 0.50) * kMicro;
  state.counters[prefix + "p90_us"] = quantile(samples, 0.90) * kMicro;
  state.counters[prefix + "p99_us"] = quantile(samples, 0.99) * kMicro;
  state.counters[prefix + "max_us"] = samples.back() * kMicro;
}

// The kernel floor of an uncontended lease of one GPU (issue 12): open the GPU's lock file,
// take an OFD write lock without waiting, close it (which drops the lock). Three system calls;
// what gpulock's own acquire + release is compared with, in the same run.
inline void kernel_floor_lease(benchmark::State& state) {
  TempDir scratch;
  const std::string path = (scratch.path() / "gpu-floor.lock").string();
  const int made = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (made < 0) {
    state.SkipWithError("cannot create the lock file");
    return;
  }
  ::close(made);
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (fd < 0 || ::fcntl(fd, F_OFD_SETLK, &lock) != 0) state.SkipWithError("open or lock failed");
    ::close(fd);
  }
}

}  // namespace gpulock_bench
