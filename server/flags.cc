// The coordinator's flags, each with its help text (`trainyard-coordinator --help`).

#include "server/flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7070",
          "Address for JobService, AgentService and health (and reflection with --reflection), "
          "as HOST:PORT. Port 0 lets the kernel pick one (see --port_file). A standby "
          "(--store=postgres://...) listens there too: its health NOT_SERVING, every other call "
          "refused UNAVAILABLE with the leader's address.");
ABSL_FLAG(std::string, state_dir, "./trainyard-state",
          "Directory for the SQLite state (state.db, WAL mode) and task logs (logs/). Created "
          "if missing. Restarting on the same directory restores every job, worker and "
          "checkpoint.");
ABSL_FLAG(
    std::string, store, "",
    "Where the cluster's state lives. Empty: SQLite in --state_dir, for one coordinator. "
    "postgres://USER@HOST:PORT/DB (libpq's URI: ?sslmode=verify-full&sslrootcert=CA.pem "
    "for TLS to the database): PostgreSQL, shared by several coordinators of which one "
    "leads and the others stand by to take over (docs/operations.md). Its password from "
    "--store_password_file, PGPASSWORD or ~/.pgpass; task logs are kept in the database too.");
ABSL_FLAG(std::string, store_password_file, "",
          "File whose first line is the PostgreSQL password of --store (kept out of the command "
          "line, which others on the machine can read).");
ABSL_FLAG(bool, migrate_state, false,
          "Copy the state of --state_dir (SQLite: jobs, tokens, searches, queues, task logs, the "
          "task-credential key) into the empty PostgreSQL database of --store, then exit. Stop "
          "the coordinator of --state_dir first; coordinators on --store stand by meanwhile.");
ABSL_FLAG(absl::Duration, leader_lease, absl::Seconds(3),
          "With a PostgreSQL --store: how long the leader's lease lasts unrenewed (it is renewed "
          "every third of this). A standby takes over at most this long after the leader dies; "
          "a leader that cannot renew it for this long writes nothing more and exits, for its "
          "supervisor to start it again as a standby.");
ABSL_FLAG(bool, warm_standby, true,
          "With a PostgreSQL --store: while standing by, keep a copy of the state the leader "
          "starts from (active jobs, workers, queues, tokens, searches), followed from the "
          "store's change feed, so that taking over reads only what changed since. false: load "
          "it all on taking over.");
ABSL_FLAG(std::string, advertise_address, "",
          "With a PostgreSQL --store: the address clients reach this coordinator at, shown by "
          "the standbys' logs while it leads. Default: --listen, with this machine's host name "
          "for 0.0.0.0.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Base URI for checkpoints of jobs whose spec sets no checkpoint.uri; a job's "
          "checkpoints go to {base}/{job_id}. Default: file://<absolute state_dir>/checkpoints.");
ABSL_FLAG(std::string, max_workdir_size, "100MiB",
          "The largest program workdir (the archive `trainyard submit` packs from a local "
          "folder) this coordinator keeps, e.g. 500MiB.");
ABSL_FLAG(absl::Duration, worker_timeout, absl::Seconds(10),
          "A worker whose agent keeps no lease stream (an older agent) is LOST when it has not "
          "synced for this long; the jobs with ranks there restart from their latest committed "
          "checkpoint.");
ABSL_FLAG(absl::Duration, lease_beat_timeout, absl::Milliseconds(1500),
          "Agents beat on their lease stream every third of this while they run tasks; one "
          "without a beat this long (a host cut off or frozen) has its stream ended, and is LOST "
          "--worker_stream_grace later unless it comes back. 0 asks for no beats: the pings "
          "(--lease_ping_interval) are then all that finds such a host.");
ABSL_FLAG(absl::Duration, lease_ping_interval, absl::Seconds(75),
          "The coordinator pings a connection (HTTP/2 keepalive) that has been silent this long: "
          "an idle agent's long polls (60 s by default) keep it from ever pinging a healthy one, "
          "and a busy agent's beats find a lost host much sooner.");
ABSL_FLAG(absl::Duration, lease_ping_timeout, absl::Seconds(10),
          "A ping unanswered this long breaks the connection and ends the lease stream on it.");
ABSL_FLAG(
    absl::Duration, worker_stream_grace, absl::Milliseconds(500),
    "A worker whose lease stream ended is LOST after this, unless its agent opens a new one.");
ABSL_FLAG(absl::Duration, mass_loss_hold, absl::Minutes(5),
          "When more than half of the workers (at least two) lose their lease at once, this "
          "coordinator is more likely the one cut off: their jobs are not restarted and they are "
          "held unreachable this long before they count as lost.");
ABSL_FLAG(absl::Duration, restart_backoff, absl::Seconds(1),
          "Wait before the next attempt of a restarted job whose attempt got no further than it "
          "started (one that did restarts at once): drawn from [d/2, d], d doubling with each "
          "restart in a row whose attempt never reached a step, up to --restart_backoff_max. "
          "0 restarts at once.");
ABSL_FLAG(absl::Duration, restart_backoff_max, absl::Seconds(60),
          "Upper bound of the restart backoff.");
ABSL_FLAG(absl::Duration, start_timeout, absl::Minutes(10),
          "Ranks of an attempt that are still not started this long after it was placed (their "
          "agent never launched them) end the attempt; the job restarts as after an "
          "infrastructure error (restart.max_infrastructure_errors).");
ABSL_FLAG(int, max_active_jobs, 100000,
          "Jobs not yet finished (queued, running, restarting) the coordinator holds; a "
          "submission beyond is refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, job_retention, absl::Hours(24 * 7),
          "Finished jobs are removed this long after they finished, with their events, tasks, "
          "logs and checkpoint records (the checkpoints themselves stay in storage); 'inf' keeps "
          "them.");
ABSL_FLAG(absl::Duration, lost_worker_retention, absl::Hours(24),
          "Workers LOST for this long are forgotten (no longer listed); one that comes back "
          "registers as new.");
ABSL_FLAG(int, max_job_events, 1000,
          "Events a job keeps: past this, the oldest after its first 10 are dropped (and counted "
          "in describe).");
ABSL_FLAG(int, max_job_restart_records, 100,
          "Restart records a job keeps: past this, the oldest are dropped (and counted in "
          "describe); restart budgets still count every restart.");
ABSL_FLAG(int64_t, max_task_log_bytes, int64_t{64} << 20,
          "Output of one task the coordinator keeps in its log; past this, a line says so, later "
          "output is dropped and, when the task ends, the count of bytes dropped is written.");
ABSL_FLAG(std::string, port_file, "",
          "If set, once the server listens, write the bound port number to this file "
          "(atomically: temp file + rename).");
ABSL_FLAG(std::string, metrics_listen, kDefaultMetricsListen,
          "Address for Prometheus metrics (HTTP GET /metrics), as HOST:PORT. Port 0 lets the "
          "kernel pick one (see --metrics_port_file); empty turns metrics off. If the default "
          "address is taken the coordinator runs without metrics (with a warning); an address "
          "given explicitly that cannot be bound stops it.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of the gRPC port: with --tls_key, the port speaks TLS only.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, client_ca, "",
          "PEM CA bundle that signs client certificates (CN: the name; OU: admin, user or agent, "
          "user when absent). Without it, callers authenticate with tokens only.");
ABSL_FLAG(bool, insecure, false,
          "Allow plaintext gRPC on an address that is not loopback (tokens then travel in clear). "
          "Without TLS, listening beyond loopback is refused unless this is given.");
ABSL_FLAG(std::string, admin_token_file, "",
          "Where the coordinator writes an admin token (mode 0600) when no valid admin token "
          "exists, e.g. at first start. Default: <state_dir>/admin.token.");
ABSL_FLAG(std::string, allowed_local_paths, "",
          "Comma-separated folders (or file:// URIs) under which a job's local paths "
          "(data.train, data.tokens, model.torchscript, model.stages, distill.teacher, "
          "checkpoint.uri) must lie, symbolic links followed: others are refused at submission, "
          "and by the trainers on the workers. Default: the checkpoint root when it is local, "
          "else none (object storage only). '*' allows any path the trainer's user can read: "
          "only for a machine of one user.");
ABSL_FLAG(bool, reflection, false,
          "Serve gRPC server reflection (grpc.reflection.v1alpha) on --listen, for tools such as "
          "grpcurl. It answers anyone who connects, without a credential, with every service and "
          "message of the API: turn it on only where every client is trusted. Never on "
          "--health_listen or on a standby.");
ABSL_FLAG(std::string, health_listen, "",
          "If set (HOST:PORT), also serve grpc.health.v1.Health alone, in plaintext, there: for "
          "probes that cannot speak TLS, such as the kubelet's gRPC probe.");
ABSL_FLAG(bool, backfill, true,
          "Run jobs behind the one at the head of the line when that does not delay its "
          "reservation (EASY backfill).");
ABSL_FLAG(bool, fair_share, true,
          "Share capacity between queues by weight (dominant-resource fair share); false: "
          "priority then submission order across queues.");
ABSL_FLAG(bool, preemption, true,
          "Let a job stop (through a coordinated save: no step lost) jobs of lower priority in "
          "its queue and jobs that other queues run on capacity they borrowed from its quota.");
ABSL_FLAG(absl::Duration, preemption_grace, absl::Seconds(60),
          "How long a job the scheduler preempts has to save and stop.");
ABSL_FLAG(absl::Duration, preemption_exempt_time, absl::Minutes(10),
          "A job the scheduler preempted is not preempted again until its next attempt has run "
          "this long, so that reclaims and priorities cannot bounce it back and forth.");
ABSL_FLAG(std::string, worker_limits_file, "",
          "YAML list of {name: GLOB, slots: N, gpus: N, memory: SIZE}: what an agent may claim "
          "for a worker whose name matches (the first entry that does). A registration over its "
          "limit is refused. Without a match, or without the file: 4096 slots, 64 GPUs, 64 TiB.");
ABSL_FLAG(int, max_streams_per_caller, 16,
          "Streams (WatchJob, GetJobLogs) and long polls (Sync, RendezvousGet that wait) one "
          "caller may hold open at once.");
ABSL_FLAG(int64_t, metric_history_recent_steps, 1000,
          "A job's metric history (the console's charts) keeps every progress report of its "
          "newest this many steps.");
ABSL_FLAG(int64_t, metric_history_points, 2000,
          "...and at most this many points of the steps before them, evenly spread (thinned as "
          "the job grows).");
ABSL_FLAG(std::string, console_listen, "",
          "Address (HOST:PORT) of the web console and its JSON API (docs/user-guide.md, \"The "
          "console\"). HTTPS with --tls_cert and --tls_key; plain HTTP only on loopback (or with "
          "--insecure). Empty: no console.");
ABSL_FLAG(std::string, console_port_file, "",
          "If set, once the console listens, write its port number to this file.");
ABSL_FLAG(int64_t, console_max_body_bytes, int64_t{4} << 20,
          "The largest JSON body the console's API reads; larger is refused with 413.");

// Machines asked for when gangs wait (server/capacity/; docs/operations.md, "Running on Slurm").
// A file of these lines, given with --flagfile=FILE, is the provider's configuration.
ABSL_FLAG(std::string, capacity, "",
          "Ask a cluster manager for nodes when jobs wait for workers: 'slurm' (sbatch, squeue "
          "and scancel on this host, with --slurm_*), or empty for none.");
ABSL_FLAG(std::string, slurm_script, "",
          "The sbatch script each allocation runs: deploy/slurm/trainyard-agents.sbatch, where "
          "this host can read it.");
ABSL_FLAG(std::string, slurm_partition, "", "sbatch --partition (empty: Slurm's default).");
ABSL_FLAG(std::string, slurm_account, "", "sbatch --account (empty: the user's default).");
ABSL_FLAG(std::string, slurm_qos, "", "sbatch --qos (empty: the default).");
ABSL_FLAG(std::string, slurm_time_limit, "",
          "sbatch --time of each allocation (e.g. 4:00:00; empty: the partition's default). Its "
          "agents get SIGTERM before it ends (the script's --signal) and their jobs move on.");
ABSL_FLAG(int, slurm_cpus_per_node, 0,
          "CPUs of a node of the partition: the slots its agent offers (allocations take whole "
          "nodes), for how many nodes a job needs.");
ABSL_FLAG(int, slurm_gpus_per_node, 0,
          "GPUs of a node of the partition; > 0 asks for them with --gres=gpu:N.");
ABSL_FLAG(std::string, slurm_memory_per_node, "",
          "Memory of a node of the partition (64GiB), for how many ranks fit one; empty: not "
          "counted.");
ABSL_FLAG(int, slurm_max_nodes, 4, "The most Slurm nodes held at once, asked for or running.");
ABSL_FLAG(std::string, slurm_env_file, "",
          "The agents' settings on the nodes (the script's TRAINYARD_SLURM_ENV; default there "
          "/etc/trainyard/slurm.env): coordinator address, CA, token folder. Nothing of this "
          "process's environment is passed on.");
ABSL_FLAG(std::string, slurm_output_dir, "",
          "Where each allocation's log goes (trainyard-agents-JOBID.out); empty: Slurm's "
          "default, the folder sbatch runs in.");
ABSL_FLAG(std::string, slurm_job_name, "trainyard-agents",
          "The name of this coordinator's allocations, by which a restarted coordinator finds "
          "them; one name per Trainyard cluster.");
ABSL_FLAG(std::string, slurm_sbatch_args, "",
          "More sbatch arguments, split at spaces (e.g. --constraint=a100).");
ABSL_FLAG(std::string, slurm_worker_prefix, "",
          "The script's TRAINYARD_WORKER_PREFIX: an agent's worker name is this and its node's "
          "name.");
ABSL_FLAG(absl::Duration, slurm_idle_timeout, absl::Minutes(5),
          "An allocation whose agents have run nothing for this long is cancelled.");
ABSL_FLAG(absl::Duration, slurm_retry_after, absl::Seconds(30),
          "After Slurm refuses an allocation, wait this long before asking again for that job "
          "(doubling each time, up to 10 minutes).");
ABSL_FLAG(absl::Duration, slurm_poll_interval, absl::Seconds(5),
          "How often the waiting jobs and Slurm's queue are looked at.");
