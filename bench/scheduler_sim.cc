// The coordinator's scheduling code (server/scheduling/scheduler.h, the same Schedule() the
// JobManager calls) driven by a simulated clock and simulated agents over a synthetic trace of GPU
// jobs, under four policies: FIFO with gang scheduling, + EASY backfill, + fair share between
// queues,
// + preemption. Prints one row per policy: utilisation, waits and completion times, each queue's
// share against its weight (Jain's index), the longest wait of a large gang, work lost to
// preemption, and how fast the scheduler decides.
//
//   build/bin/scheduler_sim [--jobs 10000] [--machines 200] [--seed 1]
//
// The trace: jobs shaped after what the Philly (Jeon et al., USENIX ATC '19) and Helios (Hu et
// al., SC '21) studies report of GPU clusters: most jobs take one GPU, a few large gangs take
// most of the GPU time; durations are heavy-tailed (log-normal, median 15 minutes, a tail of
// days); arrivals are Poisson with a daily cycle. The parameters are ours, set to that shape, not
// fitted to the raw traces. Users state a max_runtime 1 to 3 times the real duration, as HPC
// users over-estimate.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/scheduling/scheduler.h"

ABSL_FLAG(int, jobs, 10000, "jobs in the trace");
ABSL_FLAG(int, machines, 200, "machines of 8 GPUs");
ABSL_FLAG(uint64_t, seed, 1, "trace seed");
ABSL_FLAG(double, load, 0.9, "offered load: GPU time asked over GPU time the cluster has");
ABSL_FLAG(int64_t, exempt_minutes, 10,
          "a preempted job is not preempted again until it has run this long after resuming "
          "(the coordinator's --preemption_exempt_time)");
ABSL_FLAG(std::string, policies, "fifo,backfill,fair,preempt",
          "which to run, in order: fifo (gang, no backfill), backfill (+ EASY backfill), quota "
          "(+ the teams' queues, no fair share), fair (+ fair share), preempt (+ preemption)");

namespace trainyard {
namespace {

constexpr int kGpusPerMachine = 8;
constexpr int64_t kMinute = 60 * 1000;
// A preempted job's ranks save at the next step they agree on: the capacity comes free this long
// after the decision (the save), and the job resumes from that step: no work is lost.
constexpr int64_t kSaveMs = 30 * 1000;

struct Team {
  const char* name;
  double weight;
  double submits;  // fraction of the jobs
};
// Four teams: quotas in proportion to weight, submissions not (so that queues compete).
constexpr Team kTeams[] = {
    {"vision", 4, 0.25}, {"nlp", 2, 0.35}, {"speech", 1, 0.25}, {"research", 1, 0.15}};

struct TraceJob {
  int index = 0;
  int team = 0;
  int gpus = 1;
  int priority = 0;
  int64_t arrival_ms = 0;
  int64_t duration_ms = 0;     // the work it does
  int64_t max_runtime_ms = 0;  // what its user says
};

// What the scheduler is told of how long `left` more of a job's work takes: its user's
// max_runtime, scaled to what is left (an upper bound, as max_runtime is).
int64_t Bound(const TraceJob& t, int64_t left) {
  return static_cast<int64_t>(static_cast<double>(left) * t.max_runtime_ms / t.duration_ms);
}

std::vector<TraceJob> MakeTrace(int n, int machines, double load, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // GPUs per job: most take one; gangs of 8 to 64 are few but hold most of the GPU time.
  const std::vector<std::pair<int, double>> sizes = {{1, 0.60},  {2, 0.10},   {4, 0.10},  {8, 0.12},
                                                     {16, 0.04}, {32, 0.025}, {64, 0.015}};
  std::vector<double> size_weights;
  for (const auto& [g, p] : sizes) size_weights.push_back(p);
  std::discrete_distribution<int> size_of(size_weights.begin(), size_weights.end());
  std::lognormal_distribution<double> minutes(std::log(15.0), 1.8);
  std::discrete_distribution<int> team_of(
      {kTeams[0].submits, kTeams[1].submits, kTeams[2].submits, kTeams[3].submits});
  std::uniform_real_distribution<double> uniform(0, 1);
  std::vector<TraceJob> jobs(n);
  double gpu_minutes = 0;
  for (int i = 0; i < n; ++i) {
    TraceJob& j = jobs[i];
    j.index = i;
    j.gpus = sizes[size_of(rng)].first;
    j.team = team_of(rng);
    j.priority = uniform(rng) < 0.1 ? 10 : 0;
    const double m = std::min(std::max(minutes(rng), 1.0), 7 * 24 * 60.0);
    j.duration_ms = static_cast<int64_t>(m * kMinute);
    j.max_runtime_ms = static_cast<int64_t>(j.duration_ms * (1 + 2 * uniform(rng)));
    gpu_minutes += m * j.gpus;
  }
  // Poisson arrivals at the rate that offers `load`, modulated by a daily cycle (busy days,
  // quiet nights: rate x (1 + 0.5 sin)).
  const double mean_gpu_minutes = gpu_minutes / n;
  const double per_minute = load * machines * kGpusPerMachine / mean_gpu_minutes;
  std::exponential_distribution<double> gap(1.0);
  double t = 0;
  for (TraceJob& j : jobs) {
    const double day = std::sin(2 * M_PI * t / (24 * 60));
    t += gap(rng) / (per_minute * (1 + 0.5 * day));
    j.arrival_ms = static_cast<int64_t>(t * kMinute);
  }
  return jobs;
}

struct Result {
  std::string policy;
  double utilisation = 0;
  double mean_wait_min = 0;
  double p99_wait_min = 0;
  double mean_jct_min = 0;
  double p99_jct_min = 0;
  double jain = 0;
  double longest_gang_wait_h = 0;
  int preemptions = 0;
  int jobs_preempted = 0;  // distinct
  int most_preempted = 0;  // of one job
  double lost_gpu_hours = 0;
  double save_gpu_hours = 0;
  int64_t passes = 0;
  int most_waiting = 0;  // pending jobs in one pass, at most
  double decide_s = 0;
  int64_t jobs_considered = 0;
  double makespan_h = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double CpuSeconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

Result Simulate(const std::vector<TraceJob>& trace, int machines, const std::string& policy) {
  Result result;
  result.policy = policy;
  const int64_t exempt_ms = absl::GetFlag(FLAGS_exempt_minutes) * kMinute;
  SchedContext context;
  context.policy.backfill = policy != "fifo";
  context.policy.fair_share = policy == "fair" || policy == "preempt";
  context.policy.preemption = policy == "preempt";
  const bool queues = policy == "fair" || policy == "preempt" || policy == "quota";
  const int total_gpus = machines * kGpusPerMachine;
  double weights = 0;
  for (const Team& t : kTeams) weights += t.weight;
  if (queues) {
    for (const Team& t : kTeams) {
      SchedQueue q;
      q.name = t.name;
      q.quota_slots = -1;
      q.quota_gpus = static_cast<int>(total_gpus * t.weight / weights);
      q.borrow_slots = -1;
      q.borrow_gpus = -1;
      q.weight = t.weight;
      context.queues.push_back(q);
    }
  }
  std::vector<SchedWorker> workers(machines);
  for (int m = 0; m < machines; ++m) {
    workers[m].id = absl::StrFormat("m%03d", m);
    workers[m].total_gpus = workers[m].free_gpus = kGpusPerMachine;
  }
  std::map<std::string, size_t> worker_index;
  for (size_t m = 0; m < workers.size(); ++m) worker_index[workers[m].id] = m;

  struct State {
    int64_t left_ms = 0;       // work still to do
    int64_t started_ms = -1;   // of the current run
    int64_t first_start = -1;  // for the wait
    int64_t end_ms = -1;       // of the current run (or when its save ends, preempted)
    std::vector<SchedTask> tasks;
    bool running = false;
    bool stopping = false;
    int preempted = 0;  // times
    int64_t seq = 0;
    int64_t done_ms = -1;
  };
  std::vector<State> state(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    state[i].left_ms = trace[i].duration_ms;
    state[i].seq = static_cast<int64_t>(i);
  }
  auto sched_job = [&](const TraceJob& t) {
    SchedJob j;
    j.id = absl::StrCat(t.index);
    j.seq = state[t.index].seq;
    j.priority = t.priority;
    const int ranks = (t.gpus + kGpusPerMachine - 1) / kGpusPerMachine;
    j.min_ranks = j.max_ranks = ranks;
    j.gpus_per_rank = t.gpus / ranks;
    j.slots_per_rank = 0;
    if (queues) j.queue = kTeams[t.team].name;
    j.runtime_ms = Bound(t, state[t.index].left_ms);
    return j;
  };
  std::set<int> pending;
  std::set<int> running;
  size_t next_arrival = 0;
  int64_t now = 0;
  double busy_gpu_ms = 0;
  const int64_t arrivals_end = trace.back().arrival_ms;
  double window_busy_gpu_ms = 0;
  double jain_sum = 0;
  double jain_time = 0;
  auto release = [&](int i) {
    for (const SchedTask& t : state[i].tasks) workers[worker_index[t.worker]].free_gpus += t.gpus;
    state[i].tasks.clear();
    state[i].running = state[i].stopping = false;
    running.erase(i);
  };
  int64_t last = 0;
  double save_gpu_ms = 0;  // GPUs held by saving ranks after a preemption
  while (next_arrival < trace.size() || !pending.empty() || !running.empty()) {
    // The next event: an arrival, or a run that ends (done, or its save after a preemption).
    int64_t next = INT64_MAX;
    if (next_arrival < trace.size()) next = trace[next_arrival].arrival_ms;
    for (int i : running) next = std::min(next, state[i].end_ms);
    now = next;
    // GPU time busy since the last event (over the arrivals' span, for utilisation; all of it,
    // for the work accounting).
    int used = 0;
    std::vector<double> held(std::size(kTeams), 0);
    for (int i : running) {
      for (const SchedTask& t : state[i].tasks) used += t.gpus;
      held[trace[i].team] += trace[i].gpus;
    }
    busy_gpu_ms += static_cast<double>(used) * (now - last);
    if (last < arrivals_end) {
      window_busy_gpu_ms += static_cast<double>(used) * (std::min(now, arrivals_end) - last);
    }
    // Fairness among the queues that want more (have jobs waiting): Jain's index of what each
    // holds over its weight, averaged over time.
    std::set<int> backlogged;
    for (int i : pending) backlogged.insert(trace[i].team);
    if (backlogged.size() >= 2 && now > last) {
      double sum = 0;
      double sum_sq = 0;
      for (int q : backlogged) {
        const double x = held[q] / kTeams[q].weight;
        sum += x;
        sum_sq += x * x;
      }
      const double jain = sum_sq > 0 ? sum * sum / (backlogged.size() * sum_sq) : 1;
      jain_sum += jain * (now - last);
      jain_time += now - last;
    }
    last = now;
    std::vector<int> ended;
    for (int i : running) {
      if (state[i].end_ms <= now) ended.push_back(i);
    }
    for (int i : ended) {
      const bool preempted = state[i].stopping;
      if (!preempted) {
        state[i].left_ms = 0;
        state[i].done_ms = now;
      }
      release(i);
      if (preempted) pending.insert(i);  // back to its queue, its work kept
    }
    while (next_arrival < trace.size() && trace[next_arrival].arrival_ms <= now) {
      pending.insert(static_cast<int>(next_arrival++));
    }
    // One scheduling pass, timed.
    std::vector<SchedJob> jobs;
    for (int i : pending) jobs.push_back(sched_job(trace[i]));
    result.most_waiting = std::max(result.most_waiting, static_cast<int>(jobs.size()));
    context.now_ms = now;
    context.running.clear();
    for (int i : running) {
      SchedRunning r;
      r.id = absl::StrCat(i);
      r.queue = queues ? kTeams[trace[i].team].name : "";
      r.priority = trace[i].priority;
      r.seq = state[i].seq;
      r.tasks = state[i].tasks;
      r.stopping = state[i].stopping;
      r.end_ms = state[i].started_ms + Bound(trace[i], state[i].left_ms);
      r.checkpoint_ms = state[i].started_ms;
      if (state[i].preempted > 0) r.protected_until_ms = state[i].started_ms + exempt_ms;
      context.running.push_back(std::move(r));
    }
    const double cpu = CpuSeconds();
    ScheduleDecision d = Schedule(jobs, workers, context);
    result.decide_s += CpuSeconds() - cpu;
    context.reserved_for = d.reserved_for;
    result.passes++;
    result.jobs_considered += static_cast<int64_t>(jobs.size());
    for (const Preemption& p : d.preemptions) {
      const int i = std::stoi(p.victim);
      State& s = state[i];
      // Saved at the step the ranks agree on: the work done so far is kept.
      s.left_ms -= now - s.started_ms;
      s.stopping = true;
      s.end_ms = now + kSaveMs;
      save_gpu_ms += static_cast<double>(kSaveMs) * trace[i].gpus;
      result.preemptions++;
      s.preempted++;
    }
    for (const Placement& p : d.placements) {
      const int i = std::stoi(p.job_id);
      State& s = state[i];
      const SchedJob j = sched_job(trace[i]);
      for (const std::string& w : p.rank_workers) {
        s.tasks.push_back({w, 0, j.gpus_per_rank, 0});
        workers[worker_index[w]].free_gpus -= j.gpus_per_rank;
      }
      s.running = true;
      s.started_ms = now;
      if (s.first_start < 0) s.first_start = now;
      s.end_ms = now + s.left_ms;
      pending.erase(i);
      running.insert(i);
    }
  }
  std::vector<double> waits;
  std::vector<double> jcts;
  double gang_wait = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const double wait = (state[i].first_start - trace[i].arrival_ms) / double(kMinute);
    waits.push_back(wait);
    jcts.push_back((state[i].done_ms - trace[i].arrival_ms) / double(kMinute));
    if (trace[i].gpus >= 32) gang_wait = std::max(gang_wait, wait / 60);
  }
  // Work lost: GPU time that ran and is not the jobs' own work nor a save. Zero when every
  // preemption resumes from the step it saved at, which this computes rather than assumes.
  double asked = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    asked += static_cast<double>(trace[i].duration_ms) * trace[i].gpus;
  }
  result.lost_gpu_hours = (busy_gpu_ms - asked - save_gpu_ms) / 3.6e6;
  result.save_gpu_hours = save_gpu_ms / 3.6e6;
  result.makespan_h = now / 3.6e6;
  for (const State& s : state) {
    result.jobs_preempted += s.preempted > 0;
    result.most_preempted = std::max(result.most_preempted, s.preempted);
  }
  result.utilisation = window_busy_gpu_ms / (double(total_gpus) * arrivals_end);
  result.mean_wait_min = 0;
  for (double w : waits) result.mean_wait_min += w / waits.size();
  result.p99_wait_min = Percentile(waits, 0.99);
  for (double j : jcts) result.mean_jct_min += j / jcts.size();
  result.p99_jct_min = Percentile(jcts, 0.99);
  result.longest_gang_wait_h = gang_wait;
  result.jain = jain_time > 0 ? jain_sum / jain_time : 1;
  return result;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace trainyard;  // NOLINT(build/namespaces)
  const int machines = absl::GetFlag(FLAGS_machines);
  if (machines < 8 || absl::GetFlag(FLAGS_jobs) < 1 || !(absl::GetFlag(FLAGS_load) > 0)) {
    std::fprintf(stderr,
                 "--machines must be at least 8 (a 64-GPU gang), --jobs at least 1, "
                 "--load more than 0\n");
    return 2;
  }
  for (absl::string_view policy : absl::StrSplit(absl::GetFlag(FLAGS_policies), ',')) {
    if (policy != "fifo" && policy != "backfill" && policy != "quota" && policy != "fair" &&
        policy != "preempt") {
      std::fprintf(stderr, "unknown policy '%s': fifo, backfill, quota, fair or preempt\n",
                   std::string(policy).c_str());
      return 2;
    }
  }
  const std::vector<TraceJob> trace = MakeTrace(
      absl::GetFlag(FLAGS_jobs), machines, absl::GetFlag(FLAGS_load), absl::GetFlag(FLAGS_seed));
  double gpu_hours = 0;
  for (const TraceJob& j : trace) gpu_hours += j.duration_ms / 3.6e6 * j.gpus;
  std::printf(
      "%d jobs on %d machines of %d GPUs, offered load %.2f, seed %llu: %.0f GPU-hours of work "
      "arriving over %.1f hours\n",
      static_cast<int>(trace.size()), machines, kGpusPerMachine, absl::GetFlag(FLAGS_load),
      static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)), gpu_hours,
      trace.back().arrival_ms / 3.6e6);
  std::printf(
      "| policy | GPU util | mean wait | p99 wait | mean JCT | p99 JCT | Jain (share/weight) "
      "| longest wait, >=32 GPUs | preemptions: jobs, most of one (saving) | work lost | passes "
      "| most waiting | jobs decided/s | CPU per pass |\n");
  std::printf(
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (absl::string_view policy : absl::StrSplit(absl::GetFlag(FLAGS_policies), ',')) {
    const Result r = Simulate(trace, machines, std::string(policy));
    std::printf(
        "| %s | %.1f %% | %.0f min | %.0f min | %.0f min | %.0f min | %.3f | %.1f h | %d: %d, %d "
        "(%.1f GPU-h) | %.2f GPU-h | %lld | %d | %.0f | %.2f ms |\n",
        r.policy.c_str(), 100 * r.utilisation, r.mean_wait_min, r.p99_wait_min, r.mean_jct_min,
        r.p99_jct_min, r.jain, r.longest_gang_wait_h, r.preemptions, r.jobs_preempted,
        r.most_preempted, r.save_gpu_hours, r.lost_gpu_hours, static_cast<long long>(r.passes),
        r.most_waiting, r.jobs_considered / std::max(r.decide_s, 1e-9),
        1000 * r.decide_s / std::max<int64_t>(r.passes, 1));
    std::fflush(stdout);
  }
  return 0;
}
