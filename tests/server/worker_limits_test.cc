#include "server/jobs/worker_limits.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

TEST(WorkerLimitsTest, TheFirstMatchingEntryBoundsAWorkersClaim) {
  absl::StatusOr<WorkerLimits> limits = WorkerLimits::Parse(R"(
- {name: "gpu-big-*", gpus: 16}
- {name: "gpu-*", slots: 96, gpus: 8, memory: 2TiB}
- {name: "*", slots: 8, gpus: 0, memory: 64GiB}
)");
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_TRUE(limits->Check("gpu-7", 96, 8, int64_t{2} << 40).ok());
  absl::Status over = limits->Check("gpu-7", 96, 9, 0);
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.message(),
            "gpus: worker gpu-7 claims 9, over its limit of 8 (--worker_limits_file, entry "
            "'gpu-*')");
  // Fields an entry leaves out keep the defaults; the first match wins.
  EXPECT_TRUE(limits->Check("gpu-big-1", 4096, 16, 0).ok());
  EXPECT_FALSE(limits->Check("gpu-big-1", 4097, 16, 0).ok());
  EXPECT_THAT(std::string(limits->Check("cpu-1", 8, 1, 0).message()), HasSubstr("entry '*'"));
  EXPECT_THAT(std::string(limits->Check("cpu-1", 8, 0, int64_t{65} << 30).message()),
              HasSubstr("memory_bytes: worker cpu-1 claims 65.0 GiB, over its limit of 64.0 GiB"));
}

TEST(WorkerLimitsTest, WithoutAFileEveryClaimIsStillBounded) {
  const WorkerLimits defaults;
  EXPECT_TRUE(defaults.Check("any", 4096, 64, int64_t{64} << 40).ok());
  EXPECT_FALSE(defaults.Check("any", 1, 1000000, 0).ok());
  EXPECT_TRUE(WorkerLimits::Parse("")->Check("any", 1, 64, 0).ok());
}

TEST(WorkerLimitsTest, BadFilesAreRefusedNamingTheEntry) {
  for (const auto& [yaml, message] : std::vector<std::pair<std::string, std::string>>{
           {"{name: x}", "expected a list"},
           {"- {slots: 3}", "entry 1: name: missing"},
           {"- {name: a}\n- {name: b, gpus: -1}", "entry 2: gpus: must be >= 0"},
           {"- {name: a, gpus: many}", "entry 1: gpus: must be a whole number"},
           {"- {name: a, memory: lots}", "entry 1: memory: "},
           {"- {name: a, cpus: 3}", "entry 1: cpus: unknown field"},
           {"- [", "not YAML"}}) {
    absl::StatusOr<WorkerLimits> limits = WorkerLimits::Parse(yaml);
    EXPECT_EQ(limits.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(std::string(limits.status().message()), HasSubstr(message)) << yaml;
  }
  EXPECT_EQ(WorkerLimits::Load("/nonexistent/limits.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainyard
