// The flight record a trainer keeps: the recording communicator against a scripted communicator
// (numbering, bytes, ends and failures, nothing changed of what it wraps), and whole runs with
// every rank a thread (data-parallel and a pipeline), each with its own record.

#include "worker/trainer/collective/recording_communicator.h"

#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/flight_record.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/common/flight_record_queries.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/test_tasks.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/collective/communicator.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {
namespace {

// A communicator that writes each call into `log` and answers with the status `next` says for
// it (OK unless a test sets one). Its Works log their Wait.
class ScriptedCommunicator final : public Communicator {
 public:
  explicit ScriptedCommunicator(std::vector<std::string>& log) : log_(log) {}
  int rank() const override { return 3; }
  int world_size() const override { return 4; }
  std::string backend() const override { return "scripted"; }

  std::unique_ptr<Work> AllReduceAsync(std::vector<torch::Tensor> tensors, ReduceOp) override {
    log_.push_back(absl::StrCat("all-reduce-async ", tensors.size()));
    return std::make_unique<LoggedWork>(log_, "all-reduce", Next());
  }
  absl::Status AllReduce(std::vector<torch::Tensor> tensors, ReduceOp) override {
    log_.push_back(absl::StrCat("all-reduce ", tensors.size()));
    return Next();
  }
  absl::Status Broadcast(std::vector<torch::Tensor> tensors, int root) override {
    log_.push_back(absl::StrCat("broadcast ", tensors.size(), " from ", root));
    return Next();
  }
  absl::Status Barrier() override {
    log_.push_back("barrier");
    return Next();
  }
  std::unique_ptr<Work> SendAsync(torch::Tensor tensor, int peer) override {
    log_.push_back(absl::StrCat("send ", tensor.numel(), " to ", peer));
    return std::make_unique<LoggedWork>(log_, "send", Next());
  }
  absl::Status Recv(torch::Tensor tensor, int peer) override {
    log_.push_back(absl::StrCat("receive ", tensor.numel(), " from ", peer));
    tensor.fill_(peer);
    return Next();
  }

  absl::Status next = absl::OkStatus();  // the next call's; then OK again

 private:
  class LoggedWork final : public Work {
   public:
    LoggedWork(std::vector<std::string>& log, std::string what, absl::Status status)
        : log_(log), what_(std::move(what)), status_(std::move(status)) {}
    absl::Status Wait() override {
      log_.push_back("wait " + what_);
      return status_;
    }

   private:
    std::vector<std::string>& log_;
    const std::string what_;
    const absl::Status status_;
  };

  absl::Status Next() { return std::exchange(next, absl::OkStatus()); }

  std::vector<std::string>& log_;
};

struct Recorded {
  explicit Recorded(RecordingOptions options = {}) {
    auto scripted = std::make_unique<ScriptedCommunicator>(log);
    inner = scripted.get();
    communicator = WithRecorder(std::move(scripted), recorder.get(), std::move(options));
  }
  std::vector<CollectiveEntry> Entries() const { return recorder->Snapshot().recent; }

  FakeClock clock;
  std::unique_ptr<FlightRecorder> recorder = FlightRecorder::InMemory(clock);
  std::vector<std::string> log;
  ScriptedCommunicator* inner = nullptr;
  std::unique_ptr<Communicator> communicator;
};

TEST(RecordingCommunicatorTest, NumbersCollectivesWithTheirBytesAndEndsThemWhenTheyReturn) {
  Recorded r;
  EXPECT_EQ(r.communicator->rank(), 3);
  EXPECT_EQ(r.communicator->world_size(), 4);
  EXPECT_EQ(r.communicator->backend(), "scripted");
  const int64_t start = absl::ToUnixMillis(r.clock.Now());
  // 3 floats and 5 doubles: 12 + 40 bytes.
  std::unique_ptr<Work> work = r.communicator->AllReduceAsync(
      {torch::zeros({3}), torch::zeros({5}, torch::kDouble)}, ReduceOp::kSum);
  r.clock.Advance(absl::Milliseconds(10));
  EXPECT_TRUE(r.communicator->Broadcast({torch::zeros({2, 2}, torch::kInt64)}, 1).ok());
  EXPECT_TRUE(r.communicator->Barrier().ok());
  EXPECT_TRUE(r.communicator->AllReduce({torch::zeros({4})}, ReduceOp::kMean).ok());

  std::vector<CollectiveEntry> entries = r.Entries();
  ASSERT_EQ(entries.size(), 4u);
  const std::vector<CollectiveKind> kinds = {CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                                             CollectiveKind::kBarrier, CollectiveKind::kAllReduce};
  const std::vector<int64_t> bytes = {52, 32, 0, 16};
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i].seq, static_cast<int64_t>(i) + 1) << i;
    EXPECT_EQ(entries[i].kind, kinds[i]) << i;
    EXPECT_EQ(entries[i].peer, -1) << i;
    EXPECT_EQ(entries[i].bytes, bytes[i]) << i;
    EXPECT_FALSE(entries[i].failed) << i;
  }
  EXPECT_EQ(entries[0].started_unix_ms, start);
  EXPECT_EQ(entries[0].ended_unix_ms, 0);  // issued, not yet waited for
  EXPECT_EQ(entries[1].ended_unix_ms, start + 10);
  EXPECT_EQ(entries[3].ended_unix_ms, start + 10);

  // The Work ends its entry at its first Wait only.
  r.clock.Advance(absl::Milliseconds(5));
  EXPECT_TRUE(work->Wait().ok());
  r.clock.Advance(absl::Milliseconds(5));
  EXPECT_TRUE(work->Wait().ok());
  entries = r.Entries();
  EXPECT_EQ(entries[0].ended_unix_ms, start + 15);
  EXPECT_FALSE(entries[0].failed);

  // Every call reached the wrapped communicator, in its order, each Wait too.
  EXPECT_EQ(r.log,
            (std::vector<std::string>{"all-reduce-async 2", "broadcast 1 from 1", "barrier",
                                      "all-reduce 1", "wait all-reduce", "wait all-reduce"}));
}

TEST(RecordingCommunicatorTest, FailuresAreMarkedAndTheirStatusesPassedOn) {
  Recorded r;
  r.inner->next = absl::DeadlineExceededError("broadcast timed out");
  EXPECT_EQ(r.communicator->Broadcast({torch::zeros({1})}, 0).code(),
            absl::StatusCode::kDeadlineExceeded);
  r.inner->next = absl::UnavailableError("peer gone");
  std::unique_ptr<Work> work = r.communicator->AllReduceAsync({torch::zeros({1})}, ReduceOp::kSum);
  EXPECT_EQ(work->Wait().code(), absl::StatusCode::kUnavailable);
  r.inner->next = absl::UnavailableError("peer gone");
  EXPECT_EQ(r.communicator->Recv(torch::zeros({1}), 2).code(), absl::StatusCode::kUnavailable);
  r.inner->next = absl::DeadlineExceededError("barrier timed out");
  EXPECT_EQ(r.communicator->Barrier().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(r.communicator->AllReduce({torch::zeros({1})}, ReduceOp::kSum).ok());

  const std::vector<CollectiveEntry> entries = r.Entries();
  ASSERT_EQ(entries.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(entries[i].failed) << i;
    EXPECT_NE(entries[i].ended_unix_ms, 0) << i;
  }
  EXPECT_FALSE(entries[4].failed);
}

TEST(RecordingCommunicatorTest, NumbersMessagesPerPeerAndDirectionAndHoldsBeforeEachSend) {
  std::vector<std::pair<int, int64_t>> holds;
  Recorded* recorded = nullptr;
  RecordingOptions options;
  options.before_send = [&](int peer, int64_t send) {
    holds.emplace_back(peer, send);
    // Called before the send is recorded or reaches the communicator: the earlier sends alone
    // are.
    EXPECT_EQ(recorded->recorder->Snapshot().recent.size(), static_cast<size_t>(send - 1));
    recorded->log.push_back(absl::StrCat("hold ", send));
  };
  Recorded r(options);
  recorded = &r;
  std::vector<std::unique_ptr<Work>> sends;
  sends.push_back(r.communicator->SendAsync(torch::zeros({4}), 1));
  sends.push_back(r.communicator->SendAsync(torch::zeros({8}), 1));
  sends.push_back(r.communicator->SendAsync(torch::zeros({2}), 2));
  torch::Tensor in = torch::zeros({3}, torch::kDouble);
  ASSERT_TRUE(r.communicator->Recv(in, 1).ok());
  EXPECT_TRUE(torch::equal(in, torch::ones({3}, torch::kDouble)));  // the wrapped one's message
  ASSERT_TRUE(r.communicator->Recv(torch::zeros({1}), 1).ok());
  for (const std::unique_ptr<Work>& send : sends) ASSERT_TRUE(send->Wait().ok());

  EXPECT_EQ(holds, (std::vector<std::pair<int, int64_t>>{{1, 1}, {1, 2}, {2, 3}}));
  const std::vector<CollectiveEntry> entries = r.Entries();
  ASSERT_EQ(entries.size(), 5u);
  struct Expected {
    CollectiveKind kind;
    int peer;
    int64_t seq;
    int64_t bytes;
  };
  const std::vector<Expected> expected = {{CollectiveKind::kSend, 1, 1, 16},
                                          {CollectiveKind::kSend, 1, 2, 32},
                                          {CollectiveKind::kSend, 2, 1, 8},
                                          {CollectiveKind::kRecv, 1, 1, 24},
                                          {CollectiveKind::kRecv, 1, 2, 4}};
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i].kind, expected[i].kind) << i;
    EXPECT_EQ(entries[i].peer, expected[i].peer) << i;
    EXPECT_EQ(entries[i].seq, expected[i].seq) << i;
    EXPECT_EQ(entries[i].bytes, expected[i].bytes) << i;
    EXPECT_NE(entries[i].ended_unix_ms, 0) << i;
  }
  EXPECT_EQ(r.log,
            (std::vector<std::string>{"hold 1", "send 4 to 1", "hold 2", "send 8 to 1", "hold 3",
                                      "send 2 to 2", "receive 3 from 1", "receive 1 from 1",
                                      "wait send", "wait send", "wait send"}));
}

TEST(RecordingCommunicatorTest, WithoutARecorderTheCommunicatorIsItself) {
  std::vector<std::string> log;
  auto scripted = std::make_unique<ScriptedCommunicator>(log);
  Communicator* raw = scripted.get();
  EXPECT_EQ(WithRecorder(std::move(scripted), nullptr).get(), raw);
  FakeClock clock;
  std::unique_ptr<FlightRecorder> recorder = FlightRecorder::InMemory(clock);
  EXPECT_EQ(WithRecorder(nullptr, recorder.get()), nullptr);
}

// ---- whole runs: RunTrainer on every rank, each with its own record ----

// Phases seen from the trainer's hooks, per rank.
struct Seen {
  absl::Mutex mu;
  std::vector<std::vector<RankPhase>> phases ABSL_GUARDED_BY(mu);
  std::vector<std::vector<int64_t>> data_waits ABSL_GUARDED_BY(mu);
};

// Each rank's entries all ended well; collectives numbered alike on every rank.
void ExpectWholeRecords(const std::vector<std::unique_ptr<FlightRecorder>>& recorders,
                        int64_t steps) {
  for (size_t r = 0; r < recorders.size(); ++r) {
    const FlightRecordSnapshot record = recorders[r]->Snapshot();
    EXPECT_EQ(record.phase, RankPhase::kFinishing) << r;
    EXPECT_EQ(record.step, steps) << r;
    EXPECT_FALSE(record.recent.empty()) << r;
    for (const CollectiveEntry& e : record.recent) {
      EXPECT_NE(e.ended_unix_ms, 0)
          << "rank " << r << " " << CollectiveKindName(e.kind) << " #" << e.seq;
      EXPECT_FALSE(e.failed) << r;
    }
    EXPECT_EQ(LastCollective(record), LastCollective(recorders[0]->Snapshot())) << r;
  }
}

TEST(TrainerFlightRecordTest, DataParallelRanksRecordTheirPhasesStepsAndAllReduces) {
  const std::string dir = test_files::MakeTempDir();
  trainyard::v1::Task task = test_tasks::SingleRankTask("fr", dir + "/ckpt");
  auto& spec = *task.mutable_spec();
  spec.set_strategy(trainyard::v1::DATA_PARALLEL);
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(8);
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(80);
  synthetic.set_features(4);
  synthetic.set_classes(2);
  spec.mutable_data()->set_validation_split(0.2f);
  spec.set_batch_size(8);
  spec.set_max_steps(6);
  spec.set_log_every_steps(3);
  spec.mutable_checkpoint()->set_every_steps(3);
  spec.set_collective_timeout_seconds(30);
  constexpr int kRanks = 2;
  std::vector<std::unique_ptr<FlightRecorder>> recorders;
  for (int r = 0; r < kRanks; ++r) recorders.push_back(FlightRecorder::InMemory(RealClock::Get()));
  Seen seen;
  {
    absl::MutexLock lock(&seen.mu);
    seen.phases.resize(kRanks);
    seen.data_waits.resize(kRanks);
  }
  std::vector<absl::StatusOr<TrainResult>> results =
      test_util::RunRanks(task, kRanks, [&](int rank, TrainerOptions& options) {
        FlightRecorder* recorder = recorders[static_cast<size_t>(rank)].get();
        options.recorder = recorder;
        options.in_data_wait = [&seen, recorder, rank](int64_t step, int64_t start) {
          absl::MutexLock lock(&seen.mu);
          seen.phases[static_cast<size_t>(rank)].push_back(recorder->Snapshot().phase);
          seen.data_waits[static_cast<size_t>(rank)].push_back(step - start);
          EXPECT_EQ(recorder->Snapshot().step, step);
        };
        options.after_step = [&seen, recorder, rank](int64_t step) {
          absl::MutexLock lock(&seen.mu);
          seen.phases[static_cast<size_t>(rank)].push_back(recorder->Snapshot().phase);
          EXPECT_EQ(recorder->Snapshot().step, step);
        };
      });
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(results[r].ok()) << r << results[r].status();
  ExpectWholeRecords(recorders, 6);
  absl::MutexLock lock(&seen.mu);
  for (int r = 0; r < kRanks; ++r) {
    // Before each update's batch in the data phase; after it (the gradients' all-reduce waited
    // for, the step agreed) still in the optimizer's.
    std::vector<RankPhase> expected;
    for (int s = 0; s < 6; ++s) {
      expected.push_back(RankPhase::kData);
      expected.push_back(RankPhase::kOptimizer);
    }
    EXPECT_EQ(seen.phases[static_cast<size_t>(r)], expected) << r;
    EXPECT_EQ(seen.data_waits[static_cast<size_t>(r)], (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  }
  // The gradients travel in all-reduces of the model's bytes: 4 x 8 + 8 + 8 x 2 + 2 floats.
  bool gradients = false;
  for (const CollectiveEntry& e : recorders[1]->Snapshot().recent) {
    gradients = gradients || (e.kind == CollectiveKind::kAllReduce && e.bytes >= 58 * 4);
  }
  EXPECT_TRUE(gradients);
}

// Token shards of a short text: 600 ids below 32.
std::string WriteTokens() {
  const std::string dir = test_files::MakeTempDir();
  const torch::Tensor ids = (torch::arange(600) % 28).to(torch::kUInt8);
  const std::string bytes = *EncodeTensors({{"tokens", ids}}, {});
  std::FILE* f = std::fopen((dir + "/text-0.safetensors").c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return dir;
}

TEST(TrainerFlightRecordTest, PipelineStagesRecordTheirMessagesAndHoldBeforeSendsInTheirPasses) {
  const std::string data = WriteTokens();
  trainyard::v1::Task task = test_tasks::SingleRankTask("frp", "");
  auto& spec = *task.mutable_spec();
  spec.set_strategy(trainyard::v1::PIPELINE);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_pipeline()->set_schedule("1f1b");
  spec.mutable_workers()->set_min(2);
  spec.mutable_workers()->set_max(2);
  spec.mutable_model()->set_builtin("transformer");
  auto& args = *spec.mutable_model()->mutable_args();
  args.add_vocab(32);
  args.set_context(8);
  args.set_layers(2);
  args.set_dim(16);
  args.set_heads(2);
  args.set_tie_embeddings(false);  // no messages between the stages after the passes
  spec.mutable_data()->set_tokens(data + "/text-*.safetensors");
  spec.set_batch_size(4);
  spec.set_max_steps(5);
  spec.set_collective_timeout_seconds(30);
  constexpr int kRanks = 2;
  std::vector<std::unique_ptr<FlightRecorder>> recorders;
  for (int r = 0; r < kRanks; ++r) recorders.push_back(FlightRecorder::InMemory(RealClock::Get()));
  absl::Mutex mu;
  std::vector<std::vector<int64_t>> sends(kRanks);
  std::vector<absl::StatusOr<TrainResult>> results =
      test_util::RunRanks(task, kRanks, [&](int rank, TrainerOptions& options) {
        FlightRecorder* recorder = recorders[static_cast<size_t>(rank)].get();
        options.recorder = recorder;
        options.before_send = [&, recorder, rank](int peer, int64_t send) {
          // Stage 0 sends activations forward, stage 1 gradients back.
          EXPECT_EQ(peer, 1 - rank);
          EXPECT_EQ(recorder->Snapshot().phase,
                    rank == 0 ? RankPhase::kForward : RankPhase::kBackward);
          absl::MutexLock lock(&mu);
          sends[static_cast<size_t>(rank)].push_back(send);
        };
      });
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(results[r].ok()) << r << results[r].status();
  ExpectWholeRecords(recorders, 5);
  const FlightRecordSnapshot first = recorders[0]->Snapshot();
  const FlightRecordSnapshot second = recorders[1]->Snapshot();
  absl::MutexLock lock(&mu);
  for (int r = 0; r < kRanks; ++r) {
    // Numbered 1, 2, ... in order: 2 micro-batches of 5 updates, and the first micro-batch's
    // shape first on stage 0.
    const std::vector<int64_t>& numbers = sends[static_cast<size_t>(r)];
    ASSERT_EQ(numbers.size(), r == 0 ? 11u : 10u) << r;
    for (size_t i = 0; i < numbers.size(); ++i) EXPECT_EQ(numbers[i], static_cast<int64_t>(i) + 1);
  }
  // Send #k to a peer is its receive #k from this rank.
  EXPECT_EQ(LastSent(first, 1), 11);
  EXPECT_EQ(LastReceived(second, 0), 11);
  EXPECT_EQ(LastSent(second, 0), 10);
  EXPECT_EQ(LastReceived(first, 1), 10);
}

}  // namespace
}  // namespace trainyard::trainer
