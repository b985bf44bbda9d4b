#include "ddp/streaming.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstdint>

namespace lockstep {
namespace ddp {
namespace {

// The reduction of ReduceToAll, one element at a time (the fallback, and the
// tail of the AVX2 loop).
void ReduceScalar(const float* const* ins, int num_ins, float divisor, float* const* outs,
                  int num_outs, int64_t from, int64_t to) {
  for (int64_t i = from; i < to; ++i) {
    float v = ins[0][i];
    for (int k = 1; k < num_ins; ++k) v += ins[k][i];
    if (divisor != 1.0f) v /= divisor;
    for (int k = 0; k < num_outs; ++k) outs[k][i] = v;
  }
}

#if defined(__x86_64__)
constexpr int64_t kLanes = 8;  // floats in a 256-bit register

// Elements before `p` reaches a 32-byte boundary (streaming stores need it).
int64_t HeadOf(const float* p, int64_t n) {
  const auto misaligned = reinterpret_cast<uintptr_t>(p) % 32;
  if (misaligned % sizeof(float) != 0) return n;  // never aligns: all scalar
  const int64_t head = misaligned == 0 ? 0 : static_cast<int64_t>((32 - misaligned) / sizeof(float));
  return head < n ? head : n;
}

__attribute__((target("avx2"))) void ScaledCopyAvx2(float* dst, const float* src, int64_t n,
                                                    float scale) {
  const int64_t head = HeadOf(dst, n);
  int64_t i = 0;
  for (; i < head; ++i) dst[i] = src[i] * scale;
  const __m256 k = _mm256_set1_ps(scale);
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_stream_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), k));
  }
  for (; i < n; ++i) dst[i] = src[i] * scale;
  _mm_sfence();  // streaming stores are weakly ordered: visible before we return
}

__attribute__((target("avx2"))) void ReduceAvx2(const float* const* ins, int num_ins,
                                                float divisor, float* const* outs, int num_outs,
                                                int64_t n) {
  const bool divide = divisor != 1.0f;
  const __m256 d = _mm256_set1_ps(divisor);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m256 v = _mm256_loadu_ps(ins[0] + i);
    for (int k = 1; k < num_ins; ++k) v = _mm256_add_ps(v, _mm256_loadu_ps(ins[k] + i));
    if (divide) v = _mm256_div_ps(v, d);
    for (int k = 0; k < num_outs; ++k) _mm256_storeu_ps(outs[k] + i, v);
  }
  ReduceScalar(ins, num_ins, divisor, outs, num_outs, i, n);
}
#endif

}  // namespace

bool StreamingAvailable() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

bool StreamingScaledCopy(const at::Tensor& dst, const at::Tensor& src, float scale) {
#if defined(__x86_64__)
  if (!StreamingAvailable() || !dst.device().is_cpu() || !src.device().is_cpu() ||
      dst.scalar_type() != at::kFloat || src.scalar_type() != at::kFloat ||
      !dst.is_contiguous() || !src.is_contiguous() || dst.numel() != src.numel() ||
      static_cast<int64_t>(dst.nbytes()) < kStreamingMinBytes) {
    return false;
  }
  ScaledCopyAvx2(dst.data_ptr<float>(), src.data_ptr<float>(), dst.numel(), scale);
  return true;
#else
  return false;
#endif
}

void ReduceToAll(const float* const* ins, int num_ins, float divisor, float* const* outs,
                 int num_outs, int64_t n) {
#if defined(__x86_64__)
  if (StreamingAvailable()) {
    ReduceAvx2(ins, num_ins, divisor, outs, num_outs, n);
    return;
  }
#endif
  ReduceScalar(ins, num_ins, divisor, outs, num_outs, 0, n);
}

}  // namespace ddp
}  // namespace lockstep
