#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_NCCL_COMMUNICATOR_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_NCCL_COMMUNICATOR_H_

// The GPU communicator: NCCL on its own CUDA stream. Built only when nccl.h and the CUDA runtime
// are found (TRAINYARD_WITH_NCCL); used only when LibTorch has CUDA, since it works on the device
// pointers of CUDA tensors.

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/trainer/collective/communicator.h"
#include "worker/trainer/coordinator/rendezvous_client.h"

namespace trainyard::trainer {

// Joins the NCCL group of the attempt on the current CUDA device (one rank per GPU; the agent
// makes it device 0 of the visible ones). Rank 0 draws the unique id and shares it through
// `rendezvous` (key "nccl/unique_id"), which only needs to outlive this call. Collectives are
// enqueued on the communicator's stream after the work already queued on the default stream;
// Work::Wait() blocks the host until they are done. A collective that does not finish within
// `timeout` aborts the communicator: DEADLINE_EXCEEDED; NCCL errors: UNAVAILABLE. Meeting the
// peers (the unique id, then every rank's init) waits at most `connect_timeout`, after which the
// half-made communicator is aborted.
absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(int rank, int world_size,
                                                                  RendezvousClient& rendezvous,
                                                                  absl::Duration timeout,
                                                                  absl::Duration connect_timeout);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_NCCL_COMMUNICATOR_H_
