// A worker for agent_test that uses its status page as the engine does:
// marks its slot (which registers the exit stamp, common/worker_link.h),
// prints "ready", then:
//   exiting_worker GO_FILE EXIT_CODE   waits until the file GO_FILE exists
//       and returns EXIT_CODE from main, so its exit() stamps when it
//       began to end;
//   exiting_worker --gave-up LOST_RANK   marks its slot as the engine does
//       when a collective lost rank LOST_RANK (which stamps), then waits
//       for a signal;
//   exiting_worker --gives-up-when-stopped LOST_RANK   waits for SIGTERM,
//       then marks the lost peer and dies of that SIGTERM: it gave up only
//       after the stop.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/worker_link.h"

namespace {

int lost_rank = -1;

void GiveUpThenDie(int sig) {
  lockstep::worker_link::MarkPeerLost(lost_rank);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void Ready() {
  std::printf("ready\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: exiting_worker GO_FILE EXIT_CODE | --gave-up LOST_RANK | "
                 "--gives-up-when-stopped LOST_RANK\n");
    return 2;
  }
  lockstep::worker_link::MarkBootstrap(lockstep::worker_link::kBootstrapDone);
  if (std::strcmp(argv[1], "--gave-up") == 0) {
    lockstep::worker_link::MarkPeerLost(std::atoi(argv[2]));
    Ready();
    for (;;) ::pause();
  }
  if (std::strcmp(argv[1], "--gives-up-when-stopped") == 0) {
    lost_rank = std::atoi(argv[2]);
    ::signal(SIGTERM, GiveUpThenDie);
    Ready();
    for (;;) ::pause();
  }
  Ready();
  while (::access(argv[1], F_OK) != 0) ::usleep(10 * 1000);
  return std::atoi(argv[2]);
}
