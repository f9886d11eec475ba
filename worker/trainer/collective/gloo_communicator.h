#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_COMMUNICATOR_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_COMMUNICATOR_H_

// The CPU communicator, over Gloo's TCP transport. Collectives run on the thread that issues them
// (the communicator's own thread for AllReduceAsync), which writes to and reads from the sockets
// itself instead of through Gloo's event loop; two ranks exchange their tensors whole, with a
// second thread writing while the first reads; three ranks or more use a ring, Gloo's own for
// tensors from 2 MiB. See docs/benchmarks.md for what this buys over Gloo's own collectives.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/trainer/collective/communicator.h"
#include "worker/trainer/coordinator/rendezvous_client.h"

namespace trainyard::trainer {

struct GlooOptions {
  // Where peers reach this rank: the worker's advertised address. Gloo listens on it, on a port
  // the kernel picks.
  std::string hostname = "127.0.0.1";
  // Bound on every collective (spec collective_timeout): one in which no frame (256 KiB, or a
  // ring segment) completes for this long fails with DEADLINE_EXCEEDED. Gloo's own ring (three
  // ranks or more, from 2 MiB) and broadcasts count a whole tensor, or a tensor's copy to one
  // peer, as the unit instead.
  absl::Duration timeout = absl::Seconds(60);
  // Bound on meeting every peer at start, which waits for the slowest rank to load its data and
  // model.
  absl::Duration connect_timeout = absl::Minutes(5);
  // Also connect every pair of ranks for SendAsync and Recv (two more connections per peer).
  bool point_to_point = false;
  // Put before every rendezvous key, so that several groups of one attempt (a pipeline's stages'
  // replicas) meet apart; rank and world_size are then the group's.
  std::string key_prefix;
};

// Connects rank `rank` of `world_size` to every peer (full mesh, two connections per peer, three
// from three ranks) through `rendezvous`, which only needs to outlive this call. Blocks until all
// ranks have joined. Errors: the rendezvous client's (FAILED_PRECONDITION when the attempt ended,
// DEADLINE_EXCEEDED when a peer did not join within connect_timeout), UNAVAILABLE when a peer
// cannot be reached, INVALID_ARGUMENT for a bad rank or world size.
absl::StatusOr<std::unique_ptr<Communicator>> NewGlooCommunicator(int rank, int world_size,
                                                                  RendezvousClient& rendezvous,
                                                                  const GlooOptions& options);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_COMMUNICATOR_H_
