#ifndef TRAINYARD_WORKER_TRAINER_LOOP_SHARD_TASK_H_
#define TRAINYARD_WORKER_TRAINER_LOOP_SHARD_TASK_H_

// A parameter-server shard as a task of a parameter_server job (role TASK_ROLE_SHARD): it
// listens, publishes its address in the attempt's rendezvous store for the ranks to find, and
// serves until every rank has finished with it (their run ended, they stopped and saved, or they
// failed and said so). A preemption's stop (SIGTERM with a deadline) does not end it before the
// ranks are done, since they still exchange with it up to the step they agree to stop at; only
// the deadline does. A plain stop ends it once the ranks have gone quiet. It holds nothing that a
// checkpoint needs from it afterwards: rank 0 gathers the shards' optimizer state into every
// checkpoint and hands it back to a new attempt's shards.

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/ps_tls.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/trainer/coordinator/rendezvous_client.h"

namespace trainyard::trainer {

struct ShardTaskOptions {
  RendezvousClient* rendezvous = nullptr;  // required; not owned
  // Where it listens. Empty: on the host the ranks reach it at (the task's worker_address when
  // set, else default_hostname), a port the kernel picks; on every address ("0.0.0.0:0") when
  // that host cannot be bound (a name of a load balancer, say).
  std::string listen;
  std::string default_hostname = "127.0.0.1";
  // Its certificate and key (PsTls::FromEnvironment, from the agent's --ps_tls_cert and
  // --ps_tls_key): it serves TLS with them. Without them it speaks plaintext, with a warning
  // when it listens beyond loopback.
  PsTls tls;
  // Non-zero once it was asked to stop (a signal handler sets it). Not owned; required.
  const std::atomic<int>* stop_signal = nullptr;
  // Read once stopped (ReadStopDeadline): it then serves no later than that deadline.
  std::string stop_deadline_file;
  // Stopped without a deadline (not a preemption: the attempt ended or the job was cancelled),
  // it ends once no rank has called for this long, rather than wait for ranks that are gone.
  absl::Duration quiet_after_plain_stop = absl::Seconds(2);
  // Where it writes its counters (kShardMetricsFile) about once a second and at the end; empty:
  // nowhere.
  std::string metrics_file;
  // How often it looks at stop_signal.
  absl::Duration poll_interval = absl::Milliseconds(50);
};

// Serves shard `task.shard()` of `task`'s attempt until every rank has finished with it, or,
// once stop_signal is set, until the stop's deadline (or, without one, until the ranks are
// quiet); OK then.
// Its messages are bounded by the shard's memory (parameter_servers.memory_bytes) when the job
// sets it, else by gRPC's largest (ps_wire::kMaxMessageBytes): it learns its pieces only from
// rank 0's Init, after it has to serve. INVALID_ARGUMENT for a task that is not a shard of a
// parameter_server job, a missing rendezvous or TLS material that cannot be read; UNAVAILABLE
// when it cannot listen or publish its address.
absl::Status RunShardTask(const trainyard::v1::Task& task, const ShardTaskOptions& options);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_LOOP_SHARD_TASK_H_
