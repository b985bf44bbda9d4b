#include "ddp/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace ddp {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".pt";
constexpr char kTempMarker[] = ".pt.tmp-";

// The message of a LibTorch exception without its C++ backtrace.
std::string ExceptionMessage(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

// "ckpt-000000000030.pt" -> 30; anything else (temp files included) -> -1.
int64_t StepOfName(const std::string& name) {
  const size_t p = sizeof(kPrefix) - 1, s = sizeof(kSuffix) - 1;
  if (name.size() <= p + s || name.compare(0, p, kPrefix) != 0 ||
      name.compare(name.size() - s, s, kSuffix) != 0) {
    return -1;
  }
  const std::string digits = name.substr(p, name.size() - p - s);
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

// A checkpoint's temp file ("ckpt-….pt.tmp-<pid>") whose writer is no
// longer running on this host: its pid is not a live process (another
// writer's file, still being written, is left alone).
bool IsDeadWritersTemp(const std::string& name) {
  if (name.compare(0, sizeof(kPrefix) - 1, kPrefix) != 0) return false;
  const size_t marker = name.find(kTempMarker);
  if (marker == std::string::npos) return false;
  const std::string digits = name.substr(marker + sizeof(kTempMarker) - 1);
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
}

// (step, path) of every complete checkpoint in `dir`, highest step first.
StatusOr<std::vector<std::pair<int64_t, std::string>>> ListSteps(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) return absl::InternalError(absl::StrCat("cannot list checkpoint dir ", dir, ": ", ec.message()));
  for (const fs::directory_entry& entry : it) {
    const int64_t step = StepOfName(entry.path().filename().string());
    if (step >= 0) out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("checkpoint: ", what, " ", path, ": ", std::strerror(errno)));
}

// Writes all `n` bytes at `data` to `fd`; returns how many it wrote (n, or
// fewer with errno set).
size_t WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      return n - left;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  return n;
}

// Writes `archive` to `path` (created, must not exist) and fsyncs it.
Status WriteSynced(torch::serialize::OutputArchive& archive, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", path);
  int write_errno = 0;
  // After a failed write the rest is skipped and every write "succeeds":
  // LibTorch's writer throws on a short write and its destructor then
  // writes again and throws again, which aborts the process (a full disk
  // killed rank 0 with SIGABRT). The error is returned below.
  auto writer = [fd, &write_errno](const void* data, size_t n) -> size_t {
    if (write_errno != 0) return n;
    if (WriteAll(fd, data, n) < n) write_errno = errno != 0 ? errno : EIO;
    return n;
  };
  Status status;
  try {
    archive.save_to(writer);
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("checkpoint: cannot write ", path, ": ",
                                              write_errno ? std::strerror(write_errno) : "",
                                              write_errno ? " (" : "", ExceptionMessage(e),
                                              write_errno ? ")" : ""));
  }
  if (status.ok() && write_errno != 0) {
    errno = write_errno;
    status = Errno("cannot write", path);
  }
  if (status.ok() && ::fsync(fd) != 0) status = Errno("cannot fsync", path);
  if (::close(fd) != 0 && status.ok()) status = Errno("cannot close", path);
  return status;
}

// The dir's round fence (file comment in checkpoint.h): `<dir>/lockstep-round`
// holds "<job id> <round>\n", the newest round of the job that last restored
// from or saved into `dir`, or "<round>\n", a fence that names no job
// (written before fences named their job, or by a caller that passed none).
// It is read and rewritten under flock on `<dir>/lockstep.lock`, which a
// save holds from that check through its rename. A rewrite is a checkpoint's
// write in small: `lockstep-round.tmp-<pid>`, fsync, close, rename over the
// fence, fsync of the dir; so a fence is whole or the previous one, and a
// fence that is not whole (empty, or no final newline) was torn by a crash
// of an older version, which wrote it without the fsync. It is read as no
// fence and taken over: refusing would keep the job from ever resuming, and
// taking it over loses only the refusal of a save from an older round made
// before this round's first restore or save.
constexpr char kRoundFile[] = "lockstep-round";
constexpr char kRoundTempPrefix[] = "lockstep-round.tmp-";
constexpr char kLockFile[] = "lockstep.lock";

class DirLock {
 public:
  static StatusOr<DirLock> Take(const std::string& dir) {
    const std::string path = (fs::path(dir) / kLockFile).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("cannot open", path);
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      Status s = Errno("cannot lock", path);
      ::close(fd);
      return s;
    }
    return DirLock(fd);
  }
  DirLock(DirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  DirLock& operator=(DirLock&&) = delete;
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // Releases the flock.
  }

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_;
};

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open dir", dir);
  Status status;
  if (::fsync(fd) != 0) status = Errno("cannot fsync dir", dir);
  ::close(fd);
  return status;
}

struct Fence {
  std::string job_id;  // "": the fence names no job.
  int64_t round = 0;
};

// " of job J", or "" for no job.
std::string OfJob(const std::string& job_id) {
  return job_id.empty() ? std::string() : absl::StrCat(" of job ", job_id);
}

// The fence in `path`; nullopt when there is none, or none that is whole.
StatusOr<std::optional<Fence>> ReadFence(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<Fence>();
    return Errno("cannot open", path);
  }
  std::string text;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status status = Errno("cannot read", path);
      ::close(fd);
      return status;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (text.empty() || text.back() != '\n') return std::optional<Fence>();  // Torn.
  text.pop_back();
  // The round is the text after the last space; the job id, all before it.
  const size_t space = text.rfind(' ');
  const std::string digits = space == std::string::npos ? text : text.substr(space + 1);
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::optional<Fence>();
  }
  Fence fence;
  if (space != std::string::npos) fence.job_id = text.substr(0, space);
  fence.round = std::stoll(digits);
  return std::optional<Fence>(std::move(fence));
}

// REQUIRES: the dir's DirLock held.
Status WriteFence(const std::string& dir, const Fence& fence) {
  const std::string path = (fs::path(dir) / kRoundFile).string();
  const std::string temp = absl::StrCat(dir, "/", kRoundTempPrefix, ::getpid());
  std::error_code ec;
  fs::remove(temp, ec);  // A leftover of an earlier process with this pid.
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", temp);
  const std::string text = fence.job_id.empty()
                               ? absl::StrCat(fence.round, "\n")
                               : absl::StrCat(fence.job_id, " ", fence.round, "\n");
  Status status;
  if (WriteAll(fd, text.data(), text.size()) != text.size()) status = Errno("cannot write", temp);
  if (status.ok() && ::fsync(fd) != 0) status = Errno("cannot fsync", temp);
  if (::close(fd) != 0 && status.ok()) status = Errno("cannot close", temp);
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = Errno(absl::StrCat("cannot rename ", temp, " to"), path);
  }
  if (!status.ok()) {
    fs::remove(temp, ec);
    return status;
  }
  return SyncDir(dir);
}

// Removes the fence temp files in `dir`: left by writers that died, since
// the caller holds the lock every fence write runs under.
// REQUIRES: the dir's DirLock held.
void RemoveFenceTemps(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, sizeof(kRoundTempPrefix) - 1, kRoundTempPrefix) == 0) {
      fs::remove(entry.path(), ec);
    }
  }
}

// Round `round` (> 0) of job `job_id` claims `dir` for `what` (a restore, a
// save of some step): the fence rules of checkpoint.h's Rounds. A fence of
// the same job with a newer round refuses it (FailedPrecondition naming
// both rounds and the job); a fence of another job, or of none, is taken
// over; a caller with no job id compares rounds alone, whatever the fence's
// job. The fence is rewritten when it changes; never lowered within a job.
// REQUIRES: the dir's DirLock held; round > 0.
Status ClaimFence(const std::string& dir, const std::string& job_id, int64_t round,
                  const std::string& what) {
  if (job_id.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: job id \"", job_id, "\" holds a newline"));
  }
  const std::string path = (fs::path(dir) / kRoundFile).string();
  ASSIGN_OR_RETURN(const std::optional<Fence> found, ReadFence(path));
  const bool same_job = found && (job_id.empty() || found->job_id == job_id);
  if (same_job && round < found->round) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " from round ", round, OfJob(job_id), " refused: round ", found->round,
        OfJob(found->job_id), " has restored from or saved into ", dir,
        " since (this worker belongs to a round that has ended and should have stopped)"));
  }
  if (same_job && round == found->round) return absl::OkStatus();
  return WriteFence(dir, Fence{job_id, round});
}

// The default CPU generator's state ("rng/cpu"): what dropout and every
// torch::rand* without a generator draw from. Every rank seeds it alike and
// draws alike, so rank 0's state, saved, is every rank's.
torch::Tensor CpuGeneratorState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Throws (c10::Error) for a state of another size or dtype, before changing
// the generator.
void SetCpuGeneratorState(const torch::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The device every parameter of `m` is on, if they share one, else the CPU.
// A checkpoint is read onto it, so that the optimizer's state (read as
// saved, onto the device it was saved from) lands beside its parameters:
// a rank on cuda:1 restoring what rank 0 saved on cuda:0 had its momentum
// on cuda:0 and failed at its first step, and a checkpoint saved on the CPU
// put a GPU model's optimizer state on the CPU.
torch::Device ParameterDevice(const torch::nn::Module& m) {
  std::optional<torch::Device> device;
  for (const torch::Tensor& p : m.parameters()) {
    if (device && *device != p.device()) return torch::kCPU;
    device = p.device();
  }
  return device.value_or(torch::Device(torch::kCPU));
}

// A tensor read from the checkpoint and the module tensor it goes into.
struct Pending {
  torch::Tensor target;
  torch::Tensor loaded;
};

// Reads every parameter and buffer of `m` (the layout Module::save writes:
// its own tensors by name, each child in a nested archive) and checks that
// it matches; applies nothing.
Status Collect(const torch::nn::Module& m, torch::serialize::InputArchive& archive,
               const std::string& prefix, const std::string& path, std::vector<Pending>* out) {
  std::set<std::string> known;  // what the model has here, by name
  auto take = [&](const std::string& key, const torch::Tensor& target, bool is_buffer) -> Status {
    known.insert(key);
    torch::Tensor loaded;
    if (!archive.try_read(key, loaded, is_buffer) || !loaded.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " does not match the model: it has no ",
          is_buffer ? "buffer " : "parameter ", prefix, key));
    }
    if (loaded.sizes() != target.sizes() || loaded.scalar_type() != target.scalar_type()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s does not match the model: %s%s is %s %s there, %s %s in the model", path,
          prefix, key, c10::toString(loaded.scalar_type()), c10::str(loaded.sizes()),
          c10::toString(target.scalar_type()), c10::str(target.sizes())));
    }
    out->push_back({target, loaded});
    return absl::OkStatus();
  };
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    RETURN_IF_ERROR(take(item.key(), item.value(), false));
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false)) {
    RETURN_IF_ERROR(take(item.key(), item.value(), true));
  }
  auto children = m.named_children();
  for (const auto& child : children) {
    if (child.value()->is_serializable()) known.insert(child.key());
  }
  // Nothing of the checkpoint is left over (PyTorch's strict load): a
  // checkpoint of a bigger model is another model's.
  for (const std::string& key : archive.keys()) {
    if (!known.count(key)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " does not match the model: it has ", prefix, key,
          ", which the model does not"));
    }
  }
  for (const auto& child : children) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive child_archive;
    if (!archive.try_read(child.key(), child_archive)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " does not match the model: it has no module ", prefix, child.key()));
    }
    RETURN_IF_ERROR(Collect(*child.value(), child_archive, absl::StrCat(prefix, child.key(), "."),
                            path, out));
  }
  return absl::OkStatus();
}

StatusOr<int64_t> ReadInt(torch::serialize::InputArchive& meta, const std::string& key,
                          const std::string& path) {
  torch::Tensor t;
  if (!meta.try_read(key, t) || !t.defined() || t.numel() != 1) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, " is not a Lockstep checkpoint: no meta/", key));
  }
  return t.item<int64_t>();
}

}  // namespace

StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& dir) {
  ASSIGN_OR_RETURN(auto steps, ListSteps(dir));
  std::vector<std::string> out;
  for (auto& s : steps) out.push_back(std::move(s.second));
  return out;
}

Status SaveCheckpoint(const std::string& dir, int rank, const CheckpointInfo& info,
                      const torch::nn::Module& module, const torch::optim::Optimizer* optimizer,
                      const CheckpointOptions& options) {
  if (rank != 0) return absl::OkStatus();
  if (info.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint step must be >= 0, got ", info.step));
  }
  if (options.keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint keep must be >= 1, got ", options.keep));
  }
  std::error_code ec;
  fs::path target = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "dir/"
  fs::path existed = target;
  while (existed.has_relative_path() && !fs::exists(existed, ec)) existed = existed.parent_path();
  if (fs::create_directories(dir, ec)) {
    // The dirs made here are made durable in their parents too, else a
    // power loss could take them and every checkpoint in them.
    for (fs::path made = target; made != existed && made.has_relative_path(); made = made.parent_path()) {
      RETURN_IF_ERROR(SyncDir(made.parent_path().string()));
    }
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("checkpoint: cannot create dir ", dir, ": ", ec.message()));
  }
  const std::string final_path =
      (fs::path(dir) / absl::StrFormat("%s%012d%s", kPrefix, info.step, kSuffix)).string();
  const std::string temp_path = absl::StrCat(final_path, ".tmp-", ::getpid());

  torch::serialize::OutputArchive archive;
  try {
    torch::serialize::OutputArchive meta;
    meta.write("format", torch::tensor(kCheckpointFormat, torch::kInt64));
    meta.write("step", torch::tensor(info.step, torch::kInt64));
    meta.write("round", torch::tensor(static_cast<int64_t>(info.round), torch::kInt64));
    meta.write("world_size", torch::tensor(static_cast<int64_t>(info.world_size), torch::kInt64));
    meta.write("job_id", c10::IValue(info.job_id));
    archive.write("meta", meta);
    torch::serialize::OutputArchive model;
    module.save(model);
    archive.write("model", model);
    if (optimizer != nullptr) {
      torch::serialize::OutputArchive opt;
      optimizer->save(opt);
      archive.write("optimizer", opt);
    }
    torch::serialize::OutputArchive rng;
    rng.write("cpu", CpuGeneratorState(), /*is_buffer=*/true);
    archive.write("rng", rng);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("checkpoint: cannot serialize step ", info.step, ": ", ExceptionMessage(e)));
  }
  fs::remove(temp_path, ec);  // A leftover of an earlier process with this pid.
  // The round fence, held from its check through the rename: a writer of
  // an older round of the job that has restored or saved here is refused.
  auto publish = [&]() -> Status {
    ASSIGN_OR_RETURN(DirLock lock, DirLock::Take(dir));
    if (info.round > 0) {
      RETURN_IF_ERROR(
          ClaimFence(dir, info.job_id, info.round, absl::StrCat("checkpoint of step ", info.step)));
    }
    if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
      return Errno(absl::StrCat("cannot rename ", temp_path, " to"), final_path);
    }
    RemoveFenceTemps(dir);
    return absl::OkStatus();
  };
  Status status = WriteSynced(archive, temp_path);
  if (status.ok()) status = publish();
  if (!status.ok()) {
    fs::remove(temp_path, ec);
    return status;
  }
  RETURN_IF_ERROR(SyncDir(dir));

  // Retention: the newest `keep` checkpoints; checkpoint temp files of
  // writers that died (fence temps went under the lock, above).
  ASSIGN_OR_RETURN(auto steps, ListSteps(dir));
  for (size_t i = options.keep; i < steps.size(); ++i) fs::remove(steps[i].second, ec);
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (IsDeadWritersTemp(entry.path().filename().string())) fs::remove(entry.path(), ec);
  }
  return absl::OkStatus();
}

StatusOr<std::optional<RestoredCheckpoint>> RestoreCheckpoint(const std::string& dir,
                                                              torch::nn::Module& module,
                                                              torch::optim::Optimizer* optimizer,
                                                              int round,
                                                              const std::string& job_id) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint dir ", dir, " exists and is not a directory"));
  }
  if (round > 0 && fs::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) == 0) {
    // This round claims the dir: from now on an older round's save or
    // restore is refused; or it is refused itself. (A dir this worker cannot
    // write, read-only checkpoints to start from, takes no save either:
    // nothing to claim.)
    ASSIGN_OR_RETURN(DirLock lock, DirLock::Take(dir));
    RETURN_IF_ERROR(ClaimFence(dir, job_id, round, "checkpoint restore"));
  }
  ASSIGN_OR_RETURN(auto steps, ListSteps(dir));
  if (steps.empty()) return std::optional<RestoredCheckpoint>();
  RestoredCheckpoint restored;
  restored.path = steps.front().second;
  const std::string& path = restored.path;

  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, ParameterDevice(module));
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path,
                                            " is not a complete checkpoint (truncated or corrupt): ",
                                            ExceptionMessage(e)));
  }
  std::vector<Pending> pending;
  torch::Tensor rng_state;  // Undefined: the checkpoint has none (older files).
  try {
    torch::serialize::InputArchive meta;
    if (!archive.try_read("meta", meta)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " is not a Lockstep checkpoint: no meta"));
    }
    ASSIGN_OR_RETURN(const int64_t format, ReadInt(meta, "format", path));
    if (format != kCheckpointFormat) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, " has format ", format,
                                              ", this build reads ", kCheckpointFormat));
    }
    ASSIGN_OR_RETURN(restored.info.step, ReadInt(meta, "step", path));
    ASSIGN_OR_RETURN(const int64_t round, ReadInt(meta, "round", path));
    ASSIGN_OR_RETURN(const int64_t world, ReadInt(meta, "world_size", path));
    restored.info.round = static_cast<int>(round);
    restored.info.world_size = static_cast<int>(world);
    c10::IValue job;  // Absent from checkpoints written before it was saved.
    if (meta.try_read("job_id", job) && job.isString()) restored.info.job_id = job.toStringRef();

    torch::serialize::InputArchive model;
    if (!archive.try_read("model", model)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, " has no model state"));
    }
    RETURN_IF_ERROR(Collect(module, model, "", path, &pending));

    // The optimizer before the model: if its state does not fit, the model
    // is still unchanged.
    if (optimizer != nullptr) {
      torch::serialize::InputArchive opt;
      if (!archive.try_read("optimizer", opt)) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint ", path, " has no optimizer state"));
      }
      try {
        optimizer->load(opt);
        // LibTorch's load reads each group's saved options but applies only
        // the state; PyTorch's load_state_dict restores them (a schedule's
        // learning rate, say) too.
        torch::serialize::InputArchive groups;
        opt.read("param_groups", groups);
        auto& live = optimizer->param_groups();
        for (size_t i = 0; i < live.size(); ++i) {
          torch::serialize::InputArchive group, options;
          groups.read(absl::StrCat("param_groups/", i), group);
          group.read("options", options);
          live[i].options().serialize(options);
        }
      } catch (const std::exception& e) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", path, ": its optimizer state does not match the optimizer: ",
            ExceptionMessage(e)));
      }
    }
    torch::serialize::InputArchive rng;
    if (archive.try_read("rng", rng) && !rng.try_read("cpu", rng_state, /*is_buffer=*/true)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, " has rng but no rng/cpu"));
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, " cannot be read: ", ExceptionMessage(e)));
  }
  // The generator before the model: a state that does not fit leaves it and
  // the model unchanged.
  if (rng_state.defined()) {
    try {
      SetCpuGeneratorState(rng_state.to(torch::kCPU));
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path,
                                              ": its rng/cpu is no CPU generator state: ",
                                              ExceptionMessage(e)));
    }
  }
  torch::NoGradGuard no_grad;
  for (Pending& p : pending) p.target.copy_(p.loaded);
  return std::optional<RestoredCheckpoint>(std::move(restored));
}

Status CheckSameCheckpointStep(Communicator* comm, int64_t step, const std::string& dir,
                               Duration timeout) {
  const int world = comm->world_size();
  const auto options = torch::dtype(torch::kLong).device(comm->device());
  torch::Tensor all = torch::empty({world}, options);
  RETURN_IF_ERROR(comm->AllGather(torch::full({1}, step, options), all)->Wait(timeout));
  all = all.cpu();
  std::vector<std::string> steps;
  bool same = true;
  for (int r = 0; r < world; ++r) {
    const int64_t at = all[r].item<int64_t>();
    same = same && at == step;
    steps.push_back(absl::StrCat("rank ", r, " at step ", at));
  }
  if (same) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "ranks resumed from different checkpoints in ", dir, " (", absl::StrJoin(steps, ", "),
      "; step 0: none): every rank must read one shared directory"));
}

}  // namespace ddp
}  // namespace lockstep
