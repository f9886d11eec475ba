// Load on a running coordinator, over gRPC like any client or agent (coordinator_load.py starts
// the coordinator and prints the tables of docs/benchmarks.md).
//
//   coordinator_load submit --coordinator=ADDR [--threads=8] [--jobs=10000] [--window=1000]
//     Submits --jobs jobs from --threads threads as fast as they are acknowledged and prints the
//     rate of each window of --window submissions, by how many were queued before it.
//   coordinator_load agents --coordinator=ADDR [--agents=1000] [--seconds=60] [--rate=20]
//     Registers --agents simulated agents (one slot each) that long-poll Sync like the real agent
//     (--sync_wait) and finish every task they get at once (a stub trainer), while jobs are
//     submitted at --rate per second. Prints how long idle long polls took past their wait (the
//     Sync's own cost under load), the scheduling latency (submission acknowledged to the task in
//     its agent's hands) and whether every lease held. With --lease (the default, as the real
//     agent does) each agent also holds a lease stream (HoldLease), its channel set as the real
//     agent's (its keepalive pings included);
//     --connections sets how many connections the agents share (--connections=0: one each, as
//     separate machines have); with --beat they beat on it all along, as busy agents do.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/channel.h"
#include "trainyard/v1/admin_service.grpc.pb.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "coordinator address");
ABSL_FLAG(std::string, token_file, "",
          "an admin token (the coordinator's <state_dir>/admin.token); agents get agent tokens "
          "made with it");
ABSL_FLAG(int, threads, 8, "submit: concurrent clients");
ABSL_FLAG(int, jobs, 10000, "submit: jobs to submit");
ABSL_FLAG(int, window, 1000, "submit: submissions per reported window");
ABSL_FLAG(std::string, spec, "single",
          "submit: single (fits a 1-slot worker) or gpu (needs 4 GPUs)");
ABSL_FLAG(int, agents, 1000, "agents: simulated agents");
ABSL_FLAG(int, seconds, 60, "agents: how long to run");
ABSL_FLAG(double, rate, 20, "agents: jobs submitted per second while they run");
ABSL_FLAG(absl::Duration, sync_wait, absl::Seconds(60), "agents: long-poll wait (the agent's)");
ABSL_FLAG(bool, lease, true, "agents: hold a lease stream each, as the real agent does");
ABSL_FLAG(int, connections, 8, "agents: connections they share; 0: one per agent");
ABSL_FLAG(bool, beat, false,
          "agents: beat on the lease stream all along, as agents that run tasks do (the "
          "heartbeat load of a busy cluster)");

namespace {

namespace v1 = trainyard::v1;

std::string SpecYaml(absl::string_view kind) {
  std::string yaml = R"(name: sweep
model: {builtin: mlp, args: {inputs: 4, hidden: [8], classes: 2}}
data: {synthetic: {samples: 64, features: 4, classes: 2}}
epochs: 1
)";
  if (kind == "gpu") yaml += "resources: {gpus_per_worker: 4}\n";
  return yaml;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// The admin token, and a channel that presents it.
std::string AdminToken() {
  absl::StatusOr<std::string> token =
      trainyard::ReadCredentialFile(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::fprintf(stderr, "--token_file: %s\n", std::string(token.status().message()).c_str());
    std::exit(2);
  }
  return *token;
}

// `args`: the real agent's for the agents' channels (their keepalive pings included).
std::shared_ptr<grpc::Channel> Channel(const std::string& token, int id,
                                       grpc::ChannelArguments args = grpc::ChannelArguments()) {
  trainyard::ClientCredentials credentials;
  credentials.token = token;
  args.SetInt("grpc.channel_id", id);
  return *trainyard::NewClientChannel(absl::GetFlag(FLAGS_coordinator), credentials, args);
}

int Submit() {
  const std::string token = AdminToken();
  const int total = absl::GetFlag(FLAGS_jobs);
  const int window = absl::GetFlag(FLAGS_window);
  v1::SubmitJobRequest request;
  request.set_spec_yaml(SpecYaml(absl::GetFlag(FLAGS_spec)));
  std::atomic<int> next{0};
  std::atomic<int> failed{0};
  absl::Mutex mu;
  std::vector<absl::Time> acked;  // in order of acknowledgement
  acked.reserve(total);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int t = 0; t < absl::GetFlag(FLAGS_threads); ++t) {
    threads.emplace_back([&] {
      // One channel per client, as separate processes would have.
      auto stub = v1::JobService::NewStub(Channel(token, rand()));
      while (next.fetch_add(1) < total) {
        grpc::ClientContext context;
        v1::Job job;
        grpc::Status status = stub->SubmitJob(&context, request, &job);
        if (!status.ok()) {
          if (failed.fetch_add(1) < 3) {
            std::fprintf(stderr, "submit: %s\n", status.error_message().c_str());
          }
          continue;
        }
        absl::MutexLock lock(&mu);
        acked.push_back(absl::Now());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const absl::Duration elapsed = absl::Now() - start;
  std::printf("queued before | submissions/s\n");
  absl::Time from = start;
  for (size_t i = window; i <= acked.size(); i += window) {
    const absl::Time to = acked[i - 1];
    std::printf("%zu | %.0f\n", i - window, window / absl::ToDoubleSeconds(to - from));
    from = to;
  }
  std::printf("all %zu | %.0f (failed %d)\n", acked.size(),
              acked.size() / absl::ToDoubleSeconds(elapsed), failed.load());
  return failed.load() == 0 ? 0 : 1;
}

int Agents() {
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  const int agents = absl::GetFlag(FLAGS_agents);
  const absl::Duration wait = absl::GetFlag(FLAGS_sync_wait);
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  // Channels shared by the agents (by default a few: a thousand TCP connections also measure the
  // kernel and this client); each agent presents its own token with each call.
  const std::string admin_token = AdminToken();
  const bool lease = absl::GetFlag(FLAGS_lease);
  const bool beat = absl::GetFlag(FLAGS_beat);
  const int connections =
      absl::GetFlag(FLAGS_connections) > 0 ? absl::GetFlag(FLAGS_connections) : agents;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  // As the real agent sets its channel (its pings included).
  for (int i = 0; i < connections; ++i) {
    channels.push_back(
        Channel("", i, trainyard::CoordinatorClientArguments(trainyard::kAgentPingInterval)));
  }
  std::vector<std::string> tokens(agents);
  {
    auto admin = v1::AdminService::NewStub(Channel(admin_token, 100));
    for (int a = 0; a < agents; ++a) {
      v1::CreateTokenRequest request;
      request.set_name(absl::StrCat("sim-", a));
      request.set_role(v1::TOKEN_AGENT);
      v1::CreateTokenResponse response;
      grpc::ClientContext context;
      if (grpc::Status s = admin->CreateToken(&context, request, &response); !s.ok()) {
        std::fprintf(stderr, "CreateToken: %s\n", s.error_message().c_str());
        return 1;
      }
      tokens[a] = "Bearer " + response.secret();
    }
  }
  absl::Mutex mu;
  std::vector<double> overshoot_ms;  // long polls that waited: time beyond the wait
  std::map<std::string, absl::Time> submitted;
  std::vector<double> scheduling_ms;
  std::atomic<int> reregistered{0};
  std::atomic<int> errors{0};
  std::atomic<int> finished{0};
  int64_t syncs = 0;  // guarded by mu
  std::vector<std::thread> threads;
  for (int a = 0; a < agents; ++a) {
    threads.emplace_back([&, a] {
      auto stub = v1::AgentService::NewStub(channels[a % channels.size()]);
      const std::string name = absl::StrCat("sim-", a);
      auto register_worker = [&] {
        v1::RegisterWorkerRequest r;
        r.set_name(name);
        r.set_address("127.0.0.1");
        r.set_slots(1);
        r.set_pid(a + 1);
        grpc::ClientContext context;
        context.AddMetadata("authorization", tokens[a]);
        // A thousand connections opened at once, each TLS-less handshake given 2 s: waiting for
        // the connection is what the real agent's retries do.
        context.set_wait_for_ready(true);
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
        v1::RegisterWorkerResponse response;
        const grpc::Status status = stub->RegisterWorker(&context, r, &response);
        if (!status.ok() && errors.load() == 0) {
          std::fprintf(stderr, "RegisterWorker: %s\n", status.error_message().c_str());
        }
        return status.ok();
      };
      if (!register_worker()) {
        errors++;
        return;
      }
      // The lease stream, held on a thread of its own until the end.
      grpc::ClientContext lease_context;
      std::thread lease_thread;
      if (lease) {
        lease_context.AddMetadata("authorization", tokens[a]);
        lease_thread = std::thread([&] {
          auto stream = stub->HoldLease(&lease_context);
          v1::LeaseRequest first;
          first.set_worker_id(name);
          // Beats are asked for while it has tasks; the stub trainer ends before one is due.
          first.set_beats(true);
          v1::LeaseResponse answer;
          if (!stream->Write(first) || !stream->Read(&answer) || answer.reregister()) errors++;
          if (beat && answer.beat_interval_ms() > 0) {
            // As a busy agent: a beat every interval the coordinator asked for, until the end.
            const absl::Duration interval = absl::Milliseconds(answer.beat_interval_ms());
            absl::Time next = absl::Now() + interval;
            while (absl::Now() < end && stream->Write(v1::LeaseRequest())) {
              absl::SleepFor(next - absl::Now());
              next += interval;
            }
          }
          while (stream->Read(&answer)) {
          }
          stream->Finish();
        });
      }
      uint64_t known = 0;
      std::map<std::string, bool> done;
      while (absl::Now() < end) {
        v1::SyncRequest request;
        request.set_worker_id(name);
        request.set_known_version(known);
        // Never past the end: a long poll would hold the run up to its wait.
        const absl::Duration this_wait =
            std::min(wait, std::max(absl::ZeroDuration(), end - absl::Now()));
        request.set_wait_ms(absl::ToInt64Milliseconds(this_wait));
        grpc::ClientContext context;
        context.AddMetadata("authorization", tokens[a]);
        context.set_deadline(absl::ToChronoTime(absl::Now() + wait + absl::Seconds(30)));
        v1::SyncResponse response;
        const absl::Time sent = absl::Now();
        grpc::Status status = stub->Sync(&context, request, &response);
        const absl::Time got = absl::Now();
        if (!status.ok()) {
          // The first error said, for the reader of a run with errors.
          if (errors++ == 0) {
            std::fprintf(stderr, "Sync: %s\n", status.error_message().c_str());
          }
          continue;
        }
        if (response.reregister()) {
          reregistered++;
          register_worker();
          known = 0;
          continue;
        }
        const bool news = response.version() != known;
        {
          absl::MutexLock lock(&mu);
          // A long poll that had nothing to tell: how long past its wait it took to answer.
          if (!news) overshoot_ms.push_back(absl::ToDoubleMilliseconds(got - sent - this_wait));
          syncs++;
          for (const v1::Task& task : response.tasks()) {
            auto it = submitted.find(task.job_id());
            if (it != submitted.end() && !done.count(task.task_id())) {
              scheduling_ms.push_back(absl::ToDoubleMilliseconds(got - it->second));
            }
          }
        }
        known = response.version();
        // The stub trainer: starts and succeeds at once.
        for (const v1::Task& task : response.tasks()) {
          if (done.count(task.task_id())) continue;
          done[task.task_id()] = true;
          for (v1::TaskState state : {v1::TASK_RUNNING, v1::TASK_EXITED}) {
            v1::ReportTaskStatusRequest report;
            report.set_worker_id(name);
            report.mutable_status()->set_task_id(task.task_id());
            report.mutable_status()->set_state(state);
            grpc::ClientContext report_context;
            report_context.AddMetadata("authorization", tokens[a]);
            v1::ReportTaskStatusResponse ignored;
            if (!stub->ReportTaskStatus(&report_context, report, &ignored).ok()) errors++;
          }
          finished++;
        }
      }
      if (lease) {
        lease_context.TryCancel();
        lease_thread.join();
      }
    });
  }
  // The submitter: a steady stream of small jobs.
  std::thread submitter([&] {
    auto stub = v1::JobService::NewStub(Channel(admin_token, 101));
    v1::SubmitJobRequest request;
    request.set_spec_yaml(SpecYaml("single"));
    const absl::Duration period = absl::Seconds(1.0 / absl::GetFlag(FLAGS_rate));
    absl::Time next = absl::Now() + absl::Seconds(3);  // let the agents register first
    while (next < end - absl::Seconds(2)) {
      absl::SleepFor(next - absl::Now());
      next += period;
      grpc::ClientContext context;
      v1::Job job;
      if (grpc::Status status = stub->SubmitJob(&context, request, &job); !status.ok()) {
        if (errors.fetch_add(1) < 3) {
          std::fprintf(stderr, "submit: %s\n", status.error_message().c_str());
        }
        continue;
      }
      absl::MutexLock lock(&mu);
      submitted[job.id()] = absl::Now();
    }
  });
  submitter.join();
  for (std::thread& t : threads) t.join();
  int lost = 0;
  {
    auto stub = v1::JobService::NewStub(channels[0]);
    grpc::ClientContext context;
    v1::ListWorkersResponse response;
    if (stub->ListWorkers(&context, v1::ListWorkersRequest(), &response).ok()) {
      for (const v1::Worker& w : response.workers()) lost += w.state() == v1::LOST;
    }
  }
  absl::MutexLock lock(&mu);
  std::printf(
      "agents %d | syncs %lld | idle long poll past its wait p50 %.1f ms p99 %.1f ms | "
      "jobs %zu scheduled %zu finished %d | scheduling p50 %.1f ms p99 %.1f ms | lost %d "
      "reregistered %d errors %d\n",
      agents, static_cast<long long>(syncs), Percentile(overshoot_ms, 0.5),
      Percentile(overshoot_ms, 0.99), submitted.size(), scheduling_ms.size(), finished.load(),
      Percentile(scheduling_ms, 0.5), Percentile(scheduling_ms, 0.99), lost, reregistered.load(),
      errors.load());
  return lost == 0 && errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string mode = args.size() > 1 ? args[1] : "";
  if (mode == "submit") return Submit();
  if (mode == "agents") return Agents();
  std::fprintf(stderr, "usage: coordinator_load submit|agents --coordinator=ADDR [flags]\n");
  return 2;
}
