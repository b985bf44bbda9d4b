#include "ddp/bucket_assignment.h"

#include <algorithm>
#include <cassert>
#include <map>

namespace lockstep {
namespace ddp {

std::vector<std::vector<size_t>> AssignBuckets(const std::vector<BucketParam>& params,
                                               const std::vector<size_t>& order,
                                               size_t first_cap_bytes, size_t cap_bytes) {
  assert(order.size() == params.size());
  struct Open {
    std::vector<size_t> members;
    size_t bytes = 0;
    bool closed_one = false;  // Whether this dtype already closed its first bucket.
  };
  std::map<int, Open> open;
  std::vector<std::vector<size_t>> buckets;
  for (size_t index : order) {
    Open& b = open[params[index].dtype];
    b.members.push_back(index);
    b.bytes += params[index].bytes;
    const size_t cap = b.closed_one ? cap_bytes : first_cap_bytes;
    if (b.bytes >= cap) {
      buckets.push_back(std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      b.closed_one = true;
    }
  }
  for (auto& [dtype, b] : open) {
    if (!b.members.empty()) buckets.push_back(std::move(b.members));
  }
  std::vector<size_t> position(params.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::stable_sort(buckets.begin(), buckets.end(),
                   [&](const std::vector<size_t>& a, const std::vector<size_t>& b) {
                     return position[a.front()] < position[b.front()];
                   });
  return buckets;
}

}  // namespace ddp
}  // namespace lockstep
