// make_lease_id (src/util/random_id.h): ids of the documented form, never repeated, also
// between a process and its fork child (which must not hand out its parent's buffered bytes).
#include "util/random_id.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>
#include <thread>

namespace gpulock {
namespace {

TEST(LeaseId, HasTheFormAndDoesNotRepeat) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {  // several refills of the per-thread buffer
    const std::string id = make_lease_id();
    EXPECT_TRUE(is_lease_id(id)) << id;
    EXPECT_TRUE(seen.insert(id).second) << id;
  }
  std::string from_thread;
  std::thread([&] { from_thread = make_lease_id(); }).join();
  EXPECT_TRUE(seen.insert(from_thread).second) << from_thread;
}

// Every byte value at every position: only 0-9 and a-f make an id (the queue's index is
// world-writable, and an id names files).
TEST(LeaseId, OnlySixteenLowercaseHexDigitsAreAnId) {
  const std::string valid = "0123456789abcdef";
  ASSERT_TRUE(is_lease_id(valid));
  for (std::size_t position = 0; position < valid.size(); ++position) {
    for (int byte = 0; byte < 256; ++byte) {
      std::string id = valid;
      id[position] = static_cast<char>(byte);
      const bool hex = (byte >= '0' && byte <= '9') || (byte >= 'a' && byte <= 'f');
      EXPECT_EQ(is_lease_id(id), hex) << "byte " << byte << " at " << position;
    }
  }
  EXPECT_FALSE(is_lease_id(""));
  EXPECT_FALSE(is_lease_id(valid.substr(1)));
  EXPECT_FALSE(is_lease_id(valid + "0"));
  EXPECT_FALSE(is_lease_id("0123456789ABCDEF"));
}

TEST(LeaseId, AForkChildDoesNotRepeatItsParentsNextIds) {
  (void)make_lease_id();  // the parent's buffer holds its next ids
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    std::string ids;
    for (int i = 0; i < 4; ++i) ids += make_lease_id();
    ::_exit(::write(fds[1], ids.data(), ids.size()) == static_cast<ssize_t>(ids.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  char buffer[64];
  std::string child_ids;
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof buffer)) > 0) child_ids.append(buffer, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(child_ids.size(), 64u);
  for (int i = 0; i < 4; ++i) {
    const std::string mine = make_lease_id();
    for (int j = 0; j < 4; ++j) EXPECT_NE(child_ids.substr(16 * j, 16), mine);
  }
}

}  // namespace
}  // namespace gpulock
