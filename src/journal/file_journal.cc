// FileJournal: appending, rotating and reading the local usage journal's files.
#include "journal/file_journal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "journal/journal_line.h"
#include "util/current_pid.h"
#include "util/fd.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

constexpr unsigned kSizeCheckInterval = 64;
constexpr std::uint64_t kMaxReadBytes = 1ull << 30;  // one file read back; larger is damage

std::string own_file_name() {
  return fmt::format("usage-{}.log", ::geteuid());
}

UniqueFd open_directory(const std::string& path) {
  return UniqueFd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

// The whole content of a regular file under the directory, and its owner; nullopt with `why`
// otherwise.
std::optional<std::string> read_whole(int dir_fd, const std::string& name, std::string& why,
                                      unsigned& owner) {
  UniqueFd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file";
    return std::nullopt;
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxReadBytes) {
    why = "larger than 1 GiB";
    return std::nullopt;
  }
  owner = st.st_uid;
  return read_prefix(fd.get(), static_cast<std::size_t>(st.st_size));
}

// Parses the lines of `bytes` (a file's, `file` for warnings) into `contents`; a damaged line is
// skipped with a warning.
void add_records(std::string_view bytes, const std::string& file, unsigned owner,
                 JournalContents& contents, std::uint64_t first_byte = 0) {
  std::size_t begin = 0, line_number = 0;
  std::string why;
  while (begin < bytes.size()) {
    ++line_number;
    std::size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();  // a truncated last line
    const std::string_view line(bytes.data() + begin, end - begin);
    const std::size_t line_begin = begin;
    begin = end + 1;
    if (line.empty()) continue;
    if (auto record = parse_journal_line(line, &why)) {
      record->writer_uid = owner;
      contents.records.push_back(std::move(*record));
    } else if (first_byte == 0) {
      contents.warnings.push_back(
          fmt::format("{} line {}: damaged record skipped: {}", file, line_number, why));
    } else {
      contents.warnings.push_back(fmt::format("{} at byte {}: damaged record skipped: {}", file,
                                              first_byte + line_begin, why));
    }
  }
}

}  // namespace

bool is_journal_file_name(std::string_view name) {
  return name.size() > 10 && name.starts_with("usage-") && name.ends_with(".log");
}

std::vector<std::string> journal_file_names(int dir_fd) {
  std::vector<std::string> names;
  if (DIR* listing = ::fdopendir(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0))) {
    ::rewinddir(listing);
    while (const dirent* entry = ::readdir(listing))
      if (is_journal_file_name(entry->d_name)) names.emplace_back(entry->d_name);
    ::closedir(listing);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string journal_directory(const std::string& configured, const std::filesystem::path& lock_dir,
                              bool lock_dir_is_default) {
  if (const char* named = std::getenv("GPULOCK_JOURNAL_DIR"); named && *named) return named;
  if (!configured.empty()) return configured;
  if (lock_dir_is_default) return "/var/lib/gpulock/journal";
  return (lock_dir / "journal").string();
}

FileJournal::FileJournal(std::filesystem::path directory, std::uint64_t max_file_bytes)
    : directory_(std::move(directory)), max_file_bytes_(max_file_bytes) {}

void FileJournal::warn_once(const std::string& what) noexcept {
  if (warned_.exchange(true)) return;
  std::fprintf(stderr,
               "gpulock: warning: usage journal %s: %s; leases work, but are not recorded\n",
               directory_.c_str(), what.c_str());
}

bool FileJournal::open_own_file(std::string& why) {
  if (!dir_fd_) {
    std::string path = directory_.string();
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    dir_fd_ = open_directory(path);
    if (!dir_fd_ && errno == ENOENT) {
      // Its parents too (/var/lib/gpulock on a machine where only the package's tmpfiles.d
      // entry would have made it), where this process may: root's first lease is recorded.
      int made = ::mkdir(path.c_str(), 0700);
      if (made != 0 && errno == ENOENT) {
        std::error_code ignored;
        std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
        made = ::mkdir(path.c_str(), 0700);
      }
      if (made == 0) {
        dir_fd_ = open_directory(path);
        if (dir_fd_) ::fchmod(dir_fd_.get(), 01777);  // others may then add their own files
      } else if (errno == EEXIST) {
        dir_fd_ = open_directory(path);
      } else {
        why.clear();  // no journal set up here (`gpulock init` makes it): silently off
        return false;
      }
    }
    if (!dir_fd_) {
      why = errno_message("cannot open the directory", errno);
      return false;
    }
  }
  const std::string name = own_file_name();
  UniqueFd fd(::openat(dir_fd_.get(), name.c_str(), O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC));
  if (!fd && errno == ENOENT) {
    fd.reset(::openat(dir_fd_.get(), name.c_str(),
                      O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd)
      ::fchmod(fd.get(), 0644);
    else if (errno == EEXIST)  // another process of ours made it meanwhile
      fd.reset(::openat(dir_fd_.get(), name.c_str(), O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC));
  }
  if (!fd) {
    why = errno_message(fmt::format("cannot open {}", name), errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      st.st_nlink != 1) {
    // Someone else's file under our name (or a hard link to one): never write into it.
    why = fmt::format("{} is not a plain file of ours (planted by someone else?)", name);
    return false;
  }
  // A writer that died mid-line (or a full disk) may have left a line without its newline:
  // ending it keeps our first record from being glued to it (the torn line is skipped alone).
  char last = '\n';
  if (st.st_size > 0 && ::pread(fd.get(), &last, 1, st.st_size - 1) == 1 && last != '\n')
    (void)!::write(fd.get(), "\n", 1);
  file_ = std::move(fd);
  size_estimate_ = static_cast<std::uint64_t>(st.st_size);
  appends_since_check_ = 0;
  rotation_left_to_root_ = false;
  opened_by_ = current_pid();
  return true;
}

void FileJournal::rotate_if_full() {
  appends_since_check_ = 0;
  rotation_left_to_root_ = false;
  struct stat st {};
  if (::fstat(file_.get(), &st) != 0) return;
  size_estimate_ = static_cast<std::uint64_t>(st.st_size);
  if (size_estimate_ < max_file_bytes_) return;
  // Every process of this user that finds the file full gets here; the flock makes one of them
  // rename it, and the others find the name already pointing at a new file.
  while (::flock(file_.get(), LOCK_EX) != 0 && errno == EINTR) {
  }
  const std::string name = own_file_name();
  struct stat current {};
  if (::fstatat(dir_fd_.get(), name.c_str(), &current, AT_SYMLINK_NOFOLLOW) == 0 &&
      current.st_ino == st.st_ino && current.st_dev == st.st_dev) {
    const std::string rotated =
        fmt::format("usage-{}-{}-{}.log", ::geteuid(), static_cast<long long>(std::time(nullptr)),
                    make_lease_id());
    if (::renameat(dir_fd_.get(), name.c_str(), dir_fd_.get(), rotated.c_str()) != 0) {
      const int error = errno;
      ::flock(file_.get(), LOCK_UN);
      // Sealed append-only by root (journal/journal_seal.h): root rotates it, and this process
      // goes on appending; it looks again at its next size check.
      if (error == EPERM) {
        rotation_left_to_root_ = true;
        return;
      }
      warn_once(errno_message("cannot rotate " + name, error));
      file_.reset();
      return;
    }
  }
  ::flock(file_.get(), LOCK_UN);
  file_.reset();  // the next record goes to a fresh file under the name
}

void FileJournal::append(const JournalRecord& record) noexcept {
  try {
    const std::string line = journal_line(record);
    std::lock_guard<std::mutex> lock(mutex_);
    if (disabled_) return;
    if (file_ && opened_by_ != current_pid()) file_.reset();
    if (!file_) {
      std::string why;
      if (!open_own_file(why)) {
        disabled_ = true;
        if (!why.empty()) warn_once(why);
        return;
      }
    }
    ssize_t n;
    do {
      n = ::write(file_.get(), line.data(), line.size());
    } while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(line.size())) {
      const int e = n < 0 ? errno : ENOSPC;
      // A cut line must not swallow the next record: end it (readers skip it by its checksum).
      if (n > 0) (void)!::write(file_.get(), "\n", 1);
      warn_once(errno_message("cannot append a record", e));
      return;  // later records are tried again: the disk may have room by then
    }
    size_estimate_ += line.size();
    if ((size_estimate_ >= max_file_bytes_ && !rotation_left_to_root_) ||
        ++appends_since_check_ >= kSizeCheckInterval)
      rotate_if_full();
  } catch (...) {
    warn_once("out of memory");
  }
}

void FileJournal::forget_descriptors() noexcept {
  (void)dir_fd_.release();
  (void)file_.release();
}

void FileJournal::prepare() const {
  std::string path = directory_.string();
  std::error_code ignored;
  std::filesystem::create_directories(directory_.parent_path(), ignored);
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error(ErrorCode::kEnvironment,
                errno_message(fmt::format("cannot create the usage journal {}", path), errno));
  UniqueFd fd = open_directory(path);
  if (!fd)
    throw Error(ErrorCode::kEnvironment,
                errno_message(fmt::format("cannot open the usage journal {}", path), errno));
  if (::geteuid() == 0 && ::fchown(fd.get(), 0, 0) != 0)
    throw Error(ErrorCode::kEnvironment, errno_message("chown " + path, errno));
  if (::fchmod(fd.get(), 01777) != 0)
    throw Error(ErrorCode::kEnvironment, errno_message("chmod " + path, errno));
}

UniqueFd FileJournal::open_for_reading(JournalContents& contents,
                                       std::vector<std::string>& names) const {
  contents.location = directory_.string();
  UniqueFd dir = open_directory(directory_.string());
  if (!dir) {
    contents.available = false;
    if (errno != ENOENT)
      contents.warnings.push_back(errno_message("cannot read " + directory_.string(), errno));
    return dir;
  }
  names = journal_file_names(dir.get());
  return dir;
}

JournalContents FileJournal::read() {
  JournalContents contents;
  std::vector<std::string> names;
  const UniqueFd dir = open_for_reading(contents, names);
  if (!dir) return contents;
  for (const auto& name : names) {
    std::string why;
    unsigned owner = 0;
    const auto bytes = read_whole(dir.get(), name, why, owner);
    if (!bytes) {
      contents.warnings.push_back(fmt::format("{}/{}: skipped: {}", contents.location, name, why));
      continue;
    }
    add_records(*bytes, fmt::format("{}/{}", contents.location, name), owner, contents);
  }
  std::stable_sort(contents.records.begin(), contents.records.end(),
                   [](const JournalRecord& a, const JournalRecord& b) { return a.time < b.time; });
  return contents;
}

JournalContents FileJournal::read_appended(JournalCursor& cursor, bool& whole) {
  whole = false;
  JournalContents contents;
  std::vector<std::string> names;
  const UniqueFd dir = open_for_reading(contents, names);
  if (!dir) return contents;
  decltype(cursor.offsets) offsets;  // only the files that are still there
  for (const auto& name : names) {
    const std::string file = fmt::format("{}/{}", contents.location, name);
    UniqueFd fd(::openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      contents.warnings.push_back(
          fmt::format("{}: skipped: {}", file, fd ? "not a regular file" : std::strerror(errno)));
      continue;
    }
    const auto key = std::make_pair(static_cast<std::uint64_t>(st.st_dev),
                                    static_cast<std::uint64_t>(st.st_ino));
    const auto known = cursor.offsets.find(key);
    std::uint64_t offset = known == cursor.offsets.end() ? 0 : known->second;
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size < offset) offset = 0;  // its owner cut it (journals only grow): read it anew
    if (size - offset > kMaxReadBytes) {
      contents.warnings.push_back(fmt::format("{}: skipped: larger than 1 GiB", file));
      offsets[key] = size;
      continue;
    }
    std::string bytes(static_cast<std::size_t>(size - offset), '\0');
    std::size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::pread(fd.get(), bytes.data() + got, bytes.size() - got,
                                static_cast<off_t>(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    // Whole lines only: a line still being written is read next time.
    const std::size_t last_newline = std::string_view(bytes.data(), got).rfind('\n');
    const std::size_t whole_lines = last_newline == std::string::npos ? 0 : last_newline + 1;
    add_records(std::string_view(bytes.data(), whole_lines), file, st.st_uid, contents, offset);
    offsets[key] = offset + whole_lines;
  }
  cursor.offsets = std::move(offsets);
  std::stable_sort(contents.records.begin(), contents.records.end(),
                   [](const JournalRecord& a, const JournalRecord& b) { return a.time < b.time; });
  return contents;
}

}  // namespace gpulock
