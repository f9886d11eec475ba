#include "worker/trainer/collective/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/trainer/collective/nccl_calls.h"

namespace trainyard::trainer {
namespace {

constexpr char kUniqueIdKey[] = "nccl/unique_id";
constexpr absl::Duration kPollInterval = absl::Microseconds(200);

// A call outside any communicator (ncclGetUniqueId): only ncclSuccess is success.
absl::Status FromNccl(ncclResult_t result, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(result)));
}

absl::Status FromCuda(cudaError_t result, absl::string_view what) {
  if (result == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(result)));
}

// Waits for `event`, recorded on the stream after a collective NCCL had taken (NcclCalls::Settle),
// watching the communicator meanwhile: a peer lost, or a deadline passed, aborts it, since NCCL
// cannot cancel a single collective.
absl::Status AwaitEvent(NcclCalls& calls, absl::Time deadline, absl::Duration timeout,
                        absl::string_view op, cudaEvent_t event) {
  while (true) {
    const cudaError_t query = cudaEventQuery(event);
    if (query != cudaSuccess && query != cudaErrorNotReady) {
      calls.Abort();
      return FromCuda(query, op);
    }
    if (absl::Status state = calls.Poll(op); !state.ok()) return state;
    if (query == cudaSuccess) return absl::OkStatus();
    if (RealClock::Get().Now() > deadline) {
      calls.Abort();
      return absl::DeadlineExceededError(
          absl::StrCat(op, ": a peer did not respond within the collective timeout of ",
                       absl::FormatDuration(timeout), " (collective_timeout)"));
    }
    RealClock::Get().SleepFor(kPollInterval);
  }
}

class NcclWork final : public Work {
 public:
  NcclWork(NcclCalls* calls, cudaEvent_t event, absl::Time deadline, absl::Duration timeout,
           absl::Status* broken)
      : calls_(calls), event_(event), deadline_(deadline), timeout_(timeout), broken_(broken) {}
  explicit NcclWork(absl::Status status) : status_(std::move(status)), done_(true) {}
  ~NcclWork() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }

  absl::Status Wait() override {
    if (done_) return status_;
    done_ = true;
    if (!broken_->ok()) {
      status_ = *broken_;
      return status_;
    }
    status_ = AwaitEvent(*calls_, deadline_, timeout_, "all-reduce", event_);
    if (!status_.ok()) *broken_ = status_;
    return status_;
  }

 private:
  NcclCalls* calls_ = nullptr;
  cudaEvent_t event_ = nullptr;
  absl::Time deadline_;
  absl::Duration timeout_;
  absl::Status* broken_ = nullptr;
  absl::Status status_;
  bool done_ = false;
};

absl::StatusOr<ncclDataType_t> NcclType(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return ncclFloat32;
    case torch::kDouble:
      return ncclFloat64;
    case torch::kHalf:
      return ncclFloat16;
    default:
      return absl::InvalidArgumentError("all-reduce: NCCL reduces float16/32/64 CUDA tensors");
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world_size, ncclComm_t comm, cudaStream_t stream,
                   absl::Duration timeout)
      : rank_(rank),
        world_size_(world_size),
        comm_(comm),
        stream_(stream),
        timeout_(timeout),
        calls_(RealNcclApi()) {
    calls_.set_comm(comm);
  }

  // A non-blocking communicator is finalized (its state in progress until every peer is done
  // with it) before it is destroyed; one that failed was aborted, which freed it.
  ~NcclCommunicator() override {
    if (broken_.ok() && !calls_.aborted()) {
      cudaStreamSynchronize(stream_);
      absl::Status finalized = calls_.Settle(ncclCommFinalize(comm_), "ncclCommFinalize",
                                             RealClock::Get().Now() + timeout_);
      if (finalized.ok()) {
        ncclCommDestroy(comm_);
      } else {
        LogWarning("nccl: ", finalized.ToString());
      }
    }
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }

  std::unique_ptr<Work> AllReduceAsync(std::vector<torch::Tensor> tensors, ReduceOp op) override {
    if (!broken_.ok()) return std::make_unique<NcclWork>(broken_);
    for (const torch::Tensor& t : tensors) {
      if (!t.is_cuda() || !t.is_contiguous() || !NcclType(t).ok()) {
        return std::make_unique<NcclWork>(absl::InvalidArgumentError(
            "all-reduce: NCCL reduces contiguous float16/32/64 CUDA tensors"));
      }
    }
    const ncclRedOp_t nccl_op =
        op == ReduceOp::kMax ? ncclMax : (op == ReduceOp::kMean ? ncclAvg : ncclSum);
    absl::Status status = EnqueueGroup("all-reduce", [&]() -> absl::Status {
      for (torch::Tensor& t : tensors) {
        absl::Status issued =
            calls_.Check(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                       *NcclType(t), nccl_op, comm_, stream_),
                         "ncclAllReduce");
        if (!issued.ok()) return issued;
      }
      return absl::OkStatus();
    });
    if (!status.ok()) return std::make_unique<NcclWork>(status);
    // Recorded only now that NCCL has queued the group on the stream: an event recorded while
    // ncclGroupEnd was still in progress could complete before the collectives ran.
    cudaEvent_t done = nullptr;
    status = FromCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    if (status.ok()) status = FromCuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    if (!status.ok()) return std::make_unique<NcclWork>(status);
    return std::make_unique<NcclWork>(&calls_, done, RealClock::Get().Now() + timeout_, timeout_,
                                      &broken_);
  }

  absl::Status Broadcast(std::vector<torch::Tensor> tensors, int root) override {
    if (!broken_.ok()) return broken_;
    for (const torch::Tensor& t : tensors) {
      if (!t.is_cuda() || !t.is_contiguous()) {
        return absl::InvalidArgumentError("broadcast: NCCL sends contiguous CUDA tensors");
      }
    }
    absl::Status status = EnqueueGroup("broadcast", [&]() -> absl::Status {
      for (torch::Tensor& t : tensors) {
        absl::Status issued = calls_.Check(
            ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, stream_),
            "ncclBroadcast");
        if (!issued.ok()) return issued;
      }
      return absl::OkStatus();
    });
    if (status.ok()) status = Synchronize("broadcast");
    return status;
  }

  absl::Status Barrier() override {
    if (!broken_.ok()) return broken_;
    if (barrier_buffer_ == nullptr) {
      absl::Status status = FromCuda(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc");
      if (!status.ok()) return status;
    }
    absl::Status status = EnqueueGroup("barrier", [&] {
      return calls_.Check(
          ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum, comm_, stream_),
          "ncclAllReduce");
    });
    if (status.ok()) status = Synchronize("barrier");
    return status;
  }

 private:
  // Orders the collectives after the work LibTorch queued on the default stream (which produced
  // the tensors), issues them as one group (`issue` checks each call) and returns once NCCL has
  // queued the group on the stream. The group is closed even when a call in it failed, so this
  // thread's next NCCL call is not taken into it.
  template <typename Fn>
  absl::Status EnqueueGroup(absl::string_view op, Fn&& issue) {
    cudaEvent_t ready = nullptr;
    absl::Status status =
        FromCuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    if (status.ok()) status = FromCuda(cudaEventRecord(ready, nullptr), "cudaEventRecord");
    if (status.ok()) status = FromCuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWait");
    if (ready != nullptr) cudaEventDestroy(ready);
    if (status.ok()) status = calls_.Check(ncclGroupStart(), "ncclGroupStart");
    if (status.ok()) {
      absl::Status issued = issue();
      const ncclResult_t ended = ncclGroupEnd();
      status = issued.ok() ? calls_.Settle(ended, op, RealClock::Get().Now() + timeout_) : issued;
    }
    if (!status.ok()) broken_ = status;
    return status;
  }

  absl::Status Synchronize(absl::string_view op) {
    cudaEvent_t done = nullptr;
    absl::Status status =
        FromCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    if (status.ok()) status = FromCuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    if (status.ok())
      status = AwaitEvent(calls_, RealClock::Get().Now() + timeout_, timeout_, op, done);
    if (done != nullptr) cudaEventDestroy(done);
    if (!status.ok()) broken_ = status;
    return status;
  }

  const int rank_;
  const int world_size_;
  const ncclComm_t comm_;
  const cudaStream_t stream_;
  const absl::Duration timeout_;
  NcclCalls calls_;
  absl::Status broken_;  // the first failure; the communicator is aborted after it
  void* barrier_buffer_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(int rank, int world_size,
                                                                  RendezvousClient& rendezvous,
                                                                  absl::Duration timeout,
                                                                  absl::Duration connect_timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " of world size ", world_size));
  }
  ncclUniqueId id;
  if (rank == 0) {
    absl::Status status = FromNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (!status.ok()) return status;
    status = rendezvous.Set(kUniqueIdKey, std::string(id.internal, sizeof(id.internal)));
    if (!status.ok()) return status;
  } else {
    absl::StatusOr<std::string> shared = rendezvous.Get(kUniqueIdKey, connect_timeout);
    if (!shared.ok()) return shared.status();
    if (shared->size() != sizeof(id.internal)) {
      return absl::InternalError("nccl: the shared unique id has the wrong size");
    }
    std::memcpy(id.internal, shared->data(), sizeof(id.internal));
  }
  cudaStream_t stream = nullptr;
  absl::Status status =
      FromCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (!status.ok()) return status;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing peer cannot hang the init past the timeout
  ncclComm_t comm = nullptr;
  // Non-blocking: the call returns at once (ncclInProgress) and the state says when every rank
  // has joined; a rank that never comes leaves it in progress until the deadline aborts it.
  const ncclResult_t started = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  NcclCalls init(RealNcclApi());
  init.set_comm(comm);
  status = init.Settle(started, "ncclCommInitRank", RealClock::Get().Now() + connect_timeout);
  if (!status.ok()) {
    cudaStreamDestroy(stream);
    return status;
  }
  LogInfo("nccl: rank ", rank, " of ", world_size, " connected");
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(rank, world_size, comm, stream, timeout));
}

}  // namespace trainyard::trainer
