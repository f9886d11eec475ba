// The GPU compute check's CPU side: how a product is compared with the CPU's, the memory pattern
// and its verification, their messages; and the whole check run on the CPU, as on a device.

#include "worker/trainer/model/gpu_check.h"

#include <torch/torch.h>

#include <bitset>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

TEST(CompareProductTest, AnExactProductMustMatchEveryElement) {
  const std::vector<double> want = {1, 2, 3, 4, 5, 6};
  const std::vector<double> exact(6, 0.0);
  std::vector<float> got = {1, 2, 3, 4, 5, 6};
  EXPECT_TRUE(CompareProduct(got, want, exact, 3, "product").ok());
  got[5] = 7;
  got[4] = 5.0000005f;
  absl::Status s = CompareProduct(got, want, exact, 3, "integer product");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the integer product differs from the CPU's at 2 of 6 elements; the first, [1, 1]: "
            "5.00000048 against 5");
}

TEST(CompareProductTest, AFloatProductPassesWithinItsBoundAndANanNever) {
  const std::vector<double> want = {1.0, -2.0};
  const std::vector<double> bound = {1e-3, 1e-3};
  double worst = -1;
  EXPECT_TRUE(CompareProduct(std::vector<float>{1.0005f, -2.0f}, want, bound, 2, "p", &worst).ok());
  EXPECT_NEAR(worst, 0.5, 1e-3);
  EXPECT_FALSE(CompareProduct(std::vector<float>{1.002f, -2.0f}, want, bound, 2, "p").ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(CompareProduct(std::vector<float>{1.0f, nan}, want, bound, 2, "p").ok());
  EXPECT_THAT(CompareProduct(std::vector<float>{1.0f}, want, bound, 2, "p").message(),
              HasSubstr("has 1 elements, not 2"));
}

TEST(PatternTest, WordsDifferFromTheirNeighboursAndBySeed) {
  int bits = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    bits += static_cast<int>(std::bitset<32>(PatternWord(i, 7) ^ PatternWord(i + 1, 7)).count());
    EXPECT_NE(PatternWord(i, 7), PatternWord(i, 8));
  }
  // About half of the 32 bits change from one word to the next.
  EXPECT_GT(bits / 1000.0, 12);
  EXPECT_LT(bits / 1000.0, 20);
  EXPECT_EQ(PatternWord(12345, 7), PatternWord(12345, 7));
  EXPECT_NE(PatternWord(uint64_t{1} << 32, 7), PatternWord(0, 7));
}

TEST(PatternTest, TheVerifierFindsAFlippedBitInAnyChunkAndNamesTheFirst) {
  std::vector<int32_t> chunk(100);
  PatternVerifier good(5);
  for (uint64_t first : {0, 100}) {
    for (size_t i = 0; i < chunk.size(); ++i) {
      chunk[i] = static_cast<int32_t>(~PatternWord(first + i, 5));
    }
    good.Check(chunk, first);
  }
  EXPECT_TRUE(good.Result().ok());
  PatternVerifier bad(5);
  chunk[42] ^= 0x10;
  chunk[43] = ~chunk[43];
  bad.Check(chunk, 100);
  absl::Status s = bad.Result();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), absl::StrFormat("memory returned 2 of 100 words wrong; the first, word "
                                         "142: 0x%08x, not 0x%08x",
                                         ~PatternWord(142, 5) ^ 0x10u, ~PatternWord(142, 5)));
}

TEST(RunGpuCheckTest, TheWholeCheckPassesOnTheCpu) {
  GpuCheckOptions options;
  options.exact_size = 64;
  options.float_size = 32;
  options.pattern_bytes = 1 << 20;
  options.chunk_bytes = 100 << 10;  // not a divisor: the last chunk is short
  absl::StatusOr<std::string> summary = RunGpuCheck(torch::Device(torch::kCPU), options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(*summary, HasSubstr("GPU check passed on cpu"));
  EXPECT_THAT(*summary, HasSubstr("64^3 integer product exact"));
  EXPECT_THAT(*summary, HasSubstr("1 MiB pattern read back intact"));
}

TEST(RunGpuCheckTest, WithoutCudaTheMainCheckRunsNothingAndSaysSo) {
  if (torch::cuda::is_available()) {
    GTEST_SKIP() << "CUDA is here: scripts/gpu-check.sh (item gpu_health) runs the check itself";
  }
  ::testing::internal::CaptureStdout();
  const int code = GpuCheckMain(0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, kExitInternal);
  EXPECT_EQ(out, "GPU check not run: this trainer's LibTorch has no CUDA\n");
}

}  // namespace
}  // namespace trainyard::trainer
