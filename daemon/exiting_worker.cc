// A worker for agent_test that uses its status page as the engine does:
// marks its slot (which registers the exit stamp, common/worker_link.h),
// prints "ready", waits until the file argv[1] exists and returns argv[2]
// from main, so its exit() stamps when it began to end.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/worker_link.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: exiting_worker GO_FILE EXIT_CODE\n");
    return 2;
  }
  lockstep::worker_link::MarkBootstrap(lockstep::worker_link::kBootstrapDone);
  std::printf("ready\n");
  std::fflush(stdout);
  while (::access(argv[1], F_OK) != 0) ::usleep(10 * 1000);
  return std::atoi(argv[2]);
}
