// store_fuzzer: the coordinator's key-value store against a model.
//
// Input: a StoreSession (seeds/fuzz_input.proto): StoreOps, each decoded with
// lockstep.v1.StoreOp's ParseFromString (the Session stream's message; the
// unary RPCs carry the same request messages), and steps that move the fake
// clock, drop namespaces as the coordinator does, or set the stream's
// `authorization` metadata. Each op goes the way StoreGrpcService's Session
// sends it: authorize (daemon::AuthorizeStoreCall, as lockstepd installs it),
// clamp the timeout (StoreWaitTimeout), then StoreCore, here with small
// quotas so inputs reach them and without its expiry thread.
//
// The model is a map of namespaces to keys to values. After every step the
// store must agree with it; every write must have been accepted or refused
// exactly as store_core.h and store.h promise (limits, quotas, all-or-nothing
// MultiSet, CompareSet); every wait must complete exactly once, when and how
// the header says (at once, from the write that completes it, DeadlineExceeded
// at its deadline, Aborted when its namespace is dropped); and no empty
// namespace may be left behind once nothing waits in it.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/clock.h"
#include "daemon/roles.h"
#include "daemon/token.h"
#include "lockstep/v1/store.pb.h"
#include "rendezvous/store.h"
#include "rendezvous/store_core.h"
#include "rendezvous/store_service.h"
#include "tests/fuzz/fuzz_check.h"

namespace lockstep {
namespace rendezvous {
namespace {

using fuzz::CheckErrorMessage;

// A timeout's message names the namespace and up to 8 missing keys, each
// quoted to at most 64 bytes (4 when escaped) plus "...(N bytes)": under 3
// KiB; every other message quotes one or two values.
constexpr size_t kMaxErrorBytes = 4096;
// What lockstepd's store admits: its admin token (by role), a job's store
// token (keyed by store.key); viewer and agent tokens are refused by role.
constexpr char kAdminToken[] = "fuzz-admin-token";
constexpr char kViewerToken[] = "fuzz-viewer-token";
constexpr char kAgentToken[] = "fuzz-agent-token";
constexpr char kStoreKey[] = "fuzz-store-key";

const daemon::RoleTokens& Roles() {
  static const daemon::RoleTokens* roles = [] {
    auto* r = new daemon::RoleTokens;
    r->SetToken(daemon::Role::kAdmin, kAdminToken);
    r->SetToken(daemon::Role::kViewer, kViewerToken);
    r->SetToken(daemon::Role::kAgent, kAgentToken);
    return r;
  }();
  return *roles;
}

StoreCore::Options SmallQuotas() {
  StoreCore::Options options;
  options.run_expiry_thread = false;
  options.max_keys_per_namespace = 16;
  options.max_bytes_per_job = 4096;
  options.max_bytes_total = 16384;
  return options;
}

std::string Owner(const std::string& ns) { return ns.substr(0, ns.find('/')); }

bool ValidName(const std::string& s) { return !s.empty() && s.size() <= kMaxKeyBytes; }

struct Wait {
  std::string ns;
  std::vector<std::string> keys;
  bool want_values = false;
  MonoTime deadline;
  StoreCore::WaitId id = 0;
  int fired = 0;
  bool checked = false;  // its completion was checked
  bool cancelled = false;
  std::optional<StatusOr<std::vector<std::string>>> result;
};

class Session {
 public:
  Session() : core_(&clock_, limits_) {}

  void Step(const fuzz::Field& field) {
    const bool advance = field.number == 2 && !field.is_bytes;
    const bool drop = field.number == 3 && field.is_bytes;
    if (field.number == 1 && field.is_bytes) {
      v1::StoreOp op;
      if (op.ParseFromString(field.bytes)) Execute(op);
    } else if (advance) {
      Advance(field.varint);
    } else if (drop) {
      DropPrefix(field.bytes);
    } else if (field.number == 4 && field.is_bytes) {
      authorization_ = field.bytes;
    }
    CheckWaits(advance, drop ? &field.bytes : nullptr);
  }

  // The client goes away: its pending waits are cancelled (their callbacks
  // never run), and the store holds exactly the model's namespaces.
  void Finish() {
    for (auto& w : waits_) {
      if (w->fired > 0) continue;
      FUZZ_CHECK(core_.CancelWait(w->id), "a pending wait could not be cancelled");
      w->cancelled = true;
    }
    FUZZ_CHECK(core_.NumPendingWaiters() == 0, std::to_string(core_.NumPendingWaiters()));
    for (const auto& w : waits_) FUZZ_CHECK(w->fired == (w->cancelled ? 0 : 1), "wait fired twice");
    int64_t nonempty = 0;
    for (const auto& [ns, keys] : model_) {
      if (!keys.empty()) ++nonempty;
      CheckNamespace(ns);
    }
    FUZZ_CHECK(core_.NumNamespaces() == nonempty,
               "the store keeps " + std::to_string(core_.NumNamespaces()) + " namespaces, " +
                   std::to_string(nonempty) + " hold keys");
  }

 private:
  // ----------------------------------------------------------- the model
  // What a namespace holding these keys counts against the quotas
  // (StoreCore::Options: StoreNamespaceCharge while it holds keys, and
  // StoreKeyCharge per key).
  static size_t Charge(const std::string& ns, const std::map<std::string, size_t>& sizes) {
    if (sizes.empty()) return 0;
    size_t bytes = StoreNamespaceCharge(ns.size());
    for (const auto& [k, size] : sizes) bytes += StoreKeyCharge(k.size(), size);
    return bytes;
  }
  std::map<std::string, size_t> Sizes(const std::string& ns) const {
    std::map<std::string, size_t> sizes;
    auto space = model_.find(ns);
    if (space != model_.end()) {
      for (const auto& [k, v] : space->second) sizes[k] = v.size();
    }
    return sizes;
  }
  size_t OwnerBytes(const std::string& owner) const {
    size_t bytes = 0;
    for (const auto& [ns, keys] : model_) {
      if (Owner(ns) == owner) bytes += Charge(ns, Sizes(ns));
    }
    return bytes;
  }
  size_t TotalBytes() const {
    size_t bytes = 0;
    for (const auto& [ns, keys] : model_) bytes += Charge(ns, Sizes(ns));
    return bytes;
  }
  const std::string* Find(const std::string& ns, const std::string& key) const {
    auto space = model_.find(ns);
    if (space == model_.end()) return nullptr;
    auto it = space->second.find(key);
    return it == space->second.end() ? nullptr : &it->second;
  }
  // Whether writing `values` (last one per key wins) into `ns` fits the
  // quotas (StoreCore::Options; ResourceExhausted otherwise).
  bool Fits(const std::string& ns, const std::map<std::string, size_t>& values) const {
    const std::map<std::string, size_t> before = Sizes(ns);
    std::map<std::string, size_t> after = before;
    for (const auto& [key, size] : values) after[key] = size;
    if (after.size() > limits_.max_keys_per_namespace) return false;
    const int64_t delta =
        static_cast<int64_t>(Charge(ns, after)) - static_cast<int64_t>(Charge(ns, before));
    if (delta <= 0) return true;
    return OwnerBytes(Owner(ns)) + delta <= limits_.max_bytes_per_job &&
           TotalBytes() + delta <= limits_.max_bytes_total;
  }

  // The store agrees with the model on `ns`, and the quotas hold.
  void CheckNamespace(const std::string& ns) {
    if (!ValidName(ns)) return;
    auto n = core_.NumKeys(ns);
    FUZZ_CHECK(n.ok(), n.status().ToString());
    const size_t want = model_.count(ns) ? model_.at(ns).size() : 0;
    FUZZ_CHECK(static_cast<size_t>(*n) == want,
               "NumKeys " + std::to_string(*n) + ", the model has " + std::to_string(want));
    if (model_.count(ns)) {
      for (const auto& [key, value] : model_.at(ns)) {
        auto got = core_.TryGet(ns, key);
        FUZZ_CHECK(got.ok() && *got == value, "store and model differ at " + QuoteForError(key));
      }
    }
    FUZZ_CHECK(want <= limits_.max_keys_per_namespace, "over the key limit");
    FUZZ_CHECK(OwnerBytes(Owner(ns)) <= limits_.max_bytes_per_job, "over the per-job quota");
    FUZZ_CHECK(TotalBytes() <= limits_.max_bytes_total, "over the total quota");
  }

  // ------------------------------------------------------------- the ops
  Status Authorize(const std::string& ns) const {
    if (!authorization_) return absl::OkStatus();  // an open store (tests, StoreServer)
    Status s = daemon::AuthorizeStoreCall(Roles(), kStoreKey, *authorization_, true, ns);
    CheckErrorMessage(s, kMaxErrorBytes, "AuthorizeStoreCall");
    const std::string& header = *authorization_;
    const bool bearer = header.rfind("Bearer ", 0) == 0;
    const std::string got = bearer ? header.substr(7) : "";
    const std::string job = Owner(ns);
    const bool opens =
        bearer && (got == kAdminToken || (!job.empty() && got == daemon::JobStoreToken(kStoreKey, job)));
    FUZZ_CHECK(s.ok() == opens, "AuthorizeStoreCall(" + QuoteForError(header) + ", " +
                                    QuoteForError(ns) + ") = " + s.ToString());
    FUZZ_CHECK(s.ok() || (bearer ? absl::IsPermissionDenied(s) : absl::IsUnauthenticated(s)), s.ToString());
    return s;
  }

  static const std::string& Namespace(const v1::StoreOp& op) {
    static const std::string kNone;
    switch (op.op_case()) {
      case v1::StoreOp::kSet: return op.set().namespace_();
      case v1::StoreOp::kGet: return op.get().namespace_();
      case v1::StoreOp::kAdd: return op.add().namespace_();
      case v1::StoreOp::kCompareSet: return op.compare_set().namespace_();
      case v1::StoreOp::kDelete: return op.delete_().namespace_();
      case v1::StoreOp::kWait: return op.wait().namespace_();
      case v1::StoreOp::kNumKeys: return op.num_keys().namespace_();
      case v1::StoreOp::kMultiGet: return op.multi_get().namespace_();
      case v1::StoreOp::kMultiSet: return op.multi_set().namespace_();
      case v1::StoreOp::OP_NOT_SET: break;
    }
    return kNone;
  }

  void Execute(const v1::StoreOp& op) {
    if (op.op_case() == v1::StoreOp::OP_NOT_SET) return;  // refused by the shell
    const std::string& ns = Namespace(op);
    if (!Authorize(ns).ok()) return;
    switch (op.op_case()) {
      case v1::StoreOp::kSet: Set(op.set()); break;
      case v1::StoreOp::kAdd: Add(op.add()); break;
      case v1::StoreOp::kCompareSet: CompareSet(op.compare_set()); break;
      case v1::StoreOp::kDelete: Delete(op.delete_()); break;
      case v1::StoreOp::kNumKeys: {
        auto n = core_.NumKeys(ns);
        CheckErrorMessage(n.status(), kMaxErrorBytes, "NumKeys");
        FUZZ_CHECK(n.ok() == ValidName(ns), n.status().ToString());
        break;
      }
      case v1::StoreOp::kMultiSet: MultiSet(op.multi_set()); break;
      case v1::StoreOp::kGet:
        StartWait(ns, {op.get().key()}, op.get().timeout_ms(), true);
        break;
      case v1::StoreOp::kWait:
        StartWait(ns, {op.wait().keys().begin(), op.wait().keys().end()}, op.wait().timeout_ms(), false);
        break;
      case v1::StoreOp::kMultiGet:
        StartWait(ns, {op.multi_get().keys().begin(), op.multi_get().keys().end()},
                  op.multi_get().timeout_ms(), true);
        break;
      case v1::StoreOp::OP_NOT_SET: break;
    }
    CheckNamespace(ns);
  }

  // A write's outcome: refused with `code` and nothing written, or OK.
  void ExpectOutcome(const Status& s, absl::StatusCode want, const char* what) {
    CheckErrorMessage(s, kMaxErrorBytes, what);
    FUZZ_CHECK(s.code() == want, std::string(what) + ": want " + absl::StatusCodeToString(want) +
                                     ", got " + s.ToString());
  }

  void Set(const v1::StoreSetRequest& r) {
    const bool valid = ValidName(r.namespace_()) && ValidName(r.key()) && r.value().size() <= kMaxValueBytes;
    const bool fits = valid && Fits(r.namespace_(), {{r.key(), r.value().size()}});
    Status s = core_.Set(r.namespace_(), r.key(), r.value());
    ExpectOutcome(s, !valid ? absl::StatusCode::kInvalidArgument
                            : fits ? absl::StatusCode::kOk : absl::StatusCode::kResourceExhausted,
                  "Set");
    if (s.ok()) model_[r.namespace_()][r.key()] = r.value();
  }

  void Add(const v1::StoreAddRequest& r) {
    const bool valid = ValidName(r.namespace_()) && ValidName(r.key());
    auto got = core_.Add(r.namespace_(), r.key(), r.delta());
    if (!valid) return ExpectOutcome(got.status(), absl::StatusCode::kInvalidArgument, "Add");
    const std::string* old = Find(r.namespace_(), r.key());
    int64_t current = 0, sum = 0;
    if (old != nullptr && !absl::SimpleAtoi(*old, &current)) {
      return ExpectOutcome(got.status(), absl::StatusCode::kInvalidArgument, "Add");
    }
    if (__builtin_add_overflow(current, r.delta(), &sum)) {
      return ExpectOutcome(got.status(), absl::StatusCode::kOutOfRange, "Add");
    }
    const std::string value = std::to_string(sum);
    const bool fits = Fits(r.namespace_(), {{r.key(), value.size()}});
    ExpectOutcome(got.status(), fits ? absl::StatusCode::kOk : absl::StatusCode::kResourceExhausted, "Add");
    if (!got.ok()) return;
    FUZZ_CHECK(*got == sum, "Add returned " + std::to_string(*got) + ", want " + value);
    model_[r.namespace_()][r.key()] = value;
  }

  // StoreGrpcService::CompareSet: expect_absent with a non-empty expected is
  // InvalidArgument (the shell's check, not reachable from here); else the
  // core swaps when the value equals expected, or the key is absent and
  // expected is empty; with expect_absent only when the key is absent
  // (store.proto: "empty + expect_absent: set only if missing").
  void CompareSet(const v1::StoreCompareSetRequest& r) {
    if (r.expect_absent() && !r.expected().empty()) return;  // refused by the shell
    const bool valid = ValidName(r.namespace_()) && ValidName(r.key()) &&
                       r.desired().size() <= kMaxValueBytes && r.expected().size() <= kMaxValueBytes;
    const std::string* old = Find(r.namespace_(), r.key());
    const bool swap =
        valid && (old == nullptr ? r.expected().empty() : !r.expect_absent() && *old == r.expected());
    const bool fits = swap && Fits(r.namespace_(), {{r.key(), r.desired().size()}});
    const std::string before = old == nullptr ? "" : *old;
    const bool existed = old != nullptr;
    auto got = core_.CompareSet(r.namespace_(), r.key(), r.expected(), r.desired(), r.expect_absent());
    ExpectOutcome(got.status(), !valid ? absl::StatusCode::kInvalidArgument
                                       : !swap || fits ? absl::StatusCode::kOk
                                                       : absl::StatusCode::kResourceExhausted,
                  "CompareSet");
    if (!got.ok()) return;
    FUZZ_CHECK(got->swapped == swap, "CompareSet swapped=" + std::to_string(got->swapped));
    FUZZ_CHECK(!(r.expect_absent() && existed && got->swapped),
               "CompareSet with expect_absent swapped a key that exists (value " +
                   QuoteForError(before) + ")");
    FUZZ_CHECK(got->current == (swap ? r.desired() : before), "CompareSet's current value");
    if (swap) model_[r.namespace_()][r.key()] = r.desired();
  }

  void Delete(const v1::StoreDeleteRequest& r) {
    const bool valid = ValidName(r.namespace_()) && ValidName(r.key());
    const bool existed = Find(r.namespace_(), r.key()) != nullptr;
    auto got = core_.Delete(r.namespace_(), r.key());
    ExpectOutcome(got.status(), valid ? absl::StatusCode::kOk : absl::StatusCode::kInvalidArgument, "Delete");
    if (!got.ok()) return;
    FUZZ_CHECK(*got == existed, "Delete's answer");
    if (existed) {
      model_[r.namespace_()].erase(r.key());
      if (model_[r.namespace_()].empty()) model_.erase(r.namespace_());
    }
  }

  void MultiSet(const v1::StoreMultiSetRequest& r) {
    bool valid = ValidName(r.namespace_()) && r.entries_size() > 0 &&
                 static_cast<size_t>(r.entries_size()) <= kMaxKeysPerRequest;
    std::map<std::string, size_t> last;
    for (const auto& e : r.entries()) {
      valid = valid && ValidName(e.key()) && e.value().size() <= kMaxValueBytes;
      last[e.key()] = e.value().size();
    }
    const bool fits = valid && Fits(r.namespace_(), last);
    std::vector<std::pair<std::string, std::string>> entries;
    for (const auto& e : r.entries()) entries.emplace_back(e.key(), e.value());
    Status s = core_.MultiSet(r.namespace_(), std::move(entries));
    ExpectOutcome(s, !valid ? absl::StatusCode::kInvalidArgument
                            : fits ? absl::StatusCode::kOk : absl::StatusCode::kResourceExhausted,
                  "MultiSet");
    if (!s.ok()) return;
    for (const auto& e : r.entries()) model_[r.namespace_()][e.key()] = e.value();
  }

  // StoreGrpcService's waits: the timeout clamped by StoreWaitTimeout, the
  // deadline on the core's clock.
  void StartWait(const std::string& ns, std::vector<std::string> keys, int64_t timeout_ms,
                 bool want_values) {
    auto wait = StoreWaitTimeout(timeout_ms);
    CheckErrorMessage(wait.status(), kMaxErrorBytes, "StoreWaitTimeout");
    if (timeout_ms < 0) {
      FUZZ_CHECK(absl::IsInvalidArgument(wait.status()), "a negative timeout_ms is accepted");
      return;
    }
    FUZZ_CHECK(wait.ok(), wait.status().ToString());
    FUZZ_CHECK(*wait >= Duration::zero() && *wait <= kMaxStoreWait, "StoreWaitTimeout out of range");
    const int64_t max_ms = std::chrono::duration_cast<std::chrono::milliseconds>(kMaxStoreWait).count();
    FUZZ_CHECK(timeout_ms >= max_ms || *wait == std::chrono::milliseconds(timeout_ms),
               "StoreWaitTimeout changed " + std::to_string(timeout_ms) + " ms");
    auto w = std::make_unique<Wait>();
    Wait* raw = w.get();
    raw->ns = ns;
    raw->keys = keys;
    raw->want_values = want_values;
    raw->deadline = clock_.Now() + *wait;
    waits_.push_back(std::move(w));
    const bool valid = ValidName(ns) && !keys.empty() && keys.size() <= kMaxKeysPerRequest &&
                       std::all_of(keys.begin(), keys.end(), ValidName);
    bool all_there = valid;
    for (const auto& key : keys) all_there = all_there && Find(ns, key) != nullptr;
    raw->id = core_.WaitAsync(ns, keys, raw->deadline, want_values,
                              [raw](StatusOr<std::vector<std::string>> result) {
                                ++raw->fired;
                                raw->result = std::move(result);
                              });
    // At once: bad input, every key there, or no time to wait.
    if (!valid) {
      FUZZ_CHECK(raw->fired == 1 && absl::IsInvalidArgument(raw->result->status()), "a bad wait");
    } else if (all_there) {
      FUZZ_CHECK(raw->fired == 1 && raw->result->ok(), "a wait for keys that exist");
    } else if (*wait == Duration::zero()) {
      FUZZ_CHECK(raw->fired == 1 && absl::IsDeadlineExceeded(raw->result->status()),
                 "timeout_ms 0 on a missing key");
    } else {
      FUZZ_CHECK(raw->fired == 0, "a wait completed before its keys exist");
    }
  }

  void Advance(uint64_t ms) {
    // Up to two years per step (kMaxStoreWait is one).
    clock_.Advance(std::chrono::milliseconds(ms % (2 * 366 * 86400000ull)));
    core_.ExpireWaiters();
  }

  void DropPrefix(const std::string& prefix) {
    core_.DeleteNamespacesWithPrefix(prefix);
    for (auto it = model_.begin(); it != model_.end();) {
      it = it->first.compare(0, prefix.size(), prefix) == 0 ? model_.erase(it) : std::next(it);
    }
  }

  // Every wait that completed in this step completed as promised; every
  // other one had to stay pending.
  void CheckWaits(bool expired, const std::string* dropped) {
    const MonoTime now = clock_.Now();
    for (auto& w : waits_) {
      FUZZ_CHECK(w->fired <= 1, "a wait's callback ran twice");
      if (w->fired == 0) {
        FUZZ_CHECK(!(expired && w->deadline <= now), "a wait outlived its deadline");
        FUZZ_CHECK(!(dropped != nullptr && w->ns.compare(0, dropped->size(), *dropped) == 0),
                   "a wait outlived its namespace");
        continue;
      }
      if (w->checked) continue;
      w->checked = true;
      const Status& s = w->result->status();
      CheckErrorMessage(s, kMaxErrorBytes, "a wait's result");
      if (s.ok()) {
        const std::vector<std::string>& values = **w->result;
        FUZZ_CHECK(values.size() == (w->want_values ? w->keys.size() : 0), "a wait's values");
        for (size_t i = 0; i < w->keys.size(); ++i) {
          const std::string* v = Find(w->ns, w->keys[i]);
          FUZZ_CHECK(v != nullptr, "a wait completed without its key " + QuoteForError(w->keys[i]));
          if (w->want_values) FUZZ_CHECK(values[i] == *v, "a wait's value differs from the store's");
        }
      } else if (absl::IsDeadlineExceeded(s)) {
        FUZZ_CHECK(w->deadline <= now, "DeadlineExceeded before the deadline");
      } else if (absl::IsAborted(s)) {
        FUZZ_CHECK(dropped != nullptr && w->ns.compare(0, dropped->size(), *dropped) == 0,
                   "Aborted without its namespace dropped");
      } else {
        FUZZ_CHECK(absl::IsInvalidArgument(s), "a wait's result: " + s.ToString());
      }
    }
  }

  const StoreCore::Options limits_ = SmallQuotas();
  FakeClock clock_;
  StoreCore core_;
  std::map<std::string, std::map<std::string, std::string>> model_;
  std::vector<std::unique_ptr<Wait>> waits_;
  std::optional<std::string> authorization_;
};

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::fuzz::QuietProtobufLog();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lockstep::rendezvous::Session session;
  lockstep::fuzz::ForEachStep(data, size, [&](const lockstep::fuzz::Field& f) { session.Step(f); });
  session.Finish();
  return 0;
}
