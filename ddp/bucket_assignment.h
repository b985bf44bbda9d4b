// Bucket assignment: which parameters share a gradient bucket. A pure
// function of sizes, dtypes and an order, so it is tested without autograd
// and every rank computes the same layout from the same inputs.
#ifndef LOCKSTEP_DDP_BUCKET_ASSIGNMENT_H_
#define LOCKSTEP_DDP_BUCKET_ASSIGNMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep {
namespace ddp {

// Default cap of every bucket but the first (PyTorch's bucket_cap_mb = 25).
inline constexpr size_t kDefaultBucketCapBytes = 25u * 1024 * 1024;
// Cap of the first bucket: small, so the first allreduce starts early in
// backward.
inline constexpr size_t kDefaultFirstBucketCapBytes = 1u * 1024 * 1024;

struct BucketParam {
  size_t bytes = 0;
  int dtype = 0;  // Any key; parameters of different dtypes never share a bucket.
};

// Packs parameters into buckets.
//
// Rule: walk `order` (indices into `params`; the order gradients are
// expected to become ready: reverse registration order at first, the
// observed arrival order after the first iteration). Each dtype has one
// open bucket; a parameter joins its dtype's open bucket, and the bucket
// closes as soon as it holds at least its cap: `first_cap_bytes` for the
// first bucket closed of each dtype, `cap_bytes` for later ones (so a bucket
// exceeds its cap by at most its last parameter, and a parameter larger than
// the cap sits alone). Open buckets close at the end. Buckets are then sorted
// by the position in `order` of their first parameter, and that is the bucket
// index order: the order in which buckets are expected to become ready, and
// the order in which they are launched.
//
// Returns, per bucket, the parameter indices in `order` order.
// REQUIRES: `order` is a permutation of 0..params.size()-1; caps > 0.
std::vector<std::vector<size_t>> AssignBuckets(const std::vector<BucketParam>& params,
                                               const std::vector<size_t>& order,
                                               size_t first_cap_bytes, size_t cap_bytes);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_BUCKET_ASSIGNMENT_H_
