// Checkpoints of a training run: model parameters and buffers, optimizer
// state and where the run was (step, round, world size), so a worker that
// lockstepd restarts resumes from the last checkpoint instead of step 0.
//
//   // Every rank, after InitFromEnv and before DistributedDataParallel::Create:
//   const WorkerEnv& env = group->env();
//   ASSIGN_OR_RETURN(auto restored,
//                    ddp::RestoreCheckpoint(dir, *model, &opt, env.round, env.job_id));
//   int64_t first_step = restored ? restored->info.step + 1 : 1;
//   ...
//   // Every rank may call it; only rank 0 writes:
//   RETURN_IF_ERROR(ddp::SaveCheckpoint(
//       dir, env.rank, {step, env.round, env.world_size, env.job_id}, *model, &opt));
//
// On disk: one LibTorch archive per checkpoint, `<dir>/ckpt-<step, 12
// digits>.pt`, holding "lockstep/format" (kCheckpointFormat), "meta/step",
// "meta/round", "meta/world_size", "meta/job_id", "model/<parameter or
// buffer name>", "optimizer" (Optimizer::save's archive) and "rng/cpu" (the
// default CPU generator's state, see Random numbers). A save writes
// `<final name>.tmp-<pid>` in the same directory, fsyncs it, renames it over
// the final name and fsyncs the directory, so a reader sees a complete file
// or none; temp files left by a writer that died are never read and are
// removed by the next save. The newest `keep` checkpoints are kept.
//
// Rounds (DESIGN.md: a side effect that must not happen twice carries the
// round, and a write from an older round is refused). Round numbers count
// per job; the fence is per dir: `<dir>/lockstep-round` holds
// "<job id> <round>", the newest round of the job that last restored from
// (RestoreCheckpoint with its round and job id) or saved into the dir,
// rewritten under flock on `<dir>/lockstep.lock`. A restore or save from
// round R > 0 of job J:
//   - the fence names J with a newer round: refused (FailedPrecondition
//     naming both rounds and the job), a restore at once rather than at its
//     first save: a worker of a round that has ended, which lockstepd's
//     fencing should already have stopped, cannot overwrite what the new
//     round resumed from;
//   - the fence names another job, or none (a file holding a round alone,
//     written before fences named their job), or there is no fence: J takes
//     it over (writes "J R"): a new job may resume another's checkpoints;
//   - otherwise the fence is raised to "J R".
// Round 0 (no lockstepd: a hand-started or --local run) neither checks nor
// writes the fence. A caller with no job id ("", one written before the job
// id was passed) compares rounds alone, whatever job the fence names, and
// writes a fence that names no job. Two jobs writing one dir at the same
// time are not fenced from each other. The fence is written like a
// checkpoint (`lockstep-round.tmp-<pid>`, fsync, rename, fsync of the dir;
// the temp file removed on error, and a dead writer's by the next save), so
// it is whole or the previous one. A fence that is not whole (empty, or no
// final newline: a crash of an older version, which did not fsync it) or
// not "[<job id> ]<round>" reads as no fence and is taken over.
//
// Random numbers: a save records the default CPU generator's state (what
// dropout and torch::rand* without a generator draw from on CPU), taken
// under the generator's mutex; a restore sets it back, so a resumed run on
// CPU draws the dropout masks an uninterrupted one would. Rank 0's state is
// saved and every rank gets it back: right when every rank seeds alike and
// makes the same draws (the same shapes), as examples/train does with equal
// batch sizes; a program whose ranks draw differently does not resume
// bit-identically. CUDA generators are not saved: a model with dropout on a
// GPU resumes with other masks. A checkpoint without "rng/cpu" (written
// before it was saved) restores as before, leaving the generator alone.
//
// DDP (cross-process invariant): every rank must resume from the same step,
// with the same parameters and its own copy of the optimizer state. Each rank
// reads the newest checkpoint itself. Call RestoreCheckpoint after
// InitFromEnv and before DistributedDataParallel::Create: rank 0 cannot
// train (and so cannot write a newer checkpoint) before every rank has
// joined Create's broadcast, so all ranks of a round read the same file, and
// Create then broadcasts rank 0's (identical) parameters anyway. The
// optimizer is not touched by DDP: restore it on every rank.
//
// No gRPC, no logging: this file is in the CMake build (ddp/CMakeLists.txt).
// Thread safety: none; call from the training thread while no backward runs.
#ifndef LOCKSTEP_DDP_CHECKPOINT_H_
#define LOCKSTEP_DDP_CHECKPOINT_H_

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "ddp/communicator.h"

namespace lockstep {
namespace ddp {

// Written into every checkpoint; a file with another value is refused.
// Changed only when a build would misread a file of the old value: entries
// added since 1 (meta/job_id, rng/cpu) are looked up by name, so older
// builds skip them and their absence from older files means "not saved".
inline constexpr int64_t kCheckpointFormat = 1;
// How many checkpoints SaveCheckpoint keeps by default (the newest ones).
inline constexpr int kDefaultCheckpointsKept = 2;

// Where the run was when the checkpoint was taken: {step, round, world_size}
// or {step, round, world_size, job_id}.
struct CheckpointInfo {
  CheckpointInfo() = default;
  CheckpointInfo(int64_t step, int round, int world_size, std::string job_id = "")
      : step(step), round(round), world_size(world_size), job_id(std::move(job_id)) {}

  int64_t step = 0;    // Steps completed: training resumes at step + 1.
  int round = 0;       // LOCKSTEP_ROUND of the writer (0: not under lockstepd).
  int world_size = 0;  // World size of the writer's round.
  // LOCKSTEP_JOB_ID of the writer (WorkerEnv::job_id). "": not known (a
  // checkpoint written before it was saved reads as ""), and a save's round
  // fence then compares rounds alone (see Rounds). Default: "".
  std::string job_id;
};

struct CheckpointOptions {
  // Checkpoints kept after a save, newest first. Default: 2. REQUIRES: >= 1.
  int keep = kDefaultCheckpointsKept;
};

struct RestoredCheckpoint {
  CheckpointInfo info;
  std::string path;  // The file it was read from.
};

// Saves `module`'s parameters and buffers (every name of
// module.named_parameters() / named_buffers(), recursively), if not null
// `optimizer`'s state, and the default CPU generator's state (see Random
// numbers) as the checkpoint of `info.step` in `dir`
// (created if missing), atomically (see file comment), then deletes all but
// the newest `options.keep` checkpoints and the temp files of writers that
// died (a running writer's are left alone).
// Only rank 0 writes: any other rank returns OK at once.
// Blocks for the write and its fsyncs.
// Errors: Internal naming the path for a failed write, fsync or rename (the
// previous checkpoints are then untouched); InvalidArgument for a negative
// step, keep < 1 or a job id holding a newline; FailedPrecondition, naming
// both rounds and the job, when a newer round of info.job_id than
// info.round has restored from or saved into `dir` (see Rounds).
Status SaveCheckpoint(const std::string& dir, int rank, const CheckpointInfo& info,
                      const torch::nn::Module& module, const torch::optim::Optimizer* optimizer,
                      const CheckpointOptions& options = {});

// Loads the newest checkpoint in `dir` into `module` (copied in place into
// the existing parameters and buffers, which keep their storage), if not
// null into `optimizer`, and its generator state, if it has one, into the
// default CPU generator (see Random numbers). Call on every rank (see file
// comment).
// Returns nullopt when `dir` does not exist or holds no checkpoint (start
// fresh); temp files are ignored. `round` > 0 (the caller's LOCKSTEP_ROUND),
// with `job_id` (its LOCKSTEP_JOB_ID), first claims the dir's fence, if the
// dir exists and this process may write it (see Rounds): older rounds of
// the job are refused from then on, and this restore is refused
// (FailedPrecondition naming both rounds and the job) when a newer round of
// the job has restored or saved there. 0: no fence.
// Errors, each naming the file: DataLoss for a file that is not a complete
// checkpoint (truncated, corrupt, wrong format); FailedPrecondition when it
// does not match the model (a missing name, another shape or dtype, a name
// the model does not have) or the
// optimizer (other parameter groups). InvalidArgument for a job id holding
// a newline. On any error the module and the generator are unchanged;
// the optimizer may be partly loaded, so treat the error as fatal.
StatusOr<std::optional<RestoredCheckpoint>> RestoreCheckpoint(const std::string& dir,
                                                              torch::nn::Module& module,
                                                              torch::optim::Optimizer* optimizer,
                                                              int round = 0,
                                                              const std::string& job_id = "");

// The complete checkpoints in `dir`, newest (highest step) first; empty if
// `dir` does not exist. Errors: Internal if it cannot be listed.
StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& dir);

// The cross-process invariant above, checked: every rank passes the step it
// restored (0: none) and all learn every rank's, through one allgather on
// `comm`. Call on every rank after RestoreCheckpoint, before
// DistributedDataParallel::Create. FailedPrecondition naming each rank's
// step when they differ (node-local dirs, or a stale listing of a shared
// one: they would train different steps against each other); the
// allgather's error when it fails or `timeout` passes.
Status CheckSameCheckpointStep(Communicator* comm, int64_t step, const std::string& dir,
                               Duration timeout);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_CHECKPOINT_H_
