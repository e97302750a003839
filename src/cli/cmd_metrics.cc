// `gpulock metrics [--output FILE]`: the Prometheus text format of the GPUs, the queue, idle GPUs,
// intruders and the usage journal's lease counters (gpulock/monitor.hpp), on stdout or written
// atomically to a file for node_exporter's textfile collector.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

// Writes `text` beside `path` and renames it into place, so the collector never reads half a
// file. The file is world-readable: it holds what `gpulock status` shows any user.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = fmt::format("{}.{}.tmp", path, ::getpid());
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("cannot write {}: {}", temporary, std::strerror(errno)));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("cannot write {}: {}", temporary, std::strerror(error)));
    }
    done += static_cast<std::size_t>(n);
  }
  ::fchmod(fd, 0644);
  if (::close(fd) != 0 || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw Error(ErrorCode::kEnvironment,
                fmt::format("cannot write {}: {}", path, std::strerror(error)));
  }
}

}  // namespace

void add_metrics_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "metrics", "Print Prometheus metrics: GPUs, holders, queue, idle GPUs, intruders");
  auto output = std::make_shared<std::string>();
  auto whole_pool = std::make_shared<bool>(false);
  auto backend = std::make_shared<std::string>();
  command
      ->add_option("-o,--output", *output,
                   "Write to FILE atomically (for node_exporter's textfile collector)")
      ->type_name("FILE");
  command->add_flag("--pool", *whole_pool,
                    "Redis backend: every host of the pool, not only this one");
  add_backend_option(*command, *backend);
  command->callback([output, whole_pool, backend, exit_status] {
    GpuPool pool = open_pool(*backend);
    PoolStatus status = *whole_pool ? pool.pool_status() : pool.status();
    IdleTracker(default_idle_record_path()).observe(status, pool.config().idle_after);
    // The whole journal, read once: this runs every 30 s or so (docs/operations.md, "Metrics").
    const LeaseCounts counts = pool.lease_counts();
    const std::string text = metrics_text(status, pool.queue(), &counts);
    if (output->empty()) {
      fmt::print("{}", text);
    } else {
      write_atomically(*output, text);
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
