#include "common/cgroup.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainyard {
namespace {

// A v1 limit at or above this is "no limit" (the kernel shows unlimited as 2^63 rounded down to
// a page).
constexpr int64_t kNoLimit = int64_t{1} << 62;

}  // namespace

std::string ReadCgroupFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::optional<int64_t> ReadCgroupInt(const std::string& path) {
  int64_t v;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadCgroupFile(path)), &v)) return std::nullopt;
  return v;
}

std::vector<CgroupMount> ReadCgroupMounts(const std::string& mountinfo) {
  std::vector<CgroupMount> mounts;
  for (absl::string_view line : absl::StrSplit(ReadCgroupFile(mountinfo), '\n')) {
    // ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    if (*(dash + 1) != "cgroup" && *(dash + 1) != "cgroup2") continue;
    CgroupMount m;
    m.root = f[3];
    m.point = f[4];
    m.type = *(dash + 1);
    for (absl::string_view o : absl::StrSplit(*(dash + 3), ',')) m.options.emplace(o);
    mounts.push_back(std::move(m));
  }
  return mounts;
}

const CgroupMount* FindCgroupMount(const std::vector<CgroupMount>& mounts, const std::string& type,
                                   const std::string& option) {
  for (const CgroupMount& m : mounts) {
    if (m.type == type && (option.empty() || m.options.count(option))) return &m;
  }
  return nullptr;
}

std::map<std::string, std::string> ReadSelfCgroups(const std::string& self_cgroup) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(ReadCgroupFile(self_cgroup), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[1].empty()) {
      out[""] = f[2];
      continue;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) out[std::string(c)] = f[2];
  }
  return out;
}

std::string CgroupDir(const CgroupMount& mount, const std::string& path) {
  absl::string_view rel = path;
  if (mount.root != "/" && absl::StartsWith(rel, mount.root)) rel.remove_prefix(mount.root.size());
  rel = absl::StripPrefix(rel, "/");
  return rel.empty() ? mount.point : absl::StrCat(mount.point, "/", rel);
}

int64_t OwnCgroupMemoryLimit(const CgroupFiles& files) {
  const std::vector<CgroupMount> mounts = ReadCgroupMounts(files.mountinfo);
  std::map<std::string, std::string> self = ReadSelfCgroups(files.self_cgroup);
  std::optional<int64_t> limit;
  if (const CgroupMount* v1 = FindCgroupMount(mounts, "cgroup", "memory");
      v1 != nullptr && self.count("memory")) {
    limit = ReadCgroupInt(CgroupDir(*v1, self["memory"]) + "/memory.limit_in_bytes");
  } else if (const CgroupMount* v2 = FindCgroupMount(mounts, "cgroup2", "");
             v2 != nullptr && self.count("")) {
    limit = ReadCgroupInt(CgroupDir(*v2, self[""]) + "/memory.max");  // "max" reads as none
  }
  return limit.has_value() && *limit > 0 && *limit < kNoLimit ? *limit : 0;
}

int64_t AvailableMemoryBytes(const CgroupFiles& files) {
  int64_t total = 0;
  std::ifstream in(files.proc + "/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "MemTotal:")) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) total = kib * 1024;
  }
  const int64_t limit = OwnCgroupMemoryLimit(files);
  if (limit > 0) total = total > 0 ? std::min(total, limit) : limit;
  return total;
}

double AvailableCpus(const CgroupFiles& files) {
  double cpus = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  const std::vector<CgroupMount> mounts = ReadCgroupMounts(files.mountinfo);
  std::map<std::string, std::string> self = ReadSelfCgroups(files.self_cgroup);
  double quota_cpus = 0;
  if (const CgroupMount* v1 = FindCgroupMount(mounts, "cgroup", "cpu");
      v1 != nullptr && self.count("cpu")) {
    const std::string dir = CgroupDir(*v1, self["cpu"]);
    const std::optional<int64_t> quota = ReadCgroupInt(dir + "/cpu.cfs_quota_us");
    const std::optional<int64_t> period = ReadCgroupInt(dir + "/cpu.cfs_period_us");
    if (quota && period && *quota > 0 && *period > 0) {
      quota_cpus = static_cast<double>(*quota) / static_cast<double>(*period);
    }
  } else if (const CgroupMount* v2 = FindCgroupMount(mounts, "cgroup2", "");
             v2 != nullptr && self.count("")) {
    std::vector<std::string> f = absl::StrSplit(
        absl::StripAsciiWhitespace(ReadCgroupFile(CgroupDir(*v2, self[""]) + "/cpu.max")), ' ');
    int64_t quota, period;
    if (f.size() == 2 && absl::SimpleAtoi(f[0], &quota) && absl::SimpleAtoi(f[1], &period) &&
        quota > 0 && period > 0) {
      quota_cpus = static_cast<double>(quota) / static_cast<double>(period);
    }
  }
  return quota_cpus > 0 ? std::min(cpus, quota_cpus) : cpus;
}

}  // namespace trainyard
