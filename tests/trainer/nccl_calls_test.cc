// NCCL's non-blocking mode against a scripted NCCL: a call in progress is waited for until the
// communicator's state leaves ncclInProgress, every error aborts the communicator once, and a
// call still in progress at its deadline is aborted too.

#include "worker/trainer/collective/nccl_calls.h"

#include <deque>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

// Answers ncclCommGetAsyncError from a script of states (then the last one for ever), and
// counts the calls.
class ScriptedNccl : public NcclApi {
 public:
  explicit ScriptedNccl(std::deque<ncclResult_t> states) : states_(std::move(states)) {}

  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) override {
    ++queries;
    if (comm != Comm()) return ncclInvalidArgument;
    *state = states_.front();
    if (states_.size() > 1) states_.pop_front();
    return query_result;
  }
  ncclResult_t CommAbort(ncclComm_t comm) override {
    if (comm == Comm()) ++aborts;
    return ncclSuccess;
  }
  const char* GetErrorString(ncclResult_t result) override {
    switch (result) {
      case ncclRemoteError:
        return "remote process exited or there was a network error";
      case ncclSystemError:
        return "unhandled system error";
      default:
        return "some error";
    }
  }
  // A communicator handle the test never dereferences.
  static ncclComm_t Comm() { return reinterpret_cast<ncclComm_t>(0x1000); }

  int queries = 0;
  int aborts = 0;
  ncclResult_t query_result = ncclSuccess;

 private:
  std::deque<ncclResult_t> states_;
};

NcclCalls CallsOn(ScriptedNccl& nccl) {
  NcclCalls calls(nccl, absl::Microseconds(1));
  calls.set_comm(ScriptedNccl::Comm());
  return calls;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(NcclCallsTest, ACallInProgressIsDoneOnlyWhenTheStateLeavesInProgress) {
  ScriptedNccl nccl({ncclInProgress, ncclInProgress, ncclInProgress, ncclSuccess});
  NcclCalls calls = CallsOn(nccl);
  EXPECT_TRUE(calls.Settle(ncclInProgress, "ncclGroupEnd", Soon()).ok());
  // It asked until the state said done, not once: what was in progress has finished.
  EXPECT_EQ(nccl.queries, 4);
  EXPECT_EQ(nccl.aborts, 0);
  EXPECT_FALSE(calls.aborted());
}

TEST(NcclCallsTest, ASuccessfulReturnStillWaitsForTheCommunicatorsState) {
  // ncclGroupEnd may return ncclSuccess while the communicator is still in progress.
  ScriptedNccl nccl({ncclInProgress, ncclSuccess});
  NcclCalls calls = CallsOn(nccl);
  EXPECT_TRUE(calls.Settle(ncclSuccess, "ncclGroupEnd", Soon()).ok());
  EXPECT_EQ(nccl.queries, 2);
}

TEST(NcclCallsTest, AnErrorWhileInProgressAbortsOnceAndNamesTheCall) {
  ScriptedNccl nccl({ncclInProgress, ncclRemoteError});
  NcclCalls calls = CallsOn(nccl);
  absl::Status s = calls.Settle(ncclInProgress, "all-reduce", Soon());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("all-reduce: remote process exited"));
  EXPECT_EQ(nccl.aborts, 1);
  EXPECT_TRUE(calls.aborted());
  calls.Abort();  // once only
  EXPECT_EQ(nccl.aborts, 1);
}

TEST(NcclCallsTest, AnErrorReturnedByTheCallAbortsWithoutWaiting) {
  ScriptedNccl nccl({ncclSuccess});
  NcclCalls calls = CallsOn(nccl);
  absl::Status s = calls.Settle(ncclSystemError, "ncclCommInitRank", Soon());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ncclCommInitRank: unhandled system error"));
  EXPECT_EQ(nccl.queries, 0);
  EXPECT_EQ(nccl.aborts, 1);
}

TEST(NcclCallsTest, StillInProgressAtTheDeadlineAborts) {
  ScriptedNccl nccl({ncclInProgress});  // a peer that never comes
  NcclCalls calls = CallsOn(nccl);
  absl::Status s = calls.Settle(ncclInProgress, "ncclCommInitRank", absl::Now());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ncclCommInitRank: still in progress"));
  EXPECT_EQ(nccl.aborts, 1);
}

TEST(NcclCallsTest, AFailingStateQueryIsAnError) {
  ScriptedNccl nccl({ncclInProgress});
  nccl.query_result = ncclInvalidUsage;
  NcclCalls calls = CallsOn(nccl);
  EXPECT_EQ(calls.Settle(ncclInProgress, "ncclGroupEnd", Soon()).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(nccl.aborts, 1);
}

TEST(NcclCallsTest, CallsInsideAGroupAreCheckedOneByOne) {
  ScriptedNccl nccl({ncclSuccess});
  NcclCalls calls = CallsOn(nccl);
  EXPECT_TRUE(calls.Check(ncclSuccess, "ncclGroupStart").ok());
  EXPECT_TRUE(calls.Check(ncclInProgress, "ncclAllReduce").ok());
  absl::Status s = calls.Check(ncclInvalidArgument, "ncclAllReduce");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ncclAllReduce"));
  EXPECT_EQ(nccl.aborts, 1);
}

TEST(NcclCallsTest, PollingWhileWorkRunsReportsALostPeer) {
  ScriptedNccl nccl({ncclInProgress, ncclSuccess, ncclRemoteError});
  NcclCalls calls = CallsOn(nccl);
  EXPECT_TRUE(calls.Poll("all-reduce").ok());  // in progress: still running
  EXPECT_TRUE(calls.Poll("all-reduce").ok());
  absl::Status s = calls.Poll("all-reduce");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("all-reduce: lost a peer"));
  EXPECT_EQ(nccl.aborts, 1);
}

}  // namespace
}  // namespace trainyard::trainer
