#ifndef LOCKSTEP_DDP_STREAMING_H_
#define LOCKSTEP_DDP_STREAMING_H_

// float32 copies and reductions that write with non-temporal stores, for
// data much larger than the cache: a gradient copied into its bucket slot,
// a bucket slice reduced in shared memory. An ordinary store first reads the
// line it writes (read for ownership), so copying N bytes moves 3N through
// memory; streaming stores move 2N. On the 2-core VM, with both ranks
// copying at once, a 151 MB scaled copy took 20 ms with ordinary stores and
// 13 ms streaming (bench/README.md "Streaming stores"). Below
// kStreamingMinBytes the destination may still be read from the cache soon
// (the next step of a small model), so callers keep ordinary stores there.

#include <ATen/ATen.h>

#include <cstdint>

namespace lockstep {
namespace ddp {

// Copies of at least this many bytes stream.
constexpr int64_t kStreamingMinBytes = int64_t{4} << 20;

// Whether this CPU has the streaming kernels (x86-64 with AVX2).
bool StreamingAvailable();

// dst = src * scale (scale 1: a plain copy), for contiguous float32 CPU
// tensors of the same number of elements, of at least kStreamingMinBytes.
// Returns false, having written nothing, when any of that does not hold or
// !StreamingAvailable(): the caller then copies as before. The products are
// those of at::mul_out with a float scale, bit for bit.
bool StreamingScaledCopy(const at::Tensor& dst, const at::Tensor& src, float scale);

// For i in [0, n): v = ins[0][i] + ins[1][i] + ... (added in that order),
// divided by `divisor` when it is not 1, then stored to every outs[k][i].
// An output may be one of the inputs (in-place). Returns false, having
// written nothing, when !StreamingAvailable(); float32 only.
bool StreamingReduce(const float* const* ins, int num_ins, float divisor, float* const* outs,
                     int num_outs, int64_t n);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_STREAMING_H_
