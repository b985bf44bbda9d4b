// The agent <-> worker link on one host: two small shared-memory pages the
// agent hands every worker as inherited descriptors, so the engine can talk
// to its agent without RPCs (and the GPU build, which has no gRPC, too).
//
//   LOCKSTEP_FENCE_FD   one page per agent, sealed read-only for workers:
//                       the instant (CLOCK_MONOTONIC ns) after which no
//                       worker of this node may still run. The agent
//                       pushes it forward each time the coordinator
//                       accepts a heartbeat. A worker that sees it pass
//                       kills its own process group: that holds even when
//                       the agent itself is frozen (SIGSTOP) and cannot
//                       stop anyone.
//   LOCKSTEP_STATUS_FD  one page per job run on the node, one slot per
//                       local rank, written by the worker: where the
//                       engine's bootstrap is. A worker that exits with
//                       its slot at kBootstrapBegun died inside the
//                       bootstrap: a startup failure. A program that never
//                       touches its slot is never one. One that exits at
//                       kPeerLost gave up because a peer was gone
//                       (PeerLostOn(r): waiting for rank r). The page's
//                       second half holds, per slot, when the worker began
//                       to end on its own (CLOCK_MONOTONIC ns; 0: not
//                       known): the first of its engine giving up on a lost
//                       peer and its exit() (an atexit handler). An exit
//                       the agent reaps late (its watcher thread ran after
//                       a freeze) is still placed, and told from the
//                       agent's stop, by the worker's own instant.
//
// Both are memfds (no name in /dev/shm, gone with the last descriptor).
// Only async-signal-safe calls happen on the worker's fence path.
#ifndef LOCKSTEP_COMMON_WORKER_LINK_H_
#define LOCKSTEP_COMMON_WORKER_LINK_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace lockstep {
namespace worker_link {

inline constexpr char kFenceFdEnv[] = "LOCKSTEP_FENCE_FD";
inline constexpr char kStatusFdEnv[] = "LOCKSTEP_STATUS_FD";

// Values of a status slot.
inline constexpr int32_t kNotStarted = 0;
inline constexpr int32_t kBootstrapBegun = 1;
inline constexpr int32_t kBootstrapDone = 2;
// After the bootstrap: a collective of this worker failed because a peer
// was gone. Set by the engine just before it gives up, so that the agent
// can tell a rank that failed on its own from one that followed it.
inline constexpr int32_t kPeerLost = 3;
// kPeerLost naming the peer: the first rank this worker's collective or
// bootstrap waited for in vain (world sizes stay far below 2^20).
inline constexpr int32_t kPeerLostOnRank0 = 1 << 20;
inline constexpr int32_t PeerLostOn(int rank) { return kPeerLostOnRank0 + rank; }
// A slot value meaning "gave up because a peer was gone"; LostPeer says
// which (-1: not known).
inline constexpr bool IsPeerLost(int32_t slot) {
  return slot == kPeerLost || slot >= kPeerLostOnRank0;
}
inline constexpr int LostPeer(int32_t slot) {
  return slot >= kPeerLostOnRank0 ? slot - kPeerLostOnRank0 : -1;
}

// CLOCK_MONOTONIC now, in ns (the clock both sides of a page share).
int64_t MonotonicNowNs();

// Agent side: the node's fence page.
class FencePage {
 public:
  FencePage() = default;
  ~FencePage();
  FencePage(const FencePage&) = delete;
  FencePage& operator=(const FencePage&) = delete;

  // Creates the page with "no deadline" (0: workers never fence on it).
  Status Create();
  // Workers must be gone by `deadline_ns` (CLOCK_MONOTONIC).
  void SetDeadline(int64_t deadline_ns);
  int64_t deadline() const;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::atomic<int64_t>* deadline_ = nullptr;
};

// Agent side: one job run's status page, `slots` local ranks.
class StatusPage {
 public:
  StatusPage() = default;
  ~StatusPage();
  StatusPage(const StatusPage&) = delete;
  StatusPage& operator=(const StatusPage&) = delete;

  Status Create(int slots);
  // kNotStarted for a slot out of range.
  int32_t Get(int slot) const;
  // When that worker began to end on its own (CLOCK_MONOTONIC ns), 0 when
  // it has not said (or for a slot out of range).
  int64_t EndedNs(int slot) const;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int slots_ = 0;
  size_t bytes_ = 0;
  std::atomic<int32_t>* slot_ = nullptr;
  std::atomic<int64_t>* ended_ = nullptr;  // second half of the page
};

// Worker side (the engine). Both are no-ops without the descriptors in the
// environment (a worker started by hand or by torchrun).
//
// Marks this worker's slot (its LOCKSTEP_LOCAL_RANK). The first call also
// registers an atexit handler that calls MarkEnding() when this process
// (not a child forked from it) calls exit() or returns from main.
void MarkBootstrap(int32_t state);
// Stamps the instant this worker began to end on its own, once (the first
// stamp stays). MarkPeerLost calls it.
void MarkEnding();
// MarkBootstrap(kPeerLost, or PeerLostOn(lost_rank) when it is known): the
// engine calls it when a collective or its bootstrap fails because a peer
// is gone or never arrived, naming the first such rank, so the coordinator
// can blame the rank that hung or froze rather than the one that gave up.
void MarkPeerLost(int lost_rank = -1);
// Starts, once per process, a thread that checks the fence page every
// 50 ms and, once its deadline passed, writes one line to stderr and
// SIGKILLs the worker's process group. Returns whether a watchdog runs.
bool StartFenceWatchdog();

}  // namespace worker_link
}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_WORKER_LINK_H_
