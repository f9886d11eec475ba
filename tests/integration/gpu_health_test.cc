// GPU health on the real coordinator, agent and trainers, the GPUs those of a scripted NVML (the
// agent loads it as libnvidia-ml.so.1, as it would the driver's): an XID error on the GPU a rank
// trains on takes the GPU out of service, the job restarts on the other GPU as for a lost
// worker, nothing new is placed on the faulty GPU, and an admin's return puts it back once the
// agent's check passes.

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::Job;

// A small single-rank job that asks for one GPU (the CPU trainer trains it on the CPU).
std::string GpuJob(const std::string& name) {
  return SyntheticJobYaml(name, 100000000, "resources: {gpus_per_worker: 1}\n");
}

TEST(GpuHealthTest, AnXidTakesTheGpuOutAndItsJobMovesToAnotherUntilAnAdminReturnsIt) {
  TempDir nvml;
  std::filesystem::create_symlink(FAKE_NVML_PATH, nvml.path() + "/libnvidia-ml.so.1");
  const std::string xids = nvml.path() + "/xids";
  std::ofstream(xids).flush();
  std::ofstream(nvml.path() + "/settings")
      << "FAKE_NVML_GPUS=2\nFAKE_NVML_XID_FILE=" << xids << "\n";
  ClusterOptions options = QuickRestarts(1);
  options.slots_per_worker = 2;
  options.worker_args.push_back("--gpus=2");
  options.env["LD_LIBRARY_PATH"] = nvml.path();
  options.env["FAKE_NVML_FILE"] = nvml.path() + "/settings";
  Cluster cluster(options);

  auto first = cluster.Submit(GpuJob("on-gpu"));
  ASSERT_TRUE(first.ok()) << first.status();
  auto running = cluster.WaitFor(first->id(), [](const Job& j) {
    return j.state() == v1::RUNNING && j.progress().step() >= 5;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  // The agent gave the first free GPU, 0: a hardware XID there (79: fallen off the bus).
  std::ofstream(xids, std::ios::app) << "0 79\n";
  auto moved = cluster.WaitFor(first->id(), [](const Job& j) {
    return j.restarts_size() > 0 && j.state() == v1::RUNNING && j.generation() == 2;
  });
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->restarts(0).reason(), v1::WORKER_LOST);
  EXPECT_THAT(moved->restarts(0).message(), HasSubstr("GPU 0"));
  EXPECT_THAT(moved->tasks(0).gpu_fault(), HasSubstr("XID 79"));
  Cluster::CliResult workers = cluster.Cli({"workers"});
  EXPECT_THAT(workers.output, HasSubstr("1/2 (1 out)"));
  EXPECT_THAT(workers.output, HasSubstr("worker-0 GPU 0 out of service since"));

  // The one GPU in service is taken: a second GPU job waits, though the worker has two.
  auto second = cluster.Submit(GpuJob("waits-for-gpu"));
  ASSERT_TRUE(second.ok()) << second.status();
  auto waiting = cluster.WaitFor(
      second->id(), [](const Job& j) { return j.state() == v1::PENDING && !j.reason().empty(); });
  ASSERT_TRUE(waiting.ok()) << waiting.status();

  // Returned by an admin: the agent's check passes (NVML's readings are healthy), the GPU is back
  // in service and the waiting job is placed on it.
  Cluster::CliResult returned = cluster.Cli({"workers", "return-gpu", "worker-0", "0"});
  ASSERT_EQ(returned.exit_code, 0) << returned.output;
  auto placed =
      cluster.WaitFor(second->id(), [](const Job& j) { return j.state() == v1::RUNNING; });
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(cluster.Cli({"workers"}).output, HasSubstr("2/2"));
  // A GPU in service cannot be returned.
  Cluster::CliResult again = cluster.Cli({"workers", "return-gpu", "worker-0", "0"});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.output, HasSubstr("is in service"));
  EXPECT_EQ(cluster.Cli({"cancel", first->id()}).exit_code, 0);
  EXPECT_EQ(cluster.Cli({"cancel", second->id()}).exit_code, 0);
}

}  // namespace
}  // namespace trainyard::testing
