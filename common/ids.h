// Strong types for identifiers, so a JobId is never passed where a NodeId
// is expected. Cheap to copy; hashable; ordered.
#ifndef LOCKSTEP_COMMON_IDS_H_
#define LOCKSTEP_COMMON_IDS_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>

namespace lockstep {

template <typename Tag>
class StringId {
 public:
  StringId() = default;
  explicit StringId(std::string value) : value_(std::move(value)) {}
  const std::string& value() const { return value_; }
  bool empty() const { return value_.empty(); }
  friend bool operator==(const StringId& a, const StringId& b) { return a.value_ == b.value_; }
  friend bool operator!=(const StringId& a, const StringId& b) { return a.value_ != b.value_; }
  friend bool operator<(const StringId& a, const StringId& b) { return a.value_ < b.value_; }
  friend std::ostream& operator<<(std::ostream& os, const StringId& id) { return os << id.value_; }

 private:
  std::string value_;
};

template <typename Tag>
class IntId {
 public:
  constexpr IntId() = default;
  constexpr explicit IntId(int32_t value) : value_(value) {}
  constexpr int32_t value() const { return value_; }
  friend constexpr bool operator==(IntId a, IntId b) { return a.value_ == b.value_; }
  friend constexpr bool operator!=(IntId a, IntId b) { return a.value_ != b.value_; }
  friend constexpr bool operator<(IntId a, IntId b) { return a.value_ < b.value_; }
  friend std::ostream& operator<<(std::ostream& os, IntId id) { return os << id.value_; }

 private:
  int32_t value_ = -1;
};

using JobId = StringId<struct JobIdTag>;
using NodeId = StringId<struct NodeIdTag>;
using Incarnation = StringId<struct IncarnationTag>;
using Rank = IntId<struct RankTag>;
using Round = IntId<struct RoundTag>;

// A new random id with `prefix` ("j-", "inc-"): prefix + 16 hex digits.
std::string NewRandomId(const std::string& prefix);

// True if `id` is a safe path component for ids ([A-Za-z0-9._-], 1 to 128
// characters, not "." or ".."): job ids name directories under the state
// dir and go into log lines as they are.
bool IsSafeId(const std::string& id);

}  // namespace lockstep

namespace std {
template <typename Tag>
struct hash<lockstep::StringId<Tag>> {
  size_t operator()(const lockstep::StringId<Tag>& id) const {
    return std::hash<std::string>()(id.value());
  }
};
template <typename Tag>
struct hash<lockstep::IntId<Tag>> {
  size_t operator()(lockstep::IntId<Tag> id) const { return std::hash<int32_t>()(id.value()); }
};
}  // namespace std

#endif  // LOCKSTEP_COMMON_IDS_H_
