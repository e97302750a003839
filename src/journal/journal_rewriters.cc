// find_journal_rewriters(): each process's descriptors under /proc/<pid>/fd, their open flags
// from /proc/<pid>/fdinfo/<fd>.
#include "journal/journal_rewriters.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "journal/file_journal.h"
#include "util/fd.h"

namespace gpulock {
namespace {

using FileId = std::pair<dev_t, ino_t>;

bool all_digits(const char* name) {
  if (!*name) return false;
  for (; *name; ++name)
    if (!std::isdigit(static_cast<unsigned char>(*name))) return false;
  return true;
}

// The open flags of descriptor `fd` of the process whose /proc directory is `proc_fd`.
std::optional<int> open_flags(int proc_fd, const char* fd) {
  const std::string path = fmt::format("fdinfo/{}", fd);
  UniqueFd info(::openat(proc_fd, path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!info) return std::nullopt;
  const std::string text = read_prefix(info.get(), 4096);
  const auto at = text.find("flags:");
  if (at == std::string::npos) return std::nullopt;
  return static_cast<int>(std::strtol(text.c_str() + at + 6, nullptr, 8));
}

}  // namespace

std::vector<std::string> find_journal_rewriters(int dir_fd) {
  std::map<FileId, std::string> files;
  for (const auto& name : journal_file_names(dir_fd)) {
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      files[{st.st_dev, st.st_ino}] = name;
  }
  std::vector<std::string> found;
  if (files.empty()) return found;
  DIR* processes = ::opendir("/proc");
  if (processes == nullptr) return found;
  while (const dirent* process = ::readdir(processes)) {
    if (!all_digits(process->d_name)) continue;
    UniqueFd proc(
        ::openat(::dirfd(processes), process->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    struct stat owner {};
    if (!proc || ::fstat(proc.get(), &owner) != 0) continue;
    DIR* descriptors = ::fdopendir(::openat(proc.get(), "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (descriptors == nullptr) continue;
    while (const dirent* fd = ::readdir(descriptors)) {
      if (!all_digits(fd->d_name)) continue;
      struct stat st {};
      if (::fstatat(::dirfd(descriptors), fd->d_name, &st, 0) != 0) continue;  // follows it
      const auto file = files.find({st.st_dev, st.st_ino});
      if (file == files.end()) continue;
      const auto flags = open_flags(proc.get(), fd->d_name);
      if (!flags || (*flags & O_ACCMODE) == O_RDONLY || (*flags & O_APPEND)) continue;
      found.push_back(
          fmt::format("{}: pid {} (uid {}) holds it open for writing without "
                      "O_APPEND (descriptor {}), and can overwrite it though sealed",
                      file->second, process->d_name, owner.st_uid, fd->d_name));
    }
    ::closedir(descriptors);
  }
  ::closedir(processes);
  return found;
}

}  // namespace gpulock
