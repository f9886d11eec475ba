#ifndef TRAINYARD_WORKER_TRAINER_MODEL_GPU_CHECK_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_GPU_CHECK_H_

// The compute check the worker agent runs on a GPU before it gives the GPU out
// (`trainyard-trainer --gpu_check=N`): known matrix products computed on the GPU and compared with
// the CPU's, and a pattern written over part of its memory, inverted there and read back. A few
// seconds at most, most of them CUDA's start.

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace trainyard::trainer {

struct GpuCheckOptions {
  // An n x n x n product of small integers, exact in float32 whatever the order of the sums.
  int64_t exact_size = 1024;
  // An n x n x n product of fractions in [-1, 1], within a tolerance of the CPU's.
  int64_t float_size = 512;
  int64_t pattern_bytes = int64_t{256} << 20;  // written, inverted on the device, read back
  int64_t chunk_bytes = int64_t{16} << 20;     // host memory the pattern passes through
};

// Runs the check on `device` (a CPU works too: the tests run it there). Its one-line summary when
// it passes; FAILED_PRECONDITION with the reason when the device got a product wrong, returned
// other than the pattern, or failed an operation (a CUDA error: its first line).
absl::StatusOr<std::string> RunGpuCheck(const torch::Device& device,
                                        const GpuCheckOptions& options = GpuCheckOptions());

// `--gpu_check=index`: runs the check on CUDA device `index`, prints one line (the summary, or
// why it failed) and returns the exit code: kExitOk when it passed; kExitInfrastructure when the
// GPU failed it, or CUDA sees no GPU where this LibTorch has CUDA; kExitInternal when this
// LibTorch has no CUDA (nothing checked) or there is no device `index`.
int GpuCheckMain(int index);

// ---- the CPU's side, exposed for tests ----

// Compares `got` (a product the device computed, row-major with `cols` columns) with `want` (the
// CPU's, in double): each element must be within `bound` of it (the same index; 0: exact). OK,
// or FAILED_PRECONDITION naming `what`, how many elements differ and the first of them.
// `worst`, when given, is set to the largest |got - want| / bound over elements with a bound > 0.
absl::Status CompareProduct(absl::Span<const float> got, absl::Span<const double> want,
                            absl::Span<const double> bound, int64_t cols, const std::string& what,
                            double* worst = nullptr);

// The pattern's word at `index` for `seed`: a mix of both that differs from its neighbours in
// about half its bits, so that stuck, swapped or aliased words show.
uint32_t PatternWord(uint64_t index, uint32_t seed);

// Counts, over chunks read back, the words that differ from the inverted pattern.
class PatternVerifier {
 public:
  explicit PatternVerifier(uint32_t seed) : seed_(seed) {}
  // `got` holds the words from index `first` on, as read back after the device inverted them.
  void Check(absl::Span<const int32_t> got, uint64_t first);
  // OK when every word checked matched, else FAILED_PRECONDITION with the count and the first.
  absl::Status Result() const;

 private:
  const uint32_t seed_;
  uint64_t checked_ = 0;
  uint64_t mismatches_ = 0;
  uint64_t first_bad_ = 0;
  uint32_t first_expected_ = 0;
  uint32_t first_got_ = 0;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_GPU_CHECK_H_
