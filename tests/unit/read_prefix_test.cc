// read_prefix(): the whole of a file up to a limit, whatever its size against the buffer it starts
// with.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "util/fd.h"

namespace gpulock {
namespace {

class ReadPrefixTest : public ::testing::Test {
 protected:
  UniqueFd file_with(const std::string& bytes) {
    char name[] = "/tmp/gpulock-read-prefix-XXXXXX";
    const int fd = ::mkstemp(name);
    EXPECT_GE(fd, 0);
    ::unlink(name);
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    return UniqueFd(fd);
  }
};

TEST_F(ReadPrefixTest, ReadsSmallEmptyAndLargeFilesWhole) {
  EXPECT_EQ(read_prefix(file_with("").get(), 1 << 20), "");
  EXPECT_EQ(read_prefix(file_with("55").get(), 1 << 20), "55");
  std::string large(300000, 'x');
  large[299999] = 'y';
  EXPECT_EQ(read_prefix(file_with(large).get(), 1 << 20), large);
  const std::string exact(4096, 'z');
  EXPECT_EQ(read_prefix(file_with(exact).get(), 1 << 20), exact);
}

TEST_F(ReadPrefixTest, StopsAtTheLimit) {
  const std::string large(10000, 'x');
  EXPECT_EQ(read_prefix(file_with(large).get(), 5000), large.substr(0, 5000));
  EXPECT_EQ(read_prefix(file_with(large).get(), 4096), large.substr(0, 4096));
  EXPECT_EQ(read_prefix(file_with(large).get(), 0), "");
}

}  // namespace
}  // namespace gpulock
