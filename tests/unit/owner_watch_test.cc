// OwnerWatch (src/process/owner_watch.h) with real processes: a watched process, and a session
// whose leader exits first, whose members outnumber the pidfds watched, and which gains a
// member after the watch has scanned it.
#include "process/owner_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <vector>

#include "gpulock/error.hpp"

namespace gpulock {
namespace {

// Waits (at most 10 s) until the watch has something to say, then asks it.
bool GoneAfterWakeUp(OwnerWatch& watch) {
  std::vector<pollfd> fds;
  for (const int fd : watch.descriptors()) fds.push_back({fd, POLLIN, 0});
  if (!fds.empty()) ::poll(fds.data(), fds.size(), 10000);
  return watch.gone();
}

// Kills a process and waits until it is no longer running (not even as a zombie of ours).
void Kill(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);  // reaps the ones that are our children; others go to init
  for (int i = 0; i < 1000 && ::kill(pid, 0) == 0; ++i) {
    const auto stat = read_process_stat(pid);
    if (!stat) break;  // a zombie: exited
    ::usleep(1000);
  }
}

// A session of `size` processes that sleep until killed: a leader that called setsid() and
// `size - 1` members it forked. On a byte on `fork_on`, a member forks one more member and exits.
// Each process reports its pid on `report`.
struct Session {
  pid_t id = 0;
  std::vector<pid_t> members;  // the leader first
  int fork_request = -1;       // write a byte: the newest member forks a new one and exits
  int report = -1;

  explicit Session(int size) {
    int report_pipe[2], fork_pipe[2];
    EXPECT_EQ(::pipe(report_pipe), 0);
    EXPECT_EQ(::pipe(fork_pipe), 0);
    const pid_t leader = ::fork();
    if (leader == 0) {
      ::setsid();
      for (int i = 1; i < size; ++i)
        if (::fork() == 0) break;  // the leader forks the other members
      Serve(report_pipe[1], fork_pipe[0]);
    }
    ::close(report_pipe[1]);
    ::close(fork_pipe[0]);
    report = report_pipe[0];
    fork_request = fork_pipe[1];
    id = leader;
    for (int i = 0; i < size; ++i) members.push_back(ReadPid());
  }
  ~Session() {
    for (const pid_t pid : members) ::kill(pid, SIGKILL);
    ::waitpid(id, nullptr, 0);
    ::close(report);
    ::close(fork_request);
  }

  pid_t ReadPid() {
    pid_t pid = 0;
    EXPECT_EQ(::read(report, &pid, sizeof pid), static_cast<ssize_t>(sizeof pid));
    return pid;
  }

  [[noreturn]] static void Serve(int report, int fork_on) {
    const pid_t self = ::getpid();
    [[maybe_unused]] ssize_t n = ::write(report, &self, sizeof self);
    char byte;
    while (::read(fork_on, &byte, 1) == 1) {
      if (::fork() == 0) {
        const pid_t child = ::getpid();
        n = ::write(report, &child, sizeof child);
        continue;  // the new member serves the next request
      }
      ::_exit(0);
    }
    while (true) ::pause();
  }
};

TEST(OwnerWatchTest, AProcessIsGoneWhenItExits) {
  const pid_t child = ::fork();
  if (child == 0) {
    while (true) ::pause();
  }
  OwnerWatch watch = OwnerWatch::process(child);
  EXPECT_EQ(watch.session_id(), 0);
  EXPECT_FALSE(watch.gone());
  ::kill(child, SIGKILL);
  EXPECT_TRUE(GoneAfterWakeUp(watch));
  ::waitpid(child, nullptr, 0);
}

TEST(OwnerWatchTest, NoSuchProcessIsRefused) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  EXPECT_THROW(OwnerWatch::process(child), Error);
  EXPECT_THROW(OwnerWatch::process(0), Error);
}

TEST(OwnerWatchTest, ASessionLivesOnAfterItsLeaderUntilItsLastProcess) {
  Session session(3);
  OwnerWatch watch = OwnerWatch::session(session.id);
  EXPECT_EQ(watch.session_id(), session.id);
  EXPECT_FALSE(watch.gone());
  Kill(session.members[0]);  // the leader: a login shell that has exited, its jobs running on
  EXPECT_FALSE(GoneAfterWakeUp(watch));
  Kill(session.members[1]);
  EXPECT_FALSE(GoneAfterWakeUp(watch));
  Kill(session.members[2]);
  EXPECT_TRUE(GoneAfterWakeUp(watch));
}

TEST(OwnerWatchTest, AMemberForkedAfterTheScanKeepsTheSession) {
  Session session(1);
  OwnerWatch watch = OwnerWatch::session(session.id);
  // The only member forks a new one and exits: the new one was not there when the watch looked.
  ASSERT_EQ(::write(session.fork_request, "x", 1), 1);
  session.members.push_back(session.ReadPid());
  EXPECT_FALSE(GoneAfterWakeUp(watch));
  ASSERT_EQ(::write(session.fork_request, "x", 1), 1);
  session.members.push_back(session.ReadPid());
  EXPECT_FALSE(GoneAfterWakeUp(watch));
  Kill(session.members.back());
  EXPECT_TRUE(GoneAfterWakeUp(watch));
}

TEST(OwnerWatchTest, MoreMembersThanWatchedAtOnceAreAllWaitedFor) {
  Session session(40);
  OwnerWatch watch = OwnerWatch::session(session.id);
  EXPECT_LE(watch.descriptors().size(), 16u);
  // Oldest first: the watch holds the oldest, so once they are gone it must look again.
  const std::vector<pid_t> order = session.members;
  for (std::size_t i = 0; i + 1 < order.size(); ++i) {
    Kill(order[i]);
    ASSERT_FALSE(watch.gone()) << "with " << order.size() - i - 1 << " members left";
  }
  Kill(order.back());
  EXPECT_TRUE(GoneAfterWakeUp(watch));
}

// What gpulock acquire does: the watch is made by a process of the session itself. It starts
// from that process's ancestors there (the leader), without reading /proc, and finds the
// leader's other child (not an ancestor) once the leader has exited.
TEST(OwnerWatchTest, AWatchMadeInsideTheSessionStartsFromTheCallersAncestors) {
  int sibling_pid[2], answers[2], checks[2];
  ASSERT_EQ(::pipe(sibling_pid), 0);
  ASSERT_EQ(::pipe(answers), 0);
  ASSERT_EQ(::pipe(checks), 0);
  const pid_t leader = ::fork();
  if (leader == 0) {
    ::setsid();
    if (::fork() == 0) {  // the sibling: a member that is not the watcher's ancestor
      const pid_t self = ::getpid();
      [[maybe_unused]] ssize_t n = ::write(sibling_pid[1], &self, sizeof self);
      while (true) ::pause();
    }
    if (::fork() == 0) {  // the watcher: answers A (watching its ancestor only), then per check
      ::close(checks[1]);
      char answer = 'E';
      try {
        OwnerWatch watch = OwnerWatch::session(::getsid(0), {::getpid()});
        answer = watch.descriptors().size() == 1 ? 'A' : 'B';
        [[maybe_unused]] ssize_t n = ::write(answers[1], &answer, 1);
        char byte;
        while (::read(checks[0], &byte, 1) == 1) {
          answer = GoneAfterWakeUp(watch) ? 'g' : 'n';
          n = ::write(answers[1], &answer, 1);
          if (answer == 'g') break;
        }
      } catch (...) {
        [[maybe_unused]] ssize_t n = ::write(answers[1], &answer, 1);
      }
      ::_exit(0);
    }
    while (true) ::pause();
  }
  pid_t sibling = 0;
  ASSERT_EQ(::read(sibling_pid[0], &sibling, sizeof sibling), static_cast<ssize_t>(sizeof sibling));
  const auto answer = [&] {
    char byte = 0;
    EXPECT_EQ(::read(answers[0], &byte, 1), 1);
    return byte;
  };
  const auto check = [&] {
    EXPECT_EQ(::write(checks[1], "x", 1), 1);
    return answer();
  };
  EXPECT_EQ(answer(), 'A');
  Kill(leader);  // the only process it watched: it looks through /proc and finds the sibling
  EXPECT_EQ(check(), 'n');
  Kill(sibling);
  EXPECT_EQ(check(), 'g');
  for (const int fd :
       {sibling_pid[0], sibling_pid[1], answers[0], answers[1], checks[0], checks[1]})
    ::close(fd);
}

TEST(OwnerWatchTest, ASessionOfOnlyIgnoredProcessesIsRefused) {
  Session session(1);
  EXPECT_THROW(OwnerWatch::session(session.id, {session.members[0]}), Error);
  EXPECT_THROW(OwnerWatch::session(0), Error);
}

}  // namespace
}  // namespace gpulock
