#ifndef TRAINYARD_COMMON_CGROUP_H_
#define TRAINYARD_COMMON_CGROUP_H_

// Reading this process's cgroups (v1 and v2) and the limits they put on it: the worker agent
// offers what its container may use, and a trainer keeps its data within its memory limit.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace trainyard {

// Where the kernel says it: tests point these at files of their own.
struct CgroupFiles {
  std::string mountinfo = "/proc/self/mountinfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string proc = "/proc";
};

struct CgroupMount {
  std::string root;               // the part of the hierarchy mounted (a container's own cgroup)
  std::string point;              // where
  std::string type;               // "cgroup" (v1) or "cgroup2"
  std::set<std::string> options;  // super options: the v1 controllers
};

std::vector<CgroupMount> ReadCgroupMounts(const std::string& mountinfo);
// The first mount of `type` (with the v1 controller `option`, when given); nullptr if none.
const CgroupMount* FindCgroupMount(const std::vector<CgroupMount>& mounts, const std::string& type,
                                   const std::string& option);
// This process's cgroup per v1 controller, and under "" its v2 cgroup.
std::map<std::string, std::string> ReadSelfCgroups(const std::string& self_cgroup);
// The folder of cgroup `path` under `mount`.
std::string CgroupDir(const CgroupMount& mount, const std::string& path);

// A whole small file; empty if it cannot be read.
std::string ReadCgroupFile(const std::string& path);
// A file holding one integer; nullopt otherwise ("max").
std::optional<int64_t> ReadCgroupInt(const std::string& path);

// The memory limit of this process's own cgroup (v1 memory.limit_in_bytes, v2 memory.max);
// 0 when it has none.
int64_t OwnCgroupMemoryLimit(const CgroupFiles& files = {});
// The memory this process may use: its cgroup's limit where it has one (a container), else the
// machine's (MemTotal); 0 if unknown.
int64_t AvailableMemoryBytes(const CgroupFiles& files = {});
// The CPUs this process may use: its cgroup's CPU quota where it has one, else the cores it may
// run on.
double AvailableCpus(const CgroupFiles& files = {});

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_CGROUP_H_
