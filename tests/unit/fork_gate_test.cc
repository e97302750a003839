// The gate behind the descriptor tables that forked children act on (src/util/fork_gate.h) and
// the fork guard's table (src/local/fork_guard.h): a holder may take the gate again, holds it with
// every signal blocked, and a signal handler that forks cannot meet a gate its thread holds.
#include "util/fork_gate.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include "local/fork_guard.h"
#include "util/sanitizers.h"

namespace gpulock {
namespace {

bool Blocked(int signal) {
  sigset_t now;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &now);
  return ::sigismember(&now, signal) == 1;
}

TEST(ForkGateTest, ItsHolderTakesItAgainAndHoldsItWithSignalsBlocked) {
  ASSERT_FALSE(Blocked(SIGUSR1));
  {
    const ForkGate outer;
    EXPECT_TRUE(Blocked(SIGUSR1));
    {
      const ForkGate inner;  // would wait for itself if the gate did not know its holder
      EXPECT_TRUE(Blocked(SIGUSR1));
    }
    EXPECT_TRUE(Blocked(SIGUSR1)) << "the outer hold still stands";
  }
  EXPECT_FALSE(Blocked(SIGUSR1)) << "the mask from before the gate";
}

TEST(ForkGateTest, AForkOnAnotherThreadWaitsForTheGateAndThenGoesThrough) {
  std::optional<ForkGate> gate(std::in_place);
  pid_t forked = 0;
  std::thread forker([&forked] {
    forked = ::fork();
    if (forked == 0) ::_exit(0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(forked, 0) << "the fork went ahead while the table could change";
  gate.reset();
  forker.join();
  ASSERT_GT(forked, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(forked, &status, 0), forked);
}

volatile sig_atomic_t forks = 0;
constexpr int kForks = 300;

// Arms the timer once, a millisecond from now: re-armed only after each fork is reaped, so that
// however slow a fork is (under AddressSanitizer, say), the loop runs in between.
void ArmTimer() {
  const itimerval in_a_millisecond{{0, 0}, {0, 1000}};
  ::setitimer(ITIMER_REAL, &in_a_millisecond, nullptr);
}

void ForkAndReap(int) {
  forks = forks + 1;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  if (child > 0) ::waitpid(child, nullptr, 0);
  if (forks < kForks) ArmTimer();
}

// Without signals blocked under the gate, the handler's fork waited in the atfork prepare handler
// for the gate that its own thread held: the process hung.
TEST(ForkGateTest, ASignalHandlerThatForksWhileTheGuardTableChangesGoesThrough) {
  if (kUnderThreadSanitizer) GTEST_SKIP() << "ThreadSanitizer reports fork() in a signal handler";
  const pid_t worker = ::fork();
  if (worker == 0) {
    struct sigaction action {};
    action.sa_handler = ForkAndReap;
    ::sigaction(SIGALRM, &action, nullptr);
    ArmTimer();
    const int fd = ::dup(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (forks < kForks && std::chrono::steady_clock::now() < until) {
      close_in_forked_child(fd);
      forget_in_forked_child(fd);
    }
    ::_exit(forks >= kForks ? 0 : 3);  // 3: too few forks to tell
  }
  ASSERT_GT(worker, 0);
  // Generous: it takes about a second (several under a sanitizer); a hang is what fails.
  int status = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pid_t done = 0;
  while ((done = ::waitpid(worker, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (done == 0) {
    ::kill(worker, SIGKILL);
    ::waitpid(worker, &status, 0);
    FAIL() << "a fork from a signal handler hung while the fork guard's table changed";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace gpulock
