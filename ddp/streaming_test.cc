#include "ddp/streaming.h"

#include <ATen/ATen.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

// Bit-for-bit equality of two float32 tensors.
bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

constexpr int64_t kBig = kStreamingMinBytes / 4 + 13;  // floats: above the bar, odd tail

TEST(StreamingTest, ScaledCopyEqualsMulOutBitForBit) {
  if (!StreamingAvailable()) GTEST_SKIP() << "no AVX2 on this CPU";
  at::manual_seed(1);
  const at::Tensor storage = at::randn({kBig + 8});
  // Misaligned source and destination (offsets of 1 and 3 floats): the head
  // and tail are stored one by one, the middle streams.
  for (int64_t src_off : {0, 1}) {
    for (int64_t dst_off : {0, 3}) {
      for (double scale : {1.0, 0.5, 1.0 / 3.0, 40.0}) {
        const at::Tensor src = storage.narrow(0, src_off, kBig);
        at::Tensor dst_storage = at::zeros({kBig + 8});
        const at::Tensor dst = dst_storage.narrow(0, dst_off, kBig);
        ASSERT_TRUE(StreamingScaledCopy(dst, src, static_cast<float>(scale)));
        at::Tensor want = at::empty({kBig});
        at::mul_out(want, src, at::scalar_tensor(scale, at::kDouble));
        EXPECT_TRUE(SameBits(dst, want)) << "src +" << src_off << " dst +" << dst_off << " scale " << scale;
        // Nothing outside the destination was written.
        EXPECT_EQ(dst_storage.narrow(0, 0, dst_off).abs().sum().item<float>(), 0.0f);
        EXPECT_EQ(dst_storage.narrow(0, dst_off + kBig, 8 - dst_off).abs().sum().item<float>(), 0.0f);
      }
    }
  }
}

TEST(StreamingTest, ScaledCopyDeclinesWhatItDoesNotHandle) {
  if (!StreamingAvailable()) GTEST_SKIP() << "no AVX2 on this CPU";
  const at::Tensor small = at::ones({1024});
  at::Tensor small_dst = at::zeros({1024});
  EXPECT_FALSE(StreamingScaledCopy(small_dst, small, 1.0f)) << "below kStreamingMinBytes";
  EXPECT_EQ(small_dst.sum().item<float>(), 0.0f);
  const at::Tensor doubles = at::ones({kBig}, at::kDouble);
  at::Tensor doubles_dst = at::zeros({kBig}, at::kDouble);
  EXPECT_FALSE(StreamingScaledCopy(doubles_dst, doubles, 1.0f)) << "not float32";
  const at::Tensor strided = at::ones({kBig, 2}).select(1, 0);
  at::Tensor dst = at::zeros({kBig});
  EXPECT_FALSE(StreamingScaledCopy(dst, strided, 1.0f)) << "not contiguous";
  EXPECT_FALSE(StreamingScaledCopy(dst, at::ones({kBig - 1}), 1.0f)) << "sizes differ";
  EXPECT_EQ(dst.sum().item<float>(), 0.0f);
}

// The reference: the same additions in the same order, one element at a time.
std::vector<float> Reference(const std::vector<const float*>& ins, float divisor, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float v = ins[0][i];
    for (size_t k = 1; k < ins.size(); ++k) v += ins[k][i];
    if (divisor != 1.0f) v /= divisor;
    out[static_cast<size_t>(i)] = v;
  }
  return out;
}

TEST(StreamingTest, ReduceSumsInOrderAndWritesEveryOutputInPlaceToo) {
  at::manual_seed(2);
  const int64_t n = 100003;
  for (float divisor : {1.0f, 3.0f}) {
    for (int64_t off : {0, 5}) {  // aligned, and every output 5 floats off
      std::vector<at::Tensor> bufs;
      for (int k = 0; k < 3; ++k) bufs.push_back(at::randn({n + 8}));
      std::vector<const float*> ins;
      for (const auto& b : bufs) ins.push_back(b.data_ptr<float>() + off);
      const std::vector<float> want = Reference(ins, divisor, n);
      at::Tensor extra = at::zeros({n + 8});
      // In place into the first input, and into a second buffer.
      std::vector<float*> outs = {bufs[0].data_ptr<float>() + off, extra.data_ptr<float>() + off};
      ReduceToAll(ins.data(), 3, divisor, outs.data(), 2, n);
      for (float* out : outs) {
        EXPECT_EQ(std::memcmp(out, want.data(), sizeof(float) * static_cast<size_t>(n)), 0)
            << "divisor " << divisor << " offset " << off;
      }
    }
  }
}

TEST(StreamingTest, ReduceWithOutputsOfDifferentAlignmentsIsStillRight) {
  const int64_t n = 1001;
  at::Tensor a = at::arange(n + 8, at::kFloat), b = at::full({n + 8}, 2.0f);
  at::Tensor x = at::zeros({n + 8}), y = at::zeros({n + 8});
  std::vector<const float*> ins = {a.data_ptr<float>() + 1, b.data_ptr<float>() + 1};
  std::vector<float*> outs = {x.data_ptr<float>() + 1, y.data_ptr<float>() + 2};
  ReduceToAll(ins.data(), 2, 2.0f, outs.data(), 2, n);
  const at::Tensor want = (a.narrow(0, 1, n) + 2.0f) / 2.0f;
  EXPECT_TRUE(at::equal(x.narrow(0, 1, n), want));
  EXPECT_TRUE(at::equal(y.narrow(0, 2, n), want));
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
