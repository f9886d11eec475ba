#ifndef TRAINYARD_WORKER_TRAINER_GLOO_COMMUNICATOR_H_
#define TRAINYARD_WORKER_TRAINER_GLOO_COMMUNICATOR_H_

// The CPU communicator: Gloo's ring all-reduce over its TCP transport.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/trainer/communicator.h"
#include "worker/trainer/rendezvous_client.h"

namespace trainyard::trainer {

struct GlooOptions {
  // Where peers reach this rank: the worker's advertised address. Gloo listens on it, on a port
  // the kernel picks.
  std::string hostname = "127.0.0.1";
  // Bound on every collective (spec collective_timeout).
  absl::Duration timeout = absl::Seconds(60);
  // Bound on meeting every peer at start, which waits for the slowest rank to load its data and
  // model.
  absl::Duration connect_timeout = absl::Minutes(5);
};

// Connects rank `rank` of `world_size` to every peer (full mesh) through `rendezvous`, which
// only needs to outlive this call. Blocks until all ranks have joined. Errors: the rendezvous
// client's (FAILED_PRECONDITION when the attempt ended, DEADLINE_EXCEEDED when a peer did not
// join within connect_timeout), UNAVAILABLE when a peer cannot be reached, INVALID_ARGUMENT for
// a bad rank or world size.
absl::StatusOr<std::unique_ptr<Communicator>> NewGlooCommunicator(int rank, int world_size,
                                                                  RendezvousClient& rendezvous,
                                                                  const GlooOptions& options);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_GLOO_COMMUNICATOR_H_
