// The job state file: each write replaces the record in place, a torn slot leaves the previous
// record readable, and files that are not state files are refused, never followed or read whole.
#include "jobs/job_state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "gpulock/error.hpp"

namespace gpulock {
namespace {

class JobStateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gpulock-job-state-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    ::close(fd_);
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path file() const { return dir_ / kJobStateFile; }
  // Overwrites `count` bytes at `offset` with 'x', as a write torn by a crash might leave them.
  void damage(off_t offset, std::size_t count) const {
    const int fd = ::open(file().c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::string junk(count, 'x');
    ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), offset), static_cast<ssize_t>(count));
    ::close(fd);
  }

  std::filesystem::path dir_;
  int fd_ = -1;
};

TEST_F(JobStateFileTest, EachWriteReplacesTheRecordInAFileThatNeverGrows) {
  create_job_state(fd_, R"({"state":"waiting"})");
  EXPECT_EQ(read_job_state(fd_), R"({"state":"waiting"})");
  const auto size = std::filesystem::file_size(file());
  EXPECT_EQ(size, 2 * kJobStateSlotBytes);
  struct stat before {};
  ASSERT_EQ(::stat(file().c_str(), &before), 0);
  for (int i = 0; i < 5; ++i) {
    const std::string text = "record " + std::to_string(i);
    write_job_state(fd_, text);
    EXPECT_EQ(read_job_state(fd_), text);
  }
  struct stat after {};
  ASSERT_EQ(::stat(file().c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // written in place, not replaced
  EXPECT_EQ(after.st_size, before.st_size);
  EXPECT_EQ(after.st_blocks, before.st_blocks);
  // The longest text fits; a longer one is refused and the record stays.
  const std::string longest(kMaxJobStateText, 'a');
  write_job_state(fd_, longest);
  EXPECT_EQ(read_job_state(fd_), longest);
  EXPECT_THROW(write_job_state(fd_, longest + "a"), Error);
  EXPECT_EQ(read_job_state(fd_), longest);
  // It exists already: not made twice.
  EXPECT_THROW(create_job_state(fd_, "again"), Error);
}

TEST_F(JobStateFileTest, ATornSlotLeavesThePreviousRecord) {
  create_job_state(fd_, "first");
  write_job_state(fd_, "second");
  write_job_state(fd_, "third");
  std::string bytes;
  {
    std::ifstream in(file(), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::size_t at = bytes.find("third");
  ASSERT_NE(at, std::string::npos);
  const off_t slot = static_cast<off_t>(at / kJobStateSlotBytes * kJobStateSlotBytes);
  const off_t other = slot == 0 ? static_cast<off_t>(kJobStateSlotBytes) : 0;
  damage(static_cast<off_t>(at) + 4, 1);  // the text's last byte: its checksum fails
  EXPECT_EQ(read_job_state(fd_), "second");
  // The next write goes into the torn slot, not over "second".
  write_job_state(fd_, "fourth");
  EXPECT_EQ(read_job_state(fd_), "fourth");
  damage(slot, 10);  // its header
  EXPECT_EQ(read_job_state(fd_), "second");
  damage(other, 10);
  EXPECT_THROW(read_job_state(fd_), Error);  // neither slot whole
}

TEST_F(JobStateFileTest, WhatIsNotAStateFileIsRefused) {
  // Missing.
  EXPECT_THROW(read_job_state(fd_), Error);
  EXPECT_THROW(write_job_state(fd_, "x"), Error);
  // A symlink (to a real state file, even): not followed.
  std::filesystem::create_directory(dir_ / "real");
  const int real = ::open((dir_ / "real").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  create_job_state(real, "elsewhere");
  ::close(real);
  std::filesystem::create_symlink(dir_ / "real" / kJobStateFile, file());
  EXPECT_THROW(read_job_state(fd_), Error);
  EXPECT_THROW(write_job_state(fd_, "x"), Error);
  std::filesystem::remove(file());
  // A file of the wrong size, and garbage of the right one.
  std::ofstream(file()) << "{\"state\":\"done\"}";
  EXPECT_THROW(read_job_state(fd_), Error);
  EXPECT_THROW(write_job_state(fd_, "x"), Error);
  std::filesystem::remove(file());
  std::ofstream(file()) << std::string(2 * kJobStateSlotBytes, 'g');
  EXPECT_THROW(read_job_state(fd_), Error);
  std::filesystem::remove(file());
  // A FIFO: refused without blocking.
  ASSERT_EQ(::mkfifo(file().c_str(), 0600), 0);
  EXPECT_THROW(read_job_state(fd_), Error);
}

}  // namespace
}  // namespace gpulock
