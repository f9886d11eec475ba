#ifndef TRAINYARD_COMMON_FLIGHT_RECORD_H_
#define TRAINYARD_COMMON_FLIGHT_RECORD_H_

// A rank's flight record: what it is doing now (its phase, since when, at which step) and its
// last collectives and point-to-point messages (kind, size, number, start and end). The trainer
// keeps it in a small memory-mapped file in its task folder (kFlightRecordFile), written with
// plain atomic stores, so that its agent can read it from outside at any moment: while the rank
// runs, while it is stopped (SIGSTOP, a debugger) or stuck, and after it died, kill -9 included.
// The coordinator compares the ranks' records to name the rank that held the others up.
//
// The file's layout is fixed (little-endian 64-bit words, version kFlightRecordVersion); both
// sides include this header, which is its one definition.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace trainyard {

// In the task's folder; written by the trainer, read by the agent.
inline constexpr char kFlightRecordFile[] = "flight-record";
inline constexpr int64_t kFlightRecordVersion = 1;
// Entries kept: the newest this many collectives and messages.
inline constexpr int kFlightRecordEntries = 64;

// What a rank is doing. Numbers are the file's: append only.
enum class RankPhase : int32_t {
  kStarting = 0,    // before the first step: rendezvous, loading, resuming
  kData = 1,        // waiting for its next batch (the data read)
  kForward = 2,     // the forward pass and the loss
  kBackward = 3,    // the backward pass (gradient all-reduces start from it)
  kOptimizer = 4,   // waiting for gradients, the update, agreeing on the step
  kCheckpoint = 5,  // saving a checkpoint
  kValidation = 6,  // evaluating the validation split
  kFinishing = 7,   // after the last step: the final checkpoint, export, reports
};
// "data loading", "forward", ...: as the job's events say it.
const char* RankPhaseName(RankPhase phase);

// Numbers are the file's: append only.
enum class CollectiveKind : int32_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kSend = 4,  // a point-to-point message to `peer`
  kRecv = 5,  // a point-to-point message from `peer`
};
// "all-reduce", "broadcast", "barrier", "send", "receive".
const char* CollectiveKindName(CollectiveKind kind);

struct CollectiveEntry {
  // Collectives (all-reduce, broadcast, barrier) are numbered 1, 2, ... in the order this rank
  // entered them, which every rank of an attempt shares: #N is the same collective everywhere.
  // Messages are numbered 1, 2, ... per peer and direction: send #k to rank P is P's receive #k
  // from this rank.
  int64_t seq = 0;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int32_t peer = -1;  // messages only
  int64_t bytes = 0;
  int64_t started_unix_ms = 0;
  int64_t ended_unix_ms = 0;  // 0: not ended
  bool failed = false;        // ended with an error
};

struct FlightRecordSnapshot {
  RankPhase phase = RankPhase::kStarting;
  int64_t phase_since_unix_ms = 0;
  int64_t step = 0;  // updates done
  // The newest entries, oldest first.
  std::vector<CollectiveEntry> recent;
};

// The trainer's side. Thread-safe: the training thread sets phases and steps, the communicator's
// threads record collectives and messages; nothing blocks or allocates but a message's first use
// of a peer.
class FlightRecorder {
 public:
  // Creates (or truncates) the file at `path` and maps it. Errors: the file cannot be created,
  // sized or mapped (UNAVAILABLE, with the reason).
  static absl::StatusOr<std::unique_ptr<FlightRecorder>> Create(const std::string& path,
                                                                const Clock& clock);
  // Kept in memory only (tests, and a trainer without a task folder).
  static std::unique_ptr<FlightRecorder> InMemory(const Clock& clock);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Enters `phase` now; a call with the phase it is already in changes nothing (its start stays).
  void SetPhase(RankPhase phase);
  void SetStep(int64_t step);

  // Records the start of a collective (peer < 0) or a message, giving it the next number of its
  // series; returns a token for End.
  uint64_t Begin(CollectiveKind kind, int64_t bytes, int peer = -1);
  void End(uint64_t token, bool ok);

  // What a reader of the file would see now.
  FlightRecordSnapshot Snapshot() const;

 private:
  struct Layout;
  FlightRecorder(Layout* layout, size_t mapped_bytes, const Clock& clock);

  Layout* const layout_;       // the mapping (or heap memory when mapped_bytes_ is 0)
  const size_t mapped_bytes_;  // 0: InMemory
  const Clock& clock_;
  std::atomic<int64_t> collectives_{0};
  absl::Mutex mu_;
  // Per peer: messages sent to it, and received from it.
  absl::flat_hash_map<int, int64_t> sent_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, int64_t> received_ ABSL_GUARDED_BY(mu_);
};

// Reads the record a trainer keeps at `path` (it may be running, stopped, or gone). NOT_FOUND
// when there is no such file; DATA_LOSS for a file that is not a flight record of this version
// (named in the message). Entries being written as it reads are left out.
absl::StatusOr<FlightRecordSnapshot> ReadFlightRecord(const std::string& path);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FLIGHT_RECORD_H_
