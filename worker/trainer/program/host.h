#ifndef TRAINYARD_WORKER_TRAINER_PROGRAM_HOST_H_
#define TRAINYARD_WORKER_TRAINER_PROGRAM_HOST_H_

// The host of one rank's program (program.h says what it does): its start (host.cc) and the
// program's requests on its socket (host_requests.cc). Internal to program/.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/trainer/program/channel.h"
#include "worker/trainer/program/environment.h"
#include "worker/trainer/program/files.h"
#include "worker/trainer/program/program.h"

namespace trainyard::trainer::program {

// The host's exit code for an error of its own (program.h's table): the user's for
// INVALID_ARGUMENT, NOT_FOUND and PERMISSION_DENIED (a command, a workdir, a mistake of the
// program's), infrastructure for the rest.
int ExitCodeForHost(const absl::Status& status);

// The longest socket path bound in the task folder (sockaddr_un holds 108 bytes with the NUL).
inline constexpr size_t kMaxSocketPath = 100;

class Host {
 public:
  Host(const trainyard::v1::Task& task, const ProgramOptions& options);
  ProgramResult Run();

 private:
  // Before the program starts: its folders, files and checkpoint (host.cc).
  absl::Status Prepare();
  absl::Status Restore();
  // Agrees with the other ranks on the layout and MASTER_ADDR:MASTER_PORT.
  absl::Status MeetPeers();
  // Rank 0: where the ranks' store is: served here when it can be (agent_store.h), else a free
  // port for rank 0's program to serve it on. Why it is not served here ("" when it can be).
  absl::Status PlaceStore(const std::string& address);
  std::string WhyNotServeStore();
  // With the store served on rank 0's host: each rank's host says when its program has ended;
  // rank 0's keeps the store until every rank's has (up to peer_timeout), as torchrun's agents
  // wait at their exit barrier, so that a rank done first does not take it from the others.
  void SayProgramEnded();
  void KeepStoreForPeers();
  // Starts the program; its pid.
  absl::StatusOr<pid_t> Start();
  // How the program's end (a wait status) ends the rank.
  ProgramResult Conclude(int wait_status);
  // After the program failed: whether the coordinator ended its attempt (for a lost peer, say)
  // within ProgramOptions::peer_loss_grace.
  bool AttemptEndedMeanwhile();
  // The last line the program wrote (its log's), for messages; empty when none.
  std::string LastOutputLine() const;

  // The program's requests (host_requests.cc).
  nlohmann::json Handle(const nlohmann::json& request);
  nlohmann::json OnReport(const nlohmann::json& request);
  nlohmann::json OnCommit(const nlohmann::json& request);
  // One checkpoint of `step` from every rank: this rank's files sent, rank 0's manifest and
  // commit, every rank told the outcome. INVALID_ARGUMENT for the program's mistakes (ranks at
  // different steps, two ranks writing one file), others for the store's and the coordinator's.
  absl::Status Commit(int64_t step);
  absl::Status CommitAsRankZero(int64_t n, int64_t step, std::vector<StoredFile> files,
                                absl::Time started);
  void Fail(const absl::Status& status);
  // Waits up to silent_program_after for the program's first report; without one (and still
  // running), reports the attempt's start with steps_unknown.
  void ReportIfSilent();

  const trainyard::v1::Task& task_;
  const ProgramOptions& options_;
  const Clock& clock_;
  Paths paths_;
  std::string restore_base_;  // where a checkpoint is restored to
  std::string socket_dir_;    // the socket's own folder in /tmp when the task's path is too long
  StorePlace store_;          // where the ranks meet
  std::unique_ptr<AgentStore> agent_store_;  // rank 0's, when it serves the store
  Layout layout_;
  int64_t restore_step_ = 0;
  std::shared_ptr<ObjectStore> checkpoint_store_;  // null without a checkpoint URI
  std::unique_ptr<ProgressReporter> reporter_;
  double rendezvous_seconds_ = 0;
  double restore_seconds_ = 0;

  absl::Mutex mu_;
  trainyard::v1::JobProgress progress_ ABSL_GUARDED_BY(mu_);
  bool reported_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // the program has exited
  absl::CondVar reported_or_ended_;
  std::optional<int64_t> stopping_at_ ABSL_GUARDED_BY(mu_);
  // A commit's failure that the program's exit does not explain better.
  absl::Status failure_ ABSL_GUARDED_BY(mu_);

  absl::Mutex commit_mu_;  // one commit at a time
  int64_t commits_ ABSL_GUARDED_BY(commit_mu_) = 0;
};

}  // namespace trainyard::trainer::program

#endif  // TRAINYARD_WORKER_TRAINER_PROGRAM_HOST_H_
