#ifndef TRAINYARD_SERVER_FLAGS_H_
#define TRAINYARD_SERVER_FLAGS_H_

// The coordinator's command line (server/flags.cc holds each flag with its help text); main.cc
// reads them, assembles the rooms and runs.

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"

// Several coordinators or agents on one machine (tests, `trainyard up`) cannot all have it.
inline constexpr char kDefaultMetricsListen[] = "127.0.0.1:7071";

ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, state_dir);
ABSL_DECLARE_FLAG(std::string, store);
ABSL_DECLARE_FLAG(std::string, max_workdir_size);
ABSL_DECLARE_FLAG(std::string, store_password_file);
ABSL_DECLARE_FLAG(bool, migrate_state);
ABSL_DECLARE_FLAG(absl::Duration, leader_lease);
ABSL_DECLARE_FLAG(bool, warm_standby);
ABSL_DECLARE_FLAG(std::string, advertise_address);
ABSL_DECLARE_FLAG(std::string, checkpoint_root);
ABSL_DECLARE_FLAG(absl::Duration, worker_timeout);
ABSL_DECLARE_FLAG(absl::Duration, lease_beat_timeout);
ABSL_DECLARE_FLAG(absl::Duration, lease_ping_interval);
ABSL_DECLARE_FLAG(absl::Duration, lease_ping_timeout);
ABSL_DECLARE_FLAG(absl::Duration, worker_stream_grace);
ABSL_DECLARE_FLAG(absl::Duration, mass_loss_hold);
ABSL_DECLARE_FLAG(absl::Duration, restart_backoff);
ABSL_DECLARE_FLAG(absl::Duration, restart_backoff_max);
ABSL_DECLARE_FLAG(absl::Duration, start_timeout);
ABSL_DECLARE_FLAG(int, max_active_jobs);
ABSL_DECLARE_FLAG(absl::Duration, job_retention);
ABSL_DECLARE_FLAG(absl::Duration, lost_worker_retention);
ABSL_DECLARE_FLAG(int, max_job_events);
ABSL_DECLARE_FLAG(int, max_job_restart_records);
ABSL_DECLARE_FLAG(int64_t, max_task_log_bytes);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, client_ca);
ABSL_DECLARE_FLAG(bool, insecure);
ABSL_DECLARE_FLAG(std::string, admin_token_file);
ABSL_DECLARE_FLAG(std::string, allowed_local_paths);
ABSL_DECLARE_FLAG(bool, reflection);
ABSL_DECLARE_FLAG(std::string, health_listen);
ABSL_DECLARE_FLAG(bool, backfill);
ABSL_DECLARE_FLAG(bool, fair_share);
ABSL_DECLARE_FLAG(bool, preemption);
ABSL_DECLARE_FLAG(absl::Duration, preemption_grace);
ABSL_DECLARE_FLAG(absl::Duration, preemption_exempt_time);
ABSL_DECLARE_FLAG(std::string, worker_limits_file);
ABSL_DECLARE_FLAG(int, max_streams_per_caller);
ABSL_DECLARE_FLAG(int64_t, metric_history_recent_steps);
ABSL_DECLARE_FLAG(int64_t, metric_history_points);
ABSL_DECLARE_FLAG(std::string, console_listen);
ABSL_DECLARE_FLAG(std::string, console_port_file);
ABSL_DECLARE_FLAG(int64_t, console_max_body_bytes);
ABSL_DECLARE_FLAG(std::string, capacity);
ABSL_DECLARE_FLAG(std::string, slurm_script);
ABSL_DECLARE_FLAG(std::string, slurm_partition);
ABSL_DECLARE_FLAG(std::string, slurm_account);
ABSL_DECLARE_FLAG(std::string, slurm_qos);
ABSL_DECLARE_FLAG(std::string, slurm_time_limit);
ABSL_DECLARE_FLAG(int, slurm_cpus_per_node);
ABSL_DECLARE_FLAG(int, slurm_gpus_per_node);
ABSL_DECLARE_FLAG(std::string, slurm_memory_per_node);
ABSL_DECLARE_FLAG(int, slurm_max_nodes);
ABSL_DECLARE_FLAG(std::string, slurm_env_file);
ABSL_DECLARE_FLAG(std::string, slurm_output_dir);
ABSL_DECLARE_FLAG(std::string, slurm_job_name);
ABSL_DECLARE_FLAG(std::string, slurm_sbatch_args);
ABSL_DECLARE_FLAG(std::string, slurm_worker_prefix);
ABSL_DECLARE_FLAG(absl::Duration, slurm_idle_timeout);
ABSL_DECLARE_FLAG(absl::Duration, slurm_retry_after);
ABSL_DECLARE_FLAG(absl::Duration, slurm_poll_interval);

#endif  // TRAINYARD_SERVER_FLAGS_H_
