#include "worker/trainer/collective/nccl_calls.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"

namespace trainyard::trainer {

absl::Status NcclCalls::Fail(absl::string_view what, ncclResult_t result) {
  Abort();
  return absl::UnavailableError(absl::StrCat(what, ": ", api_.GetErrorString(result)));
}

absl::Status NcclCalls::Check(ncclResult_t returned, absl::string_view what) {
  if (returned == ncclSuccess || returned == ncclInProgress) return absl::OkStatus();
  return Fail(what, returned);
}

absl::Status NcclCalls::Settle(ncclResult_t returned, absl::string_view what, absl::Time deadline) {
  if (returned != ncclSuccess && returned != ncclInProgress) return Fail(what, returned);
  if (comm_ == nullptr) {
    return returned == ncclSuccess
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat(what, ": in progress on no communicator"));
  }
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = api_.CommGetAsyncError(comm_, &state);
    if (asked != ncclSuccess) return Fail(what, asked);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return Fail(what, state);
    if (RealClock::Get().Now() >= deadline) {
      Abort();
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": still in progress after the timeout"));
    }
    RealClock::Get().SleepFor(poll_);
  }
}

absl::Status NcclCalls::Poll(absl::string_view what) {
  if (comm_ == nullptr) return absl::OkStatus();
  ncclResult_t state = ncclSuccess;
  const ncclResult_t asked = api_.CommGetAsyncError(comm_, &state);
  if (asked != ncclSuccess) return Fail(what, asked);
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  return Fail(absl::StrCat(what, ": lost a peer"), state);
}

void NcclCalls::Abort() {
  if (aborted_ || comm_ == nullptr) {
    aborted_ = true;
    return;
  }
  aborted_ = true;
  api_.CommAbort(comm_);
}

namespace {

class LibNccl final : public NcclApi {
 public:
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) override {
    return ncclCommGetAsyncError(comm, state);
  }
  ncclResult_t CommAbort(ncclComm_t comm) override { return ncclCommAbort(comm); }
  const char* GetErrorString(ncclResult_t result) override { return ncclGetErrorString(result); }
};

}  // namespace

NcclApi& RealNcclApi() {
  static LibNccl* const api = new LibNccl();
  return *api;
}

}  // namespace trainyard::trainer
