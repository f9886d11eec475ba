// The Gloo communicator and the data-parallel strategy, with every rank a thread of this test
// meeting the others through an in-memory rendezvous store; and the per-rank data sharding.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/fake_rendezvous.h"
#include "worker/trainer/collective/gloo_communicator.h"
#if TRAINYARD_WITH_NCCL
#include "worker/trainer/collective/nccl_communicator.h"
#endif
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

// Connects `world` Gloo ranks (in threads) and returns them by rank.
std::vector<std::unique_ptr<Communicator>> Connect(int world, RendezvousClient& rendezvous,
                                                   absl::Duration timeout = absl::Seconds(20)) {
  std::vector<std::unique_ptr<Communicator>> comms(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.timeout = timeout;
      options.connect_timeout = absl::Seconds(20);
      absl::StatusOr<std::unique_ptr<Communicator>> c =
          NewGlooCommunicator(r, world, rendezvous, options);
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) comms[r] = *std::move(c);
    });
  }
  for (std::thread& t : threads) t.join();
  return comms;
}

// Runs fn(rank) on one thread per rank.
void OnEveryRank(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

TEST(GlooCommunicatorTest, AllReduceSumMeanMaxOverThreeRanks) {
  FakeRendezvous rendezvous;
  auto comms = Connect(3, rendezvous);
  ASSERT_TRUE(comms[2] != nullptr);
  EXPECT_EQ(comms[1]->rank(), 1);
  EXPECT_EQ(comms[1]->world_size(), 3);
  std::vector<torch::Tensor> sums(3), means(3), maxes(3), doubles(3);
  OnEveryRank(3, [&](int r) {
    sums[r] = torch::full({1000}, static_cast<float>(r + 1));
    means[r] = torch::full({7}, static_cast<float>(3 * r));
    maxes[r] = torch::tensor({static_cast<float>(r), static_cast<float>(-r)});
    doubles[r] = torch::full({3}, 0.1 * (r + 1), torch::kDouble);
    // Several in flight at once; they complete in order.
    auto a = comms[r]->AllReduceAsync({sums[r]}, ReduceOp::kSum);
    auto b = comms[r]->AllReduceAsync({means[r], doubles[r]}, ReduceOp::kMean);
    auto c = comms[r]->AllReduceAsync({maxes[r]}, ReduceOp::kMax);
    EXPECT_TRUE(a->Wait().ok());
    EXPECT_TRUE(b->Wait().ok());
    EXPECT_TRUE(c->Wait().ok());
    EXPECT_TRUE(a->Wait().ok());  // idempotent
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(torch::equal(sums[r], torch::full({1000}, 6.0f))) << r;
    EXPECT_TRUE(torch::equal(means[r], torch::full({7}, 3.0f))) << r;
    EXPECT_TRUE(torch::equal(maxes[r], torch::tensor({2.0f, 0.0f}))) << r;
    EXPECT_TRUE(torch::allclose(doubles[r], torch::full({3}, 0.2, torch::kDouble))) << r;
  }
}

TEST(GlooCommunicatorTest, BroadcastAndBarrier) {
  FakeRendezvous rendezvous;
  auto comms = Connect(2, rendezvous);
  ASSERT_TRUE(comms[1] != nullptr);
  std::vector<torch::Tensor> f(2), i(2);
  OnEveryRank(2, [&](int r) {
    f[r] = torch::full({5}, static_cast<float>(r + 10));
    i[r] = torch::full({2}, static_cast<int64_t>(r + 100), torch::kInt64);
    EXPECT_TRUE(comms[r]->Broadcast({f[r], i[r]}, 1).ok());
    EXPECT_TRUE(comms[r]->Barrier().ok());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(f[r], torch::full({5}, 11.0f)));
    EXPECT_TRUE(torch::equal(i[r], torch::full({2}, 101, torch::kInt64)));
  }
}

TEST(GlooCommunicatorTest, RefusesIntegerAllReduce) {
  FakeRendezvous rendezvous;
  auto comms = Connect(1, rendezvous);
  ASSERT_TRUE(comms[0] != nullptr);
  absl::Status status = comms[0]->AllReduce({torch::ones({2}, torch::kInt64)}, ReduceOp::kSum);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooCommunicatorTest, ADeadPeerIsAnErrorNotAHang) {
  FakeRendezvous rendezvous;
  auto comms = Connect(2, rendezvous, absl::Seconds(30));
  ASSERT_TRUE(comms[1] != nullptr);
  comms[1].reset();  // closes its connections, as a killed process would
  const absl::Time start = absl::Now();
  absl::Status status = comms[0]->AllReduce({torch::ones({1 << 16})}, ReduceOp::kSum);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                              absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(status.message(), HasSubstr("all-reduce"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // The group is broken from now on: later collectives fail at once.
  EXPECT_EQ(comms[0]->Barrier().code(), status.code());
}

TEST(GlooCommunicatorTest, AStuckPeerTimesOut) {
  FakeRendezvous rendezvous;
  auto comms = Connect(2, rendezvous, absl::Seconds(1));
  ASSERT_TRUE(comms[1] != nullptr);
  // Rank 1 lives on but never joins the collective.
  absl::Status status = comms[0]->AllReduce({torch::ones({4})}, ReduceOp::kSum);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("collective timeout of 1s"));
}

TEST(GlooCommunicatorTest, MissingPeerAtStartTimesOut) {
  FakeRendezvous rendezvous;
  GlooOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<Communicator>> c = NewGlooCommunicator(0, 2, rendezvous, options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_EQ(NewGlooCommunicator(2, 2, rendezvous, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The communicator's paths: the two-rank exchange (one message and segmented), the ring and
// Gloo's ring for three or more ranks, bit-identical results on every rank, large broadcasts, and
// failures in the middle of a large all-reduce.
bool SameBits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

void CheckSums(int world, const std::vector<int64_t>& counts, torch::Dtype dtype) {
  FakeRendezvous rendezvous;
  auto comms = Connect(world, rendezvous);
  ASSERT_TRUE(comms[world - 1] != nullptr);
  for (int64_t count : counts) {
    std::vector<torch::Tensor> sums(world), means(world), maxes(world);
    OnEveryRank(world, [&](int r) {
      torch::Tensor base = torch::arange(count, torch::TensorOptions().dtype(dtype));
      sums[r] = base * (r + 1) + 0.1 * r;
      means[r] = torch::sin(base + r);
      maxes[r] = torch::cos(base * (r + 1));
      EXPECT_TRUE(comms[r]->AllReduce({sums[r]}, ReduceOp::kSum).ok());
      auto a = comms[r]->AllReduceAsync({means[r]}, ReduceOp::kMean);
      auto b = comms[r]->AllReduceAsync({maxes[r]}, ReduceOp::kMax);
      EXPECT_TRUE(a->Wait().ok());
      EXPECT_TRUE(b->Wait().ok());
    });
    torch::Tensor base = torch::arange(count, torch::TensorOptions().dtype(dtype));
    torch::Tensor sum = torch::zeros_like(base), mean = torch::zeros_like(base);
    torch::Tensor max = torch::full_like(base, -2);
    for (int r = 0; r < world; ++r) {
      sum += base * (r + 1) + 0.1 * r;
      mean += torch::sin(base + r);
      max = torch::maximum(max, torch::cos(base * (r + 1)));
    }
    mean /= world;
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(torch::allclose(sums[r], sum, 1e-5, 1e-3)) << count << " rank " << r;
      EXPECT_TRUE(torch::allclose(means[r], mean, 1e-5, 1e-5)) << count << " rank " << r;
      EXPECT_TRUE(torch::equal(maxes[r], max)) << count << " rank " << r;
      EXPECT_TRUE(SameBits(sums[r], sums[0])) << count << " rank " << r;
      EXPECT_TRUE(SameBits(means[r], means[0])) << count << " rank " << r;
    }
  }
}

// One message, several 256 KiB segments, around the 1 MiB one-message bound, odd lengths.
TEST(GlooCommunicatorPathsTest, TwoRanksFloat) {
  CheckSums(2, {1, 3, 1000, 65536, 262143, 262144, 262145, 1000003}, torch::kFloat);
}
TEST(GlooCommunicatorPathsTest, TwoRanksDouble) {
  CheckSums(2, {1, 131072, 131073, 500001}, torch::kDouble);
}
// Fewer elements than ranks (empty chunks), the ring, and Gloo's ring from 2 MiB.
TEST(GlooCommunicatorPathsTest, ThreeRanks) {
  CheckSums(3, {1, 2, 7, 100000, 524287, 524288, 700001}, torch::kFloat);
}
TEST(GlooCommunicatorPathsTest, FourRanksDouble) {
  CheckSums(4, {5, 99999, 300001}, torch::kDouble);
}

TEST(GlooCommunicatorPathsTest, MaxWithNanIsTheSameOnEveryRank) {
  FakeRendezvous rendezvous;
  auto comms = Connect(2, rendezvous);
  ASSERT_TRUE(comms[1] != nullptr);
  std::vector<torch::Tensor> t(2);
  OnEveryRank(2, [&](int r) {
    const float nan = std::nanf("");
    t[r] = r == 0 ? torch::tensor({nan, 1.0f}) : torch::tensor({1.0f, nan});
    EXPECT_TRUE(comms[r]->AllReduce({t[r]}, ReduceOp::kMax).ok());
  });
  EXPECT_TRUE(SameBits(t[0], t[1]));
}

TEST(GlooCommunicatorPathsTest, NonContiguousTensor) {
  FakeRendezvous rendezvous;
  auto comms = Connect(2, rendezvous);
  ASSERT_TRUE(comms[1] != nullptr);
  std::vector<torch::Tensor> t(2);
  OnEveryRank(2, [&](int r) {
    t[r] = torch::arange(600 * 700, torch::kFloat).reshape({600, 700}).t() * (r + 1);
    ASSERT_FALSE(t[r].is_contiguous());
    EXPECT_TRUE(comms[r]->AllReduce({t[r]}, ReduceOp::kSum).ok());
  });
  torch::Tensor expected = torch::arange(600 * 700, torch::kFloat).reshape({600, 700}).t() * 3;
  EXPECT_TRUE(torch::equal(t[0], expected));
  EXPECT_TRUE(torch::equal(t[1], expected));
}

TEST(GlooCommunicatorPathsTest, BroadcastLargeAndOdd) {
  for (int world : {2, 3}) {
    FakeRendezvous rendezvous;
    auto comms = Connect(world, rendezvous);
    ASSERT_TRUE(comms[world - 1] != nullptr);
    std::vector<torch::Tensor> big(world), odd(world);
    OnEveryRank(world, [&](int r) {
      big[r] = torch::full({3 << 20}, static_cast<float>(r));
      odd[r] = torch::full({13}, static_cast<int8_t>(r), torch::kInt8);
      EXPECT_TRUE(comms[r]->Broadcast({big[r], odd[r]}, world - 1).ok());
      EXPECT_TRUE(comms[r]->Barrier().ok());
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(torch::equal(big[r], torch::full({3 << 20}, static_cast<float>(world - 1))));
      EXPECT_TRUE(torch::equal(odd[r], torch::full({13}, world - 1, torch::kInt8)));
    }
  }
}

TEST(GlooCommunicatorPathsTest, ADeadPeerDuringALargeAllReduce) {
  for (int world : {2, 3}) {
    FakeRendezvous rendezvous;
    auto comms = Connect(world, rendezvous, absl::Seconds(30));
    ASSERT_TRUE(comms[world - 1] != nullptr);
    comms[world - 1].reset();
    const absl::Time start = absl::Now();
    std::vector<absl::Status> status(world - 1);
    OnEveryRank(world - 1, [&](int r) {
      status[r] = comms[r]->AllReduce({torch::ones({4 << 20})}, ReduceOp::kSum);
    });
    for (int r = 0; r < world - 1; ++r) {
      EXPECT_EQ(status[r].code(), absl::StatusCode::kUnavailable) << status[r];
      EXPECT_EQ(comms[r]->Barrier().code(), status[r].code());
    }
    EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  }
}

TEST(GlooCommunicatorPathsTest, AStuckPeerDuringALargeAllReduceTimesOut) {
  FakeRendezvous rendezvous;
  auto comms = Connect(2, rendezvous, absl::Seconds(1));
  ASSERT_TRUE(comms[1] != nullptr);
  const absl::Time start = absl::Now();
  absl::Status status = comms[0]->AllReduce({torch::ones({16 << 20})}, ReduceOp::kSum);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// A peer that takes part in the start of an all-reduce and then stops reading (here: it is done
// with a smaller tensor and idles with its connections open, as a frozen process would) fails
// the collective within the collective timeout as a whole, not per blocked read or write, which
// the kernel restarts whenever a few bytes get through.
TEST(GlooCommunicatorPathsTest, APeerThatStopsMidAllReduceFailsItWithinTheTimeout) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(world);
    FakeRendezvous rendezvous;
    const absl::Duration timeout = absl::Seconds(2);
    auto comms = Connect(world, rendezvous, timeout);
    ASSERT_TRUE(comms[world - 1] != nullptr);
    std::vector<absl::Status> status(world);
    std::vector<absl::Duration> took(world);
    OnEveryRank(world, [&](int r) {
      // Made before the clock starts: filling 256 MB is not the collective's time.
      const torch::Tensor tensor = torch::ones({r == world - 1 ? (256 << 10) : (64 << 20)});
      const absl::Time start = absl::Now();
      status[r] = comms[r]->AllReduce({tensor}, ReduceOp::kSum);
      took[r] = absl::Now() - start;
    });
    // The first rank whose deadline passes (with three ranks, possibly the one with the small
    // tensor, left waiting for the others) shuts its connections down, so a rank whose own
    // deadline is a moment later may see them closed first.
    int timed_out = 0;
    for (int r = 0; r < world; ++r) {
      if (status[r].code() == absl::StatusCode::kDeadlineExceeded) ++timed_out;
    }
    EXPECT_GE(timed_out, 1);
    for (int r = 0; r < world - 1; ++r) {
      EXPECT_THAT(status[r].code(), ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded,
                                                     absl::StatusCode::kUnavailable))
          << status[r];
      EXPECT_LT(took[r], timeout + absl::Milliseconds(900)) << "rank " << r;
    }
  }
}

TEST(GlooCommunicatorPathsTest, AStuckPeerOfThreeTimesOut) {
  FakeRendezvous rendezvous;
  auto comms = Connect(3, rendezvous, absl::Seconds(1));
  ASSERT_TRUE(comms[2] != nullptr);
  std::vector<absl::Status> status(2);
  const absl::Time start = absl::Now();
  OnEveryRank(
      2, [&](int r) { status[r] = comms[r]->AllReduce({torch::ones({100000})}, ReduceOp::kSum); });
  // Whichever rank times out first shuts its connections down; the other may see that first.
  EXPECT_TRUE(status[0].code() == absl::StatusCode::kDeadlineExceeded ||
              status[1].code() == absl::StatusCode::kDeadlineExceeded)
      << status[0] << "; " << status[1];
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(status[r].code(), ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded,
                                                   absl::StatusCode::kUnavailable))
        << status[r];
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

// ---- the data-parallel strategy ----

std::unique_ptr<Model> TinyMlp() {
  trainyard::v1::ModelSpec spec;
  spec.set_builtin("mlp");
  spec.mutable_args()->add_hidden(16);
  spec.mutable_args()->add_hidden(8);
  absl::StatusOr<std::unique_ptr<Model>> model = BuildModel(spec, /*seed=*/7, 6, 3);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// Each rank's gradients after AfterBackward, and the reference: the mean of every rank's own
// gradients computed without communication.
void CheckGradientsAreTheMean(int64_t bucket_bytes, bool overlap, int accumulate) {
  constexpr int kWorld = 2;
  FakeRendezvous rendezvous;
  auto comms = Connect(kWorld, rendezvous);
  ASSERT_TRUE(comms[1] != nullptr);
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::unique_ptr<Model>> references;
  std::vector<torch::Tensor> inputs, labels;
  torch::manual_seed(1);
  for (int r = 0; r < kWorld; ++r) {
    models.push_back(TinyMlp());
    references.push_back(TinyMlp());
    inputs.push_back(torch::randn({4 * accumulate, 6}));
    labels.push_back(torch::randint(0, 3, {4 * accumulate}, torch::kInt64));
  }
  // Reference: plain backward per rank, then the mean.
  std::vector<std::vector<torch::Tensor>> local(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    for (int m = 0; m < accumulate; ++m) {
      torch::Tensor out = references[r]->Forward(inputs[r].narrow(0, 4 * m, 4));
      (torch::nn::functional::cross_entropy(out, labels[r].narrow(0, 4 * m, 4)) / accumulate)
          .backward();
    }
    for (auto& [name, p] : references[r]->NamedParameters()) local[r].push_back(p.grad());
  }
  std::vector<std::unique_ptr<DataParallelStrategy>> strategies(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    strategies[r] =
        std::make_unique<DataParallelStrategy>(std::move(comms[r]), bucket_bytes, overlap);
    ASSERT_TRUE(strategies[r]->Setup(*models[r]).ok());
    ASSERT_TRUE(strategies[r]->SyncState(*models[r], 0).ok());
    for (int m = 0; m < accumulate; ++m) {
      torch::Tensor out = models[r]->Forward(inputs[r].narrow(0, 4 * m, 4));
      strategies[r]->BeforeBackward(m + 1 == accumulate, torch::tensor(r + 1.0, torch::kDouble),
                                    r == 1);
      (torch::nn::functional::cross_entropy(out, labels[r].narrow(0, 4 * m, 4)) / accumulate)
          .backward();
    }
    ASSERT_TRUE(strategies[r]->AfterBackward(*models[r]).ok());
    absl::StatusOr<StepAgreement> agreed = strategies[r]->EndStep();
    ASSERT_TRUE(agreed.ok());
    EXPECT_DOUBLE_EQ(agreed->loss.item<double>(), 1.5);
    EXPECT_TRUE(agreed->stop);
  });
  if (bucket_bytes < 100) {
    EXPECT_GT(strategies[0]->bucket_count(), 3);
  }
  for (int r = 0; r < kWorld; ++r) {
    int i = 0;
    for (auto& [name, p] : models[r]->NamedParameters()) {
      torch::Tensor expected = (local[0][i] + local[1][i]) / 2;
      EXPECT_TRUE(torch::allclose(p.grad(), expected, 1e-6, 1e-7)) << name << " rank " << r;
      ++i;
    }
  }
}

TEST(DataParallelStrategyTest, GradientsAreTheMeanWithManySmallBucketsOverlapped) {
  CheckGradientsAreTheMean(/*bucket_bytes=*/64, /*overlap=*/true, /*accumulate=*/1);
}

TEST(DataParallelStrategyTest, GradientsAreTheMeanWithOneBucketAfterBackward) {
  CheckGradientsAreTheMean(/*bucket_bytes=*/25 << 20, /*overlap=*/false, /*accumulate=*/1);
}

TEST(DataParallelStrategyTest, AccumulatedMicroBatchGradientsAreTheMean) {
  CheckGradientsAreTheMean(/*bucket_bytes=*/64, /*overlap=*/true, /*accumulate=*/3);
}

TEST(DataParallelStrategyTest, SyncStateCopiesRankZeroAndChecksTheStep) {
  FakeRendezvous rendezvous;
  auto comms = Connect(2, rendezvous);
  ASSERT_TRUE(comms[1] != nullptr);
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < 2; ++r) models.push_back(TinyMlp());
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : models[1]->NamedParameters()) p.fill_(42);
  }
  std::vector<absl::Status> second(2);
  std::vector<std::unique_ptr<DataParallelStrategy>> strategies(2);
  OnEveryRank(2, [&](int r) {
    strategies[r] = std::make_unique<DataParallelStrategy>(std::move(comms[r]), 1 << 20, true);
    ASSERT_TRUE(strategies[r]->Setup(*models[r]).ok());
    EXPECT_TRUE(strategies[r]->SyncState(*models[r], 5).ok());
    second[r] = strategies[r]->SyncState(*models[r], r == 0 ? 5 : 6);
  });
  auto p0 = models[0]->NamedParameters();
  auto p1 = models[1]->NamedParameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_TRUE(torch::equal(p0[i].second, p1[i].second)) << p0[i].first;
  }
  EXPECT_TRUE(second[0].ok());
  EXPECT_EQ(second[1].code(), absl::StatusCode::kAborted);
  EXPECT_THAT(second[1].message(), HasSubstr("resumed at step 6, rank 0 at step 5"));
}

// ---- data sharding ----

TEST(ShardingTest, RanksReadDisjointSlicesThatCoverEachEpoch) {
  constexpr int64_t kBatch = 840;  // divisible by 1..8
  StepPlan plan;
  plan.train_samples = 3 * kBatch;
  plan.global_batch_size = kBatch;
  plan.steps_per_epoch = 3;
  plan.total_steps = 6;
  for (int world = 1; world <= 8; ++world) {
    DataOrder order(plan, /*seed=*/11, /*shuffle=*/true);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::set<int64_t> seen;
      int64_t count = 0;
      for (int64_t s = epoch * 3; s < epoch * 3 + 3; ++s) {
        for (int r = 0; r < world; ++r) {
          std::vector<int64_t> batch = order.RankBatch(s, r, world);
          EXPECT_EQ(static_cast<int64_t>(batch.size()), kBatch / world);
          seen.insert(batch.begin(), batch.end());
          count += static_cast<int64_t>(batch.size());
        }
      }
      EXPECT_EQ(count, plan.train_samples) << "world " << world;         // nothing read twice...
      EXPECT_EQ(static_cast<int64_t>(seen.size()), plan.train_samples);  // ...or left out
      EXPECT_EQ(*seen.begin(), 0);
      EXPECT_EQ(*seen.rbegin(), plan.train_samples - 1);
    }
  }
}

TEST(ShardingTest, StableForASeedAndEpochAndIndependentOfWorldSize) {
  StepPlan plan;
  plan.train_samples = 96;
  plan.global_batch_size = 24;
  plan.steps_per_epoch = 4;
  plan.total_steps = 8;
  DataOrder a(plan, 5, true);
  DataOrder b(plan, 5, true);
  DataOrder c(plan, 6, true);
  EXPECT_EQ(a.RankBatch(1, 1, 3), b.RankBatch(1, 1, 3));
  EXPECT_NE(a.RankBatch(1, 1, 3), c.RankBatch(1, 1, 3));
  EXPECT_NE(a.RankBatch(1, 1, 3), a.RankBatch(5, 1, 3));  // another epoch, another order
  // Concatenating the ranks' slices gives the global batch, whatever the world size.
  for (int world : {1, 2, 3, 4, 6}) {
    std::vector<int64_t> joined;
    for (int r = 0; r < world; ++r) {
      std::vector<int64_t> part = b.RankBatch(2, r, world);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    EXPECT_EQ(joined, a.GlobalBatch(2)) << "world " << world;
  }
}

#if TRAINYARD_WITH_NCCL
// The NCCL communicator is built wherever nccl.h and the CUDA runtime are found, GPU or not. On
// a machine without a GPU, joining must end in an error naming the CUDA call that failed, after
// rank 0 has drawn the unique id and shared it through the store; on one with a GPU, a group of
// one connects.
TEST(NcclCommunicatorTest, RankZeroSharesTheIdThenConnectsOrFailsCleanlyWithoutAGpu) {
  FakeRendezvous rendezvous;
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      NewNcclCommunicator(0, 1, rendezvous, absl::Seconds(10), absl::Seconds(10));
  absl::StatusOr<std::string> id = rendezvous.Get("nccl/unique_id", absl::ZeroDuration());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 128u);  // sizeof(ncclUniqueId)
  if (comm.ok()) {
    EXPECT_EQ((*comm)->rank(), 0);
    EXPECT_EQ((*comm)->world_size(), 1);
  } else {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable) << comm.status();
    EXPECT_THAT(comm.status().message(), HasSubstr("cudaStreamCreate"));
  }
}

TEST(NcclCommunicatorTest, RefusesBadRanksAndAMangledId) {
  FakeRendezvous rendezvous;
  EXPECT_EQ(
      NewNcclCommunicator(2, 2, rendezvous, absl::Seconds(1), absl::Seconds(1)).status().code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(rendezvous.Set("nccl/unique_id", "short").ok());
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      NewNcclCommunicator(1, 2, rendezvous, absl::Seconds(1), absl::Seconds(1));
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(comm.status().message(), HasSubstr("wrong size"));
}
#endif  // TRAINYARD_WITH_NCCL

}  // namespace
}  // namespace trainyard::trainer
