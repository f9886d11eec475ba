#include "worker/agent/task_isolation.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/cgroup.h"
#include "common/clock.h"
#include "common/log.h"

namespace trainyard {
namespace {

// The kernel's number of this process's PID namespace ("pid:[4026531836]" under
// PROC/self/ns/pid); 0 where it cannot be read.
uint64_t OwnPidNamespace(const std::string& proc) {
  char link[64];
  const ssize_t n = readlink((proc + "/self/ns/pid").c_str(), link, sizeof(link) - 1);
  if (n <= 0) return 0;
  absl::string_view text(link, static_cast<size_t>(n));
  uint64_t id = 0;
  if (!absl::ConsumePrefix(&text, "pid:[") || !absl::ConsumeSuffix(&text, "]") ||
      !absl::SimpleAtoi(text, &id)) {
    return 0;
  }
  return id;
}

// CPU quota period: 100 ms, the kernel's default.
constexpr int64_t kCpuPeriodUs = 100000;

// Writes `value` to an existing (kernel) file; the error names the file and the value.
absl::Status WriteValue(const std::string& path, absl::string_view value) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  }
  const ssize_t n = write(fd, value.data(), value.size());
  const int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("write '", value, "' to ", path, ": ", std::strerror(n < 0 ? err : EIO)));
  }
  return absl::OkStatus();
}

// The value of `key` in a file of "key value" lines (memory.events, memory.oom_control).
std::optional<int64_t> ReadKeyed(const std::string& path, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(ReadCgroupFile(path), '\n')) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t v;
    if (parts.size() == 2 && parts[0] == key && absl::SimpleAtoi(parts[1], &v)) return v;
  }
  return std::nullopt;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

absl::Status MakeDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("mkdir ", dir, ": ", std::strerror(errno)));
}

std::vector<pid_t> Procs(const std::string& dir) {
  std::vector<pid_t> pids;
  for (absl::string_view line : absl::StrSplit(ReadCgroupFile(dir + "/cgroup.procs"), '\n')) {
    int pid;
    if (absl::SimpleAtoi(line, &pid) && pid > 0) pids.push_back(pid);
  }
  return pids;
}

// Removes a task's cgroup folder, killing what is left in it; false when it must be retried.
bool RemoveCgroup(const std::string& dir) {
  if (rmdir(dir.c_str()) == 0 || errno == ENOENT) return true;
  if (errno != EBUSY) {
    LogWarning("cannot remove cgroup ", dir, ": ", std::strerror(errno));
    return true;  // nothing retrying would change
  }
  for (pid_t pid : Procs(dir)) kill(pid, SIGKILL);
  return rmdir(dir.c_str()) == 0 || errno == ENOENT;
}

// Removes the task cgroups an earlier run of the agent left under `base`.
void RemoveChildren(const std::string& base) {
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return;
  std::vector<std::string> dirs;
  while (struct dirent* e = readdir(d)) {
    if (e->d_type == DT_DIR && std::strcmp(e->d_name, ".") != 0 &&
        std::strcmp(e->d_name, "..") != 0) {
      dirs.push_back(absl::StrCat(base, "/", e->d_name));
    }
  }
  closedir(d);
  for (const std::string& dir : dirs) {
    if (!RemoveCgroup(dir)) LogWarning("cgroup ", dir, " of an earlier run is still busy");
  }
}

// "trainyard.{name}.{pidns}.{pid}": the agent's own cgroup, unique to its process; the PID
// namespace in it because agents in several PID namespaces (containers, test sandboxes) may share
// one cgroup tree, and a pid means something only in its own namespace.
std::string CgroupName(const IsolationOptions& options, uint64_t pid_namespace) {
  return absl::StrCat("trainyard.", options.name, ".", pid_namespace, ".", getpid());
}

}  // namespace

std::string AgentCgroupName(const IsolationOptions& options) {
  return CgroupName(options, OwnPidNamespace(options.proc));
}

namespace {

// Removes the agent cgroups of agents of this name that are gone (their trainers with them):
// those an agent killed by SIGKILL left under `parent`. Only agents of this agent's PID
// namespace are judged (by their pid); another namespace's are left to that namespace's agents.
// A name with a pid alone is an agent's from before the namespace was named, judged by the pid.
void RemoveDeadAgents(const std::string& parent, const IsolationOptions& options,
                      uint64_t pid_namespace) {
  const std::string prefix = absl::StrCat("trainyard.", options.name, ".");
  const std::string own_namespace = absl::StrCat(pid_namespace);
  DIR* d = opendir(parent.c_str());
  if (d == nullptr) return;
  std::vector<std::string> dead;
  while (struct dirent* e = readdir(d)) {
    absl::string_view entry = e->d_name;
    if (e->d_type != DT_DIR || !absl::ConsumePrefix(&entry, prefix)) continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, '.');
    if (parts.size() > 2 || (parts.size() == 2 && parts[0] != own_namespace)) continue;
    int pid;
    if (!absl::SimpleAtoi(parts.back(), &pid) || pid == getpid()) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) dead.push_back(absl::StrCat(parent, "/", e->d_name));
  }
  closedir(d);
  for (const std::string& dir : dead) {
    RemoveChildren(dir);
    if (!RemoveCgroup(dir)) LogWarning("cgroup ", dir, " of an earlier agent is still busy");
  }
}

// One cgroup (v2) or one per controller (v1: memory, cpu) per task.
class CgroupIsolation final : public TaskIsolation {
 public:
  // v2: memory_base == cpu_base. `cpu`: CPU quotas are set (v2 without the cpu controller
  // delegated: memory limits only).
  CgroupIsolation(bool v2, std::string memory_base, std::string cpu_base, bool cpu = true)
      : v2_(v2), cpu_(cpu), memory_base_(std::move(memory_base)), cpu_base_(std::move(cpu_base)) {}
  // The agent's own cgroups go with it (what is still running in them is killed).
  ~CgroupIsolation() override {
    for (const std::string& base : {memory_base_, cpu_base_}) {
      RemoveChildren(base);
      RemoveCgroup(base);
    }
  }

  std::string Name() const override {
    return v2_ ? (cpu_ ? "cgroup v2" : "cgroup v2 (memory only)") : "cgroup v1";
  }

  absl::StatusOr<std::vector<std::string>> Prepare(const std::string& task_id,
                                                   const TaskLimits& limits) override {
    RetryLingering();
    const std::string memory_dir = absl::StrCat(memory_base_, "/", task_id);
    const std::string cpu_dir = absl::StrCat(cpu_base_, "/", task_id);
    auto undo = [&](absl::Status s) {
      RemoveCgroup(memory_dir);
      if (!v2_) RemoveCgroup(cpu_dir);
      return s;
    };
    if (absl::Status s = MakeDir(memory_dir); !s.ok()) return s;
    const int64_t memory = limits.memory_bytes;
    const int64_t quota =
        limits.cpus > 0 ? std::max<int64_t>(1000, std::llround(limits.cpus * kCpuPeriodUs)) : 0;
    if (v2_) {
      if (absl::Status s =
              WriteValue(memory_dir + "/memory.max", memory > 0 ? absl::StrCat(memory) : "max");
          !s.ok()) {
        return undo(s);
      }
      // Over the limit is out of memory, not swapped out; and the whole task goes at once.
      if (memory > 0 && Exists(memory_dir + "/memory.swap.max")) {
        WriteValue(memory_dir + "/memory.swap.max", "0").IgnoreError();
      }
      WriteValue(memory_dir + "/memory.oom.group", "1").IgnoreError();
      if (cpu_) {
        if (absl::Status s = WriteValue(
                memory_dir + "/cpu.max",
                absl::StrCat(quota > 0 ? absl::StrCat(quota) : "max", " ", kCpuPeriodUs));
            !s.ok()) {
          return undo(s);
        }
      }
    } else {
      if (memory > 0) {
        if (absl::Status s =
                WriteValue(memory_dir + "/memory.limit_in_bytes", absl::StrCat(memory));
            !s.ok()) {
          return undo(s);
        }
        if (Exists(memory_dir + "/memory.memsw.limit_in_bytes")) {
          WriteValue(memory_dir + "/memory.memsw.limit_in_bytes", absl::StrCat(memory))
              .IgnoreError();
        }
      }
      // A CPU group of its own only for a quota: without one it would hold nothing back and only
      // add a level that the scheduler walks at every switch; the task stays in the agent's.
      if (quota > 0) {
        if (absl::Status s = MakeDir(cpu_dir); !s.ok()) return undo(s);
        if (absl::Status s = WriteValue(cpu_dir + "/cpu.cfs_period_us", absl::StrCat(kCpuPeriodUs));
            !s.ok()) {
          return undo(s);
        }
        if (absl::Status s = WriteValue(cpu_dir + "/cpu.cfs_quota_us", absl::StrCat(quota));
            !s.ok()) {
          return undo(s);
        }
      }
    }
    absl::MutexLock lock(&mu_);
    limits_[task_id] = memory;
    std::vector<std::string> join = {memory_dir + "/cgroup.procs"};
    if (!v2_ && quota > 0) join.push_back(cpu_dir + "/cgroup.procs");
    return join;
  }

  void Started(const std::string&, pid_t) override {}

  std::vector<std::string> OverLimit() override { return {}; }

  TaskMemoryEnd Finish(const std::string& task_id, int exit_code, int signal) override {
    TaskMemoryEnd end;
    const std::string memory_dir = absl::StrCat(memory_base_, "/", task_id);
    {
      absl::MutexLock lock(&mu_);
      auto it = limits_.find(task_id);
      if (it != limits_.end()) {
        end.limit_bytes = it->second;
        limits_.erase(it);
      }
    }
    const std::optional<int64_t> kills =
        ReadKeyed(memory_dir + (v2_ ? "/memory.events" : "/memory.oom_control"), "oom_kill");
    const std::optional<int64_t> peak =
        ReadCgroupInt(memory_dir + (v2_ ? "/memory.peak" : "/memory.max_usage_in_bytes"));
    end.peak_bytes = peak.value_or(0);
    // A helper process killed for memory does not make a task that succeeded a failure.
    end.out_of_memory = kills.value_or(0) > 0 && (exit_code != 0 || signal != 0);
    end.how = "the kernel's OOM killer in its cgroup";
    absl::MutexLock lock(&mu_);
    if (!RemoveCgroup(memory_dir)) lingering_.push_back(memory_dir);
    if (!v2_) {
      const std::string cpu_dir = absl::StrCat(cpu_base_, "/", task_id);
      if (!RemoveCgroup(cpu_dir)) lingering_.push_back(cpu_dir);
    }
    return end;
  }

 private:
  void RetryLingering() {
    absl::MutexLock lock(&mu_);
    lingering_.erase(std::remove_if(lingering_.begin(), lingering_.end(), RemoveCgroup),
                     lingering_.end());
  }

  const bool v2_;
  const bool cpu_;
  const std::string memory_base_;
  const std::string cpu_base_;
  absl::Mutex mu_;
  std::map<std::string, int64_t> limits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> lingering_ ABSL_GUARDED_BY(mu_);  // cgroups to remove when empty
};

// No cgroups: the resident memory of each task's process group, read from /proc, against its limit.
class WatchIsolation final : public TaskIsolation {
 public:
  WatchIsolation(std::string proc, absl::Duration interval)
      : proc_(std::move(proc)), interval_(interval), page_(sysconf(_SC_PAGESIZE)) {}

  std::string Name() const override { return "watch"; }

  absl::StatusOr<std::vector<std::string>> Prepare(const std::string& task_id,
                                                   const TaskLimits& limits) override {
    absl::MutexLock lock(&mu_);
    tasks_[task_id].limit = limits.memory_bytes;
    return std::vector<std::string>();
  }

  void Started(const std::string& task_id, pid_t pid) override {
    absl::MutexLock lock(&mu_);
    tasks_[task_id].group = pid;
  }

  std::vector<std::string> OverLimit() override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = RealClock::Get().Now();
    if (tasks_.empty() || now < next_scan_) return {};
    next_scan_ = now + interval_;
    std::map<pid_t, int64_t> rss = GroupRss();
    std::vector<std::string> over;
    for (auto& [id, t] : tasks_) {
      if (t.group <= 0 || t.killed) continue;
      auto it = rss.find(t.group);
      if (it == rss.end()) continue;
      t.peak = std::max(t.peak, it->second);
      if (t.limit > 0 && it->second > t.limit) {
        t.killed = true;
        over.push_back(id);
      }
    }
    return over;
  }

  TaskMemoryEnd Finish(const std::string& task_id, int, int) override {
    absl::MutexLock lock(&mu_);
    TaskMemoryEnd end;
    auto it = tasks_.find(task_id);
    if (it == tasks_.end()) return end;
    end.out_of_memory = it->second.killed;
    end.limit_bytes = it->second.limit;
    end.peak_bytes = it->second.peak;
    end.how = "the agent's watch of its resident memory (no cgroups on this worker)";
    tasks_.erase(it);
    return end;
  }

 private:
  struct Watched {
    int64_t limit = 0;
    pid_t group = 0;  // the task leads its process group
    int64_t peak = 0;
    bool killed = false;
  };

  // Resident bytes by process group, over every process of /proc.
  std::map<pid_t, int64_t> GroupRss() const {
    std::map<pid_t, int64_t> out;
    DIR* d = opendir(proc_.c_str());
    if (d == nullptr) return out;
    while (struct dirent* e = readdir(d)) {
      int pid;
      if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
      const std::string stat = ReadCgroupFile(absl::StrCat(proc_, "/", pid, "/stat"));
      // "PID (COMM) STATE PPID PGRP SESSION ..." with RSS (pages) the 24th field; COMM may hold
      // spaces and parentheses, so fields are counted from its last ')'.
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::vector<absl::string_view> f =
          absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
      int64_t group = 0;
      int64_t pages = 0;
      if (f.size() < 22 || !absl::SimpleAtoi(f[2], &group) || !absl::SimpleAtoi(f[21], &pages)) {
        continue;
      }
      out[static_cast<pid_t>(group)] += pages * page_;
    }
    closedir(d);
    return out;
  }

  const std::string proc_;
  const absl::Duration interval_;
  const int64_t page_;
  absl::Mutex mu_;
  std::map<std::string, Watched> tasks_ ABSL_GUARDED_BY(mu_);
  absl::Time next_scan_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// `*notes`: what the hierarchy does not give (the cpu controller), for the agent's start-up line.
absl::StatusOr<std::unique_ptr<TaskIsolation>> SetUpV2(const IsolationOptions& options,
                                                       std::string* notes) {
  const std::vector<CgroupMount> mounts = ReadCgroupMounts(options.mountinfo);
  const CgroupMount* mount = FindCgroupMount(mounts, "cgroup2", "");
  std::map<std::string, std::string> self = ReadSelfCgroups(options.self_cgroup);
  if (mount == nullptr || !self.count("")) {
    return absl::FailedPreconditionError("no cgroup v2 file system is mounted");
  }
  const std::string own = CgroupDir(*mount, self[""]);
  const uint64_t pid_namespace = OwnPidNamespace(options.proc);
  const std::string name = CgroupName(options, pid_namespace);
  const std::set<std::string> controllers =
      absl::StrSplit(absl::StripAsciiWhitespace(ReadCgroupFile(own + "/cgroup.controllers")), ' ',
                     absl::SkipEmpty());
  const std::string have = controllers.empty() ? "none" : absl::StrJoin(controllers, " ");
  if (!controllers.count("memory")) {
    return absl::FailedPreconditionError(
        absl::StrCat("cgroup v2 at ", own, " offers no memory controller (it has: ", have, ")"));
  }
  // Memory limits are what protect the neighbours and the agent: without the cpu controller
  // (some sandboxes delegate memory alone) tasks still get them, and no CPU quota.
  const bool cpu = controllers.count("cpu") > 0;
  if (!cpu && notes != nullptr) {
    *notes = absl::StrCat("cgroup v2 at ", own, " offers no cpu controller (it has: ", have,
                          "): CPU quotas are not enforced");
  }
  const std::string enable = cpu ? "+memory +cpu" : "+memory";
  // A cgroup that hands controllers to its children may hold no process itself: where the agent
  // is alone in its cgroup (a container), it moves into a leaf of its own first.
  if (!WriteValue(own + "/cgroup.subtree_control", enable).ok()) {
    const std::vector<pid_t> procs = Procs(own);
    if (procs.size() != 1 || procs[0] != getpid()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cgroup v2 at ", own, " holds other processes than the agent (",
                       procs.size(), "), so it cannot hand its controllers to task cgroups"));
    }
    const std::string leaf = absl::StrCat(own, "/", name, ".agent");
    if (absl::Status s = MakeDir(leaf); !s.ok()) return s;
    if (absl::Status s = WriteValue(leaf + "/cgroup.procs", "0"); !s.ok()) return s;
    if (absl::Status s = WriteValue(own + "/cgroup.subtree_control", enable); !s.ok()) {
      return s;
    }
  }
  RemoveDeadAgents(own, options, pid_namespace);
  const std::string base = absl::StrCat(own, "/", name);
  if (absl::Status s = MakeDir(base); !s.ok()) return s;
  if (absl::Status s = WriteValue(
          base + "/memory.max",
          options.total_memory_bytes > 0 ? absl::StrCat(options.total_memory_bytes) : "max");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteValue(base + "/cgroup.subtree_control", enable); !s.ok()) {
    return s;
  }
  return std::unique_ptr<TaskIsolation>(new CgroupIsolation(true, base, base, cpu));
}

absl::StatusOr<std::unique_ptr<TaskIsolation>> SetUpV1(const IsolationOptions& options) {
  const std::vector<CgroupMount> mounts = ReadCgroupMounts(options.mountinfo);
  const CgroupMount* memory = FindCgroupMount(mounts, "cgroup", "memory");
  const CgroupMount* cpu = FindCgroupMount(mounts, "cgroup", "cpu");
  std::map<std::string, std::string> self = ReadSelfCgroups(options.self_cgroup);
  if (memory == nullptr || cpu == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no cgroup v1 ", memory == nullptr ? "memory" : "cpu", " controller is mounted"));
  }
  const std::string memory_parent = CgroupDir(*memory, self["memory"]);
  const std::string cpu_parent = CgroupDir(*cpu, self["cpu"]);
  const uint64_t pid_namespace = OwnPidNamespace(options.proc);
  RemoveDeadAgents(memory_parent, options, pid_namespace);
  RemoveDeadAgents(cpu_parent, options, pid_namespace);
  const std::string name = CgroupName(options, pid_namespace);
  const std::string memory_base = absl::StrCat(memory_parent, "/", name);
  const std::string cpu_base = absl::StrCat(cpu_parent, "/", name);
  for (const std::string& base : {memory_base, cpu_base}) {
    if (absl::Status s = MakeDir(base); !s.ok()) return s;
  }
  // Children's limits count against the parent's only with the hierarchy on (always, since 5.x).
  if (ReadCgroupInt(memory_base + "/memory.use_hierarchy").value_or(1) != 1) {
    WriteValue(memory_base + "/memory.use_hierarchy", "1").IgnoreError();
  }
  if (options.total_memory_bytes > 0) {
    if (absl::Status s = WriteValue(memory_base + "/memory.limit_in_bytes",
                                    absl::StrCat(options.total_memory_bytes));
        !s.ok()) {
      return s;
    }
  }
  return std::unique_ptr<TaskIsolation>(new CgroupIsolation(false, memory_base, cpu_base));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TaskIsolation>> NewTaskIsolation(const IsolationOptions& options,
                                                                std::string* notes) {
  const std::string& mode = options.mode;
  if (mode != "auto" && mode != "cgroup-v2" && mode != "cgroup-v1" && mode != "watch") {
    return absl::InvalidArgumentError(
        absl::StrCat("isolation '", mode, "': use auto, cgroup-v2, cgroup-v1 or watch"));
  }
  std::vector<std::string> why;
  if (mode == "auto" || mode == "cgroup-v2") {
    absl::StatusOr<std::unique_ptr<TaskIsolation>> v2 = SetUpV2(options, notes);
    if (v2.ok() || mode == "cgroup-v2") return v2;
    why.push_back(absl::StrCat("cgroup v2: ", v2.status().message()));
  }
  if (mode == "auto" || mode == "cgroup-v1") {
    absl::StatusOr<std::unique_ptr<TaskIsolation>> v1 = SetUpV1(options);
    if (v1.ok() || mode == "cgroup-v1") return v1;
    why.push_back(absl::StrCat("cgroup v1: ", v1.status().message()));
  }
  if (notes != nullptr) *notes = absl::StrJoin(why, "; ");
  return std::unique_ptr<TaskIsolation>(new WatchIsolation(options.proc, options.watch_interval));
}

}  // namespace trainyard
