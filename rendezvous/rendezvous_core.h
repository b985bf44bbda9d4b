// RendezvousCore: elastic rendezvous rounds for jobs, in plain C++ (no gRPC).
// The coordinator hosts one; RendezvousGrpcService is its thin shell.
//
// Words used here and in the code:
//   job          a training job with a RendezvousJobConfig: min_nodes,
//                max_nodes, nproc_per_node, last-call and join timeouts.
//   round        numbered 1, 2, ...; each job has exactly one current round,
//                which is OPEN (collecting participants) or CLOSED (ranks
//                fixed). Round r's store namespace is StoreNamespace(job, r).
//   participant  a node that joined the current round (open: still waiting
//                for the close; closed: holds a node rank).
//   waiting      nodes that joined while the round was CLOSED (late joiners);
//                they wait for the next round.
//   departed     participants of a CLOSED round that left or were marked
//                dead; the coordinator reacts by opening the next round.
//   last call    once min_nodes participants are in, the round stays open
//                for last_call_timeout more for others, then closes.
//
// Round state machine (per job):
//
//   CreateJob ──▶ OPEN(1)
//   OPEN(r) ──Join──▶ OPEN(r)         participant added (a re-join by the same
//                                     node replaces its pending join)
//   OPEN(r) ── participants == max_nodes ─────────────────────▶ CLOSED(r)
//   OPEN(r) ── participants >= min_nodes and the last call ────▶ CLOSED(r)
//              (last_call_timeout after min was first reached) passed,
//              or CloseRound() by the coordinator
//   OPEN(r) ──Leave / MarkNodesDead / join timeout──▶ OPEN(r)
//              participant removed; below min_nodes the last call is off
//   CLOSED(r) ──Join by a participant──▶ CLOSED(r)   result again (idempotent)
//   CLOSED(r) ──Join by another node──▶ CLOSED(r)    node is `waiting`
//   CLOSED(r) ──Leave / MarkNodesDead of a participant──▶ CLOSED(r), departed
//   any(r) ──OpenNextRound──▶ OPEN(r+1)   pending and waiting joins carry
//              over as participants of r+1 (then the close rules apply at
//              once); survivors of r must join again (their agents restart
//              workers)
//   RemoveJob: every pending join fails with Aborted.
//
// On close, every participant's pending join completes with its
// RendezvousResult. Rank assignment is deterministic for a given membership
// and history:
//   1. Survivors (participants of the job's previous closed round) keep their
//      previous node rank if it is < num_nodes, in order of that rank.
//   2. The free ranks in [0, num_nodes) are then filled in ascending order by
//      the remaining survivors (by previous rank), then new nodes (by node id).
// So ranks are gap-free, survivors keep their ranks where possible, and
// worker global rank = node_rank * nproc_per_node + local_rank.
//
// Time: all timeouts are judged on the injected Clock. With
// Options::run_timer_thread (default) the core owns a thread that sleeps until
// the next deadline and calls AdvanceTimers(); tests with a FakeClock turn it
// off, Advance() the clock and call AdvanceTimers() themselves.
//
// Thread safety: all methods are safe to call concurrently. Join callbacks run
// without the core's lock, on the thread that caused the completion (a Join,
// the close, a timer); they must not block.
#ifndef LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CORE_H_
#define LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CORE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/status.h"

namespace lockstep {
namespace rendezvous {

// How long a round stays open for more nodes once min_nodes have joined.
inline constexpr std::chrono::seconds kDefaultLastCallTimeout{30};
// How long a Join waits for its round to close when the caller names no
// timeout.
inline constexpr std::chrono::seconds kDefaultJoinTimeout{600};
// Largest max_nodes a job may ask for (InvalidArgument beyond).
inline constexpr int kMaxNodesPerJob = 65536;

struct RendezvousJobConfig {
  JobId job_id;
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  // Default: kDefaultLastCallTimeout. 0 closes as soon as min_nodes joined.
  Duration last_call_timeout = kDefaultLastCallTimeout;
  // Used by joins that name no timeout. Default: kDefaultJoinTimeout.
  Duration join_timeout = kDefaultJoinTimeout;
  // Bootstrap hint handed to workers; empty = node rank 0's join address.
  std::string master_address;
};

struct JoinRequest {
  JobId job_id;
  NodeId node_id;
  Incarnation incarnation;
  // 0 = the job's; otherwise it must equal the job's (InvalidArgument).
  int nproc_per_node = 0;
  // The round the node was told to join; 0 = the current one. An older round
  // is Aborted (stale), a newer one FailedPrecondition (not open yet).
  int round = 0;
  // Host (or host:port) at which this node's workers can be reached.
  std::string address;
};

struct RendezvousResult {
  JobId job_id;
  int round = 0;
  int node_rank = -1;
  int num_nodes = 0;
  int world_size = 0;
  int nproc_per_node = 0;
  std::string store_namespace;  // StoreNamespace(job_id, round)
  std::vector<NodeId> node_ids;  // in node-rank order
  std::string master_address;

  // Global rank of a worker on this node.
  int GlobalRank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

enum class RoundPhase { kOpen, kClosed };

// A snapshot for the coordinator and status pages.
struct RendezvousState {
  JobId job_id;
  int round = 0;
  RoundPhase phase = RoundPhase::kOpen;
  int min_nodes = 0;
  int max_nodes = 0;
  // OPEN: joined so far, by node id. CLOSED: in node-rank order.
  std::vector<NodeId> participants;
  std::vector<NodeId> waiting;   // late joiners, for the next round
  std::vector<NodeId> departed;  // CLOSED only: participants that left or died
  // OPEN with >= min_nodes: when the last call ends.
  std::optional<MonoTime> last_call_deadline;
};

class RendezvousCore {
 public:
  struct Options {
    // Own a thread that fires timeouts on time. Default: true; off with a
    // FakeClock (drive AdvanceTimers() from the test).
    bool run_timer_thread = true;
  };

  using JoinCallback = std::function<void(StatusOr<RendezvousResult>)>;
  using JoinId = uint64_t;

  // `clock` is not owned and must outlive the core. Default: RealClock().
  explicit RendezvousCore(Clock* clock = RealClock());
  RendezvousCore(Clock* clock, Options options);
  // REQUIRES: no thread is inside a method. Pending joins are dropped without
  // their callbacks running.
  ~RendezvousCore();

  RendezvousCore(const RendezvousCore&) = delete;
  RendezvousCore& operator=(const RendezvousCore&) = delete;

  // ---- Coordinator API ----

  // Registers a job and opens its round 1. Calling it again with an equal
  // config is a no-op. Errors: InvalidArgument (bad config, naming the
  // field), AlreadyExists (the job exists with a different config).
  Status CreateJob(const RendezvousJobConfig& config);

  // Forgets a job; its pending joins fail with Aborted. NotFound if unknown.
  Status RemoveJob(const JobId& job_id);

  // Opens round current+1 (restart, scale-up); returns its number. See the
  // state machine for what carries over. NotFound if the job is unknown.
  StatusOr<int> OpenNextRound(const JobId& job_id);

  // Closes the current OPEN round now if it has >= min_nodes participants
  // (FailedPrecondition naming the counts otherwise). OK if already closed.
  Status CloseRound(const JobId& job_id);

  // Removes dead nodes from the current round and the waiting list. Returns
  // true if a participant of a CLOSED round was among them (the running
  // round is broken: the coordinator should OpenNextRound). NotFound if the
  // job is unknown.
  StatusOr<bool> MarkNodesDead(const JobId& job_id, const std::vector<NodeId>& node_ids);

  StatusOr<RendezvousState> GetState(const JobId& job_id) const;

  // ---- Node API ----

  // Joins the job's current round (see the state machine). `callback` runs
  // exactly once unless CancelJoin() removes it first: with the result when
  // the round closes (inline if it is closed already and the node is a
  // participant), or with an error:
  //   NotFound (unknown job), InvalidArgument (empty node id, nproc mismatch),
  //   Aborted (stale round; left, marked dead, superseded by a newer join of
  //   the same node; job removed), FailedPrecondition (round not open yet),
  //   DeadlineExceeded (`deadline` passed before the round closed; the node
  //   is removed from the round).
  // `deadline` = MonoTime::max() means the job's join_timeout from now.
  JoinId Join(const JoinRequest& request, MonoTime deadline, JoinCallback callback);

  // Withdraws a pending join (the caller disconnected): the node leaves the
  // round or the waiting list. Returns true if it was pending (its callback
  // will never run), false if the callback already ran or is running.
  bool CancelJoin(JoinId id);

  // The node leaves `round` (0 = current). OPEN: it stops being a
  // participant; CLOSED: it becomes departed; waiting: removed. Unknown
  // nodes are a no-op. Errors: NotFound (job), Aborted (stale round).
  Status Leave(const JobId& job_id, const NodeId& node_id, int round);

  // Fires due last calls (closing rounds) and join timeouts. Returns the
  // next deadline (MonoTime::max() if none).
  MonoTime AdvanceTimers();

  // ---- Notifications ----

  // Called with the job's state (CLOSED, participants in rank order) each
  // time a round closes, after the participants' joins have been completed;
  // the coordinator uses it to move a job from RENDEZVOUS to RUNNING. Runs
  // without the core's lock, on the thread that closed the round; must not
  // block. Replaces any previous listener; nullptr removes it. Set it before
  // jobs are created (it is read under the lock, so a concurrent change is
  // safe but may miss or see one close).
  using RoundClosedListener = std::function<void(const RendezvousState&)>;
  void SetRoundClosedListener(RoundClosedListener listener);

  Clock* clock() const { return clock_; }

 private:
  struct Member {
    Incarnation incarnation;
    std::string address;
    JoinId join_id = 0;  // pending join, 0 if none (CLOSED participants)
  };
  struct Job {
    RendezvousJobConfig config;
    int round = 1;
    RoundPhase phase = RoundPhase::kOpen;
    std::map<NodeId, Member> participants;
    std::map<NodeId, Member> waiting;
    std::vector<NodeId> ranked;              // CLOSED: participants by rank
    std::vector<NodeId> departed;            // CLOSED only
    std::map<NodeId, int> previous_ranks;    // from the last CLOSED round
    std::optional<MonoTime> last_call_deadline;
    std::string master_address;              // CLOSED
  };
  struct PendingJoin {
    JobId job_id;
    NodeId node_id;
    JoinCallback callback;
    std::multimap<MonoTime, JoinId>::iterator deadline_it;
  };
  // Work to run once the lock is released: join callbacks, listener calls.
  using Ready = std::vector<std::function<void()>>;

  Job* FindJob(const JobId& job_id);
  const Job* FindJob(const JobId& job_id) const;
  // Fails and forgets a pending join. REQUIRES: mu_ held.
  void FailJoinLocked(JoinId id, Status status, Ready* ready);
  // Drops a pending join without running it. REQUIRES: mu_ held.
  JoinCallback TakeJoinLocked(JoinId id);
  void RemoveMemberLocked(Job& job, const NodeId& node_id, const Status& why, Ready* ready);
  // Applies the close rules after a change to an OPEN round.
  void MaybeCloseLocked(Job& job, Ready* ready);
  void CloseLocked(Job& job, Ready* ready);
  RendezvousResult ResultLocked(const Job& job, int node_rank) const;
  RendezvousState StateLocked(const Job& job) const;
  void NotifyTimerLocked(MonoTime deadline);
  MonoTime AdvanceTimersLocked(Ready* ready);
  void TimerLoop();
  static void RunReady(Ready* ready);

  Clock* const clock_;
  const Options options_;
  const Logger log_{"rendezvous"};

  mutable std::mutex mu_;
  std::map<JobId, Job> jobs_;                           // GUARDED_BY(mu_)
  std::unordered_map<JoinId, PendingJoin> joins_;        // GUARDED_BY(mu_)
  std::multimap<MonoTime, JoinId> join_deadlines_;       // GUARDED_BY(mu_)
  JoinId next_join_id_ = 1;                              // GUARDED_BY(mu_)
  MonoTime timer_wake_ = MonoTime::max();                // GUARDED_BY(mu_)
  bool stopping_ = false;                                // GUARDED_BY(mu_)
  std::shared_ptr<RoundClosedListener> listener_;        // GUARDED_BY(mu_)
  std::condition_variable timer_cv_;
  std::thread timer_thread_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CORE_H_
