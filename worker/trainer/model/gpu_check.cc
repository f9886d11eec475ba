#include "worker/trainer/model/gpu_check.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/exit_codes.h"

namespace trainyard::trainer {
namespace {

// SplitMix64: the check's inputs are the same on every machine and every run, whatever LibTorch's
// own generators do.
uint64_t Next(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

torch::Tensor HostMatrix(int64_t n, uint64_t seed, bool integers) {
  torch::Tensor m = torch::empty({n, n}, torch::kFloat32);
  float* data = m.data_ptr<float>();
  uint64_t state = seed;
  for (int64_t i = 0; i < n * n; ++i) {
    const uint64_t r = Next(state);
    data[i] = integers ? static_cast<float>(static_cast<int64_t>(r % 17) - 8)
                       : static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-52 - 1.0);
  }
  return m;
}

template <typename T>
absl::Span<const T> Span(const torch::Tensor& t) {
  return absl::Span<const T>(t.data_ptr<T>(), static_cast<size_t>(t.numel()));
}

// One product on `device` against the CPU's (in double); `tolerance` 0 wants it exact, else each
// element within tolerance x sum_k |a_ik b_kj|, the scale of the sum's rounding.
absl::Status CheckProduct(const torch::Device& device, int64_t n, bool integers, double tolerance,
                          const std::string& what, double* worst) {
  const torch::Tensor a = HostMatrix(n, integers ? 1 : 3, integers);
  const torch::Tensor b = HostMatrix(n, integers ? 2 : 4, integers);
  const torch::Tensor want = a.to(torch::kFloat64).matmul(b.to(torch::kFloat64)).contiguous();
  torch::Tensor bound = torch::zeros_like(want);
  if (tolerance > 0) {
    bound =
        (a.abs().to(torch::kFloat64).matmul(b.abs().to(torch::kFloat64)) * tolerance).contiguous();
  }
  const torch::Tensor got = a.to(device).matmul(b.to(device)).to(torch::kCPU).contiguous();
  return CompareProduct(Span<float>(got), Span<double>(want), Span<double>(bound), n, what, worst);
}

absl::Status CheckPattern(const torch::Device& device, const GpuCheckOptions& options) {
  constexpr uint32_t kSeed = 0x7a11ba2d;
  const int64_t words = options.pattern_bytes / 4;
  const int64_t chunk = std::max<int64_t>(1, options.chunk_bytes / 4);
  torch::Tensor buffer =
      torch::empty({words}, torch::TensorOptions().dtype(torch::kInt32).device(device));
  std::vector<int32_t> host(static_cast<size_t>(std::min(chunk, words)));
  for (int64_t first = 0; first < words; first += chunk) {
    const int64_t n = std::min(chunk, words - first);
    for (int64_t i = 0; i < n; ++i) {
      host[i] = static_cast<int32_t>(PatternWord(static_cast<uint64_t>(first + i), kSeed));
    }
    // From pageable memory the copy has ended when copy_ returns: the buffer is free again.
    buffer.slice(0, first, first + n).copy_(torch::from_blob(host.data(), {n}, torch::kInt32));
  }
  // Read, changed and written again by the device itself, not only by copies.
  buffer.bitwise_not_();
  PatternVerifier verifier(kSeed);
  for (int64_t first = 0; first < words; first += chunk) {
    const int64_t n = std::min(chunk, words - first);
    const torch::Tensor back = buffer.slice(0, first, first + n).to(torch::kCPU).contiguous();
    verifier.Check(Span<int32_t>(back), static_cast<uint64_t>(first));
  }
  return verifier.Result();
}

std::string FirstLine(const char* text) {
  std::string s(text);
  const size_t end = s.find('\n');
  return end == std::string::npos ? s : s.substr(0, end);
}

// Whether this process has LibTorch's CUDA library (the trainer links it whenever LibTorch has
// it), which CUDA's absence of devices does not say.
bool LibTorchHasCuda() {
  void* handle = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

}  // namespace

absl::Status CompareProduct(absl::Span<const float> got, absl::Span<const double> want,
                            absl::Span<const double> bound, int64_t cols, const std::string& what,
                            double* worst) {
  if (got.size() != want.size() || bound.size() != want.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", what, " has ", got.size(), " elements, not ", want.size()));
  }
  size_t bad = 0;
  size_t first = 0;
  double largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    // NaN compares false: it fails the test as it must.
    if (!(error <= bound[i])) {
      if (bad++ == 0) first = i;
      continue;
    }
    if (bound[i] > 0) largest = std::max(largest, error / bound[i]);
  }
  if (worst != nullptr) *worst = largest;
  if (bad == 0) return absl::OkStatus();
  const int64_t row = cols > 0 ? static_cast<int64_t>(first) / cols : 0;
  const int64_t col = cols > 0 ? static_cast<int64_t>(first) % cols : 0;
  return absl::FailedPreconditionError(absl::StrFormat(
      "the %s differs from the CPU's at %d of %d elements; the first, [%d, %d]: %.9g against "
      "%.9g",
      what, bad, got.size(), row, col, got[first], want[first]));
}

uint32_t PatternWord(uint64_t index, uint32_t seed) {
  // MurmurHash3's 32-bit finaliser of the index and the seed.
  uint32_t h = static_cast<uint32_t>(index) ^ static_cast<uint32_t>(index >> 32) * 0x9e3779b9u;
  h ^= seed;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

void PatternVerifier::Check(absl::Span<const int32_t> got, uint64_t first) {
  for (size_t i = 0; i < got.size(); ++i) {
    const uint32_t expected = ~PatternWord(first + i, seed_);
    const auto word = static_cast<uint32_t>(got[i]);
    if (word != expected) {
      if (mismatches_++ == 0) {
        first_bad_ = first + i;
        first_expected_ = expected;
        first_got_ = word;
      }
    }
  }
  checked_ += got.size();
}

absl::Status PatternVerifier::Result() const {
  if (mismatches_ == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "memory returned %d of %d words wrong; the first, word %d: 0x%08x, not 0x%08x", mismatches_,
      checked_, first_bad_, first_got_, first_expected_));
}

absl::StatusOr<std::string> RunGpuCheck(const torch::Device& device,
                                        const GpuCheckOptions& options) {
  const auto start = MonotonicNow();
  double float_worst = 0;
  // float32 sums of n products round by about sqrt(n) x 2^-24 of the scale sum |a b| (1e-6 at
  // n = 512); 1e-3 holds even TF32's products (2^-11 each) and still catches any error above the
  // tenth bit. The integer product must be exact.
  constexpr double kFloatTolerance = 1e-3;
  try {
    torch::NoGradGuard no_grad;
    const std::string exact = absl::StrCat(options.exact_size, "^3 integer product");
    const std::string fractions = absl::StrCat(options.float_size, "^3 float product");
    if (absl::Status s = CheckProduct(device, options.exact_size, true, 0, exact, nullptr);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckProduct(device, options.float_size, false, kFloatTolerance, fractions,
                                      &float_worst);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckPattern(device, options); !s.ok()) return s;
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(FirstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(FirstLine(e.what()));
  }
  return absl::StrFormat(
      "GPU check passed on %s in %.2f s: %d^3 integer product exact, %d^3 float product within "
      "%.3g of the CPU's (its largest error %.2g of that), %d MiB pattern read back intact",
      device.str(), SecondsSince(start), options.exact_size, options.float_size, kFloatTolerance,
      float_worst, options.pattern_bytes >> 20);
}

int GpuCheckMain(int index) {
  auto say = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  if (!torch::cuda::is_available()) {
    if (!LibTorchHasCuda()) {
      say("GPU check not run: this trainer's LibTorch has no CUDA");
      return kExitInternal;
    }
    say("CUDA sees no GPU");
    return kExitInfrastructure;
  }
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  if (index < 0 || index >= count) {
    say(absl::StrCat("GPU check not run: no CUDA device ", index, " (", count, " visible)"));
    return kExitInternal;
  }
  absl::StatusOr<std::string> result = RunGpuCheck(torch::Device(torch::kCUDA, index));
  if (result.ok()) {
    say(*result);
    return kExitOk;
  }
  say(std::string(result.status().message()));
  return absl::IsFailedPrecondition(result.status()) ? kExitInfrastructure : kExitInternal;
}

}  // namespace trainyard::trainer
