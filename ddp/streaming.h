#ifndef LOCKSTEP_DDP_STREAMING_H_
#define LOCKSTEP_DDP_STREAMING_H_

// float32 kernels for the gradient path: a copy into a bucket slot that
// writes with non-temporal stores, and the one-pass reduction shm uses on a
// bucket slice.
//
// Streaming (non-temporal) stores skip reading the destination lines first
// (read for ownership), so copying N bytes moves 2N through memory instead
// of 3N. On the 2-core VM of 2026-11-25, with both ranks copying at once, a
// 151 MB scaled copy took 20 ms with ordinary stores and 13 ms streaming
// (bench/README.md "Streaming stores"). Below kStreamingMinBytes the
// destination may still be read from the cache soon (the next step of a
// small model), so callers keep ordinary stores there.
//
// The reduction does *not* stream. Its results are read right away (by the
// peers' optimizers, from their own buffers), and on the AMD EPYC VM of
// 2026-11-27 streaming them cost 35-70 ms per 33.6 MB slice in the training
// step against 9-17 ms with ordinary stores (bench/README.md "shm: ordinary
// stores and the own share").

#include <ATen/ATen.h>

#include <cstdint>

namespace lockstep {
namespace ddp {

// Copies of at least this many bytes stream.
constexpr int64_t kStreamingMinBytes = int64_t{4} << 20;

// Whether this CPU has the AVX2 kernels of this file (x86-64 with AVX2):
// the streaming copy, and ReduceToAll's vectorised loop.
bool StreamingAvailable();

// dst = src * scale (scale 1: a plain copy), for contiguous float32 CPU
// tensors of the same number of elements, of at least kStreamingMinBytes.
// Returns false, having written nothing, when any of that does not hold or
// !StreamingAvailable(): the caller then copies as before. The products are
// those of at::mul_out with a float scale, bit for bit.
bool StreamingScaledCopy(const at::Tensor& dst, const at::Tensor& src, float scale);

// For i in [0, n): v = ins[0][i] + ins[1][i] + ... (added in that order),
// divided by `divisor` when it is not 1, then stored to every outs[k][i]
// (ordinary stores; vectorised with AVX2 where the CPU has it). An output
// may be one of the inputs (in-place). float32 only; any alignment.
// REQUIRES: num_ins >= 1, num_outs >= 1.
void ReduceToAll(const float* const* ins, int num_ins, float divisor, float* const* outs,
                 int num_outs, int64_t n);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_STREAMING_H_
