#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_NCCL_CALLS_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_NCCL_CALLS_H_

// NCCL's non-blocking mode (ncclConfig_t.blocking = 0), in one place: any call on a communicator
// may return ncclInProgress, and what it started (an init, a group of collectives being queued
// on the stream, a finalize) is done only once ncclCommGetAsyncError no longer reports
// ncclInProgress. Work queued on the stream before then cannot be ordered after it, so callers
// record completion events only after Settle() has returned OK.

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainyard::trainer {

// The NCCL entry points the protocol needs, behind an interface so that it is tested without a
// GPU (tests/trainer/nccl_calls_test.cc). RealNcclApi() forwards to libnccl.
class NcclApi {
 public:
  virtual ~NcclApi() = default;
  virtual ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) = 0;
  virtual ncclResult_t CommAbort(ncclComm_t comm) = 0;
  virtual const char* GetErrorString(ncclResult_t result) = 0;
};

// The protocol over one communicator. Not thread-safe: a communicator is used by one thread.
class NcclCalls {
 public:
  // `api` must outlive this. `poll` is the wait between two looks at the communicator's state.
  explicit NcclCalls(NcclApi& api, absl::Duration poll = absl::Microseconds(50))
      : api_(api), poll_(poll) {}

  // The communicator the calls are on; null until set (an init sets it when it returns).
  void set_comm(ncclComm_t comm) { comm_ = comm; }
  ncclComm_t comm() const { return comm_; }

  // The result of a call made outside a group (or of ncclGroupStart, or of a collective inside
  // a group, which only records it): OK for ncclSuccess and ncclInProgress; otherwise the
  // communicator is aborted and UNAVAILABLE "WHAT: <NCCL's error>" returned.
  absl::Status Check(ncclResult_t returned, absl::string_view what);

  // The result of a call that starts work NCCL finishes on its own (ncclGroupEnd, an init, a
  // finalize): waits until the communicator's state leaves ncclInProgress. OK once it is
  // ncclSuccess. An error return or state aborts the communicator: UNAVAILABLE naming `what` and
  // NCCL's error. Still in progress at `deadline`: aborts too, DEADLINE_EXCEEDED. Blocks.
  absl::Status Settle(ncclResult_t returned, absl::string_view what, absl::Time deadline);

  // The communicator's state now, while something it started may still run on the device: OK
  // for ncclSuccess and ncclInProgress; an error aborts it (UNAVAILABLE "WHAT: lost a peer: ...").
  absl::Status Poll(absl::string_view what);

  // Aborts the communicator (once); later calls return the first error.
  void Abort();
  bool aborted() const { return aborted_; }
  absl::Duration poll_interval() const { return poll_; }

 private:
  absl::Status Fail(absl::string_view what, ncclResult_t result);

  NcclApi& api_;
  const absl::Duration poll_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
};

// Forwards to libnccl; lives as long as the program.
NcclApi& RealNcclApi();

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_NCCL_CALLS_H_
