// The program host's parts alone (worker/trainer/program/): torchrun's layout, the program's
// environment, finding its command, the paths a checkpoint or workdir may hold, and a program's
// checkpoint sent up and brought back (and refused when it was changed).

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/program_env.h"
#include "common/storage/checkpoint_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scratch_files.h"
#include "tests/common/test_stores.h"
#include "worker/trainer/program/agent_store.h"
#include "worker/trainer/program/environment.h"
#include "worker/trainer/program/files.h"

namespace trainyard::trainer::program {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::ReadText;
using testing::ScratchFolder;
using testing::WriteText;

TEST(ProgramLayoutTest, MachinesInRankOrderAndEachMachinesGpusInLocalRankOrder) {
  // Ranks 0 and 2 on machine a, 1 and 3 on b, one GPU each.
  const std::vector<Peer> peers = {{"a", "3"}, {"b", "0"}, {"a", "1"}, {"b", "2"}};
  const Layout r2 = LayoutOf(peers, 2);
  EXPECT_EQ(r2.group_rank, 0);
  EXPECT_EQ(r2.group_world_size, 2);
  EXPECT_EQ(r2.local_rank, 1);
  EXPECT_EQ(r2.local_world_size, 2);
  // set_device(LOCAL_RANK) picks device 1 of "3,1": GPU 1, rank 2's own.
  EXPECT_EQ(r2.cuda_visible_devices, "3,1");
  const Layout r1 = LayoutOf(peers, 1);
  EXPECT_EQ(r1.group_rank, 1);
  EXPECT_EQ(r1.local_rank, 0);
  EXPECT_EQ(r1.cuda_visible_devices, "0,2");
  const Layout alone = LayoutOf({{"a", ""}}, 0);
  EXPECT_EQ(alone.local_world_size, 1);
  EXPECT_EQ(alone.cuda_visible_devices, "");
}

TEST(ProgramEnvironmentTest, TorchrunsTrainyardsAndTheSpecsWithoutTheTrainersOwn) {
  v1::Task task;
  task.set_job_id("j-1");
  task.set_generation(3);
  task.set_rank(1);
  task.set_world_size(4);
  task.mutable_spec()->mutable_checkpoint()->set_every_steps(50);
  (*task.mutable_spec()->mutable_program()->mutable_env())["LR"] = "0.1";
  Layout layout;
  layout.local_rank = 1;
  layout.local_world_size = 2;
  layout.group_rank = 0;
  layout.group_world_size = 2;
  layout.cuda_visible_devices = "0,1";
  Paths paths;
  paths.workdir = "/t/program";
  paths.checkpoint_dir = "/t/checkpoint";
  paths.restore_dir = "/t/restore";
  paths.socket = "/t/trainyard.sock";
  paths.step_file = "/t/last-step";
  paths.python_module_dir = "/share/py";
  const auto list = ProgramEnvironment(task, layout, {"10.0.0.5:29500"}, paths, 40,
                                       {{"PATH", "/usr/bin"},
                                        {"PYTHONPATH", "/mine"},
                                        {"TRAINYARD_CACHE_DIR", "/c"},
                                        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                        {"TRAINYARD_TEST_HOLD_DIR", "/h"},
                                        {"CUDA_VISIBLE_DEVICES", "1"},
                                        {"AWS_ACCESS_KEY_ID", "task-key"}});
  const std::map<std::string, std::string> env(list.begin(), list.end());
  EXPECT_EQ(env.at("RANK"), "1");
  EXPECT_EQ(env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("LOCAL_RANK"), "1");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(env.at("GROUP_RANK"), "0");
  EXPECT_EQ(env.at("MASTER_ADDR"), "10.0.0.5");
  EXPECT_EQ(env.at("MASTER_PORT"), "29500");
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "0,1");  // the machine's, not the trainer's
  EXPECT_EQ(env.at("PYTHONPATH"), "/share/py:/mine");
  EXPECT_EQ(env.at("TRAINYARD_JOB_ID"), "j-1");
  EXPECT_EQ(env.at("TRAINYARD_ATTEMPT"), "3");
  EXPECT_EQ(env.at("TRAINYARD_RESTORE_DIR"), "/t/restore");
  EXPECT_EQ(env.at("TRAINYARD_RESTORE_STEP"), "40");
  EXPECT_EQ(env.at("TRAINYARD_CHECKPOINT_EVERY_STEPS"), "50");
  EXPECT_EQ(env.at("TRAINYARD_SOCKET"), "/t/trainyard.sock");
  EXPECT_EQ(env.at("TRAINYARD_STEP_FILE"), "/t/last-step");
  EXPECT_EQ(env.at("LR"), "0.1");
  EXPECT_EQ(env.at("PATH"), "/usr/bin");
  EXPECT_EQ(env.at("AWS_ACCESS_KEY_ID"), "task-key");  // the S3 gateway's key for the task
  EXPECT_EQ(env.count("TRAINYARD_CACHE_DIR"), 0u);     // the trainer's own, not the program's
  EXPECT_EQ(env.count("TRAINYARD_TEST_HOLD_DIR"), 0u);
  // Rank 0's program serves the store: the trainer's own setting does not say otherwise.
  EXPECT_EQ(env.count("TORCHELASTIC_USE_AGENT_STORE"), 0u);
  EXPECT_EQ(env.count("USE_LIBUV"), 0u);
  // A first start restores nothing; a store on rank 0's host is said as torchrun says it.
  StorePlace on_host{"h:1", /*on_host=*/true};
  const auto fresh = ProgramEnvironment(task, layout, on_host, Paths{}, 0, {});
  const std::map<std::string, std::string> fresh_env(fresh.begin(), fresh.end());
  EXPECT_EQ(fresh_env.count("TRAINYARD_RESTORE_DIR"), 0u);
  EXPECT_EQ(fresh_env.at("TORCHELASTIC_USE_AGENT_STORE"), "True");
  // A worker whose torch makes stores only without libuv tells PyTorch so, unless told otherwise.
  StorePlace without_libuv{"h:1", /*on_host=*/false, /*without_libuv=*/true};
  auto plain = ProgramEnvironment(task, layout, without_libuv, Paths{}, 0, {});
  EXPECT_THAT(plain,
              ::testing::Contains(std::make_pair(std::string("USE_LIBUV"), std::string("0"))));
  plain = ProgramEnvironment(task, layout, without_libuv, Paths{}, 0, {{"USE_LIBUV", "1"}});
  EXPECT_THAT(plain,
              ::testing::Contains(std::make_pair(std::string("USE_LIBUV"), std::string("1"))));
}

// The ranks' store is served on rank 0's host only for a Python whose torch is the trainer's
// release, which is read without importing that torch.
TEST(AgentStoreTest, APythonsTorchIsReadWithoutImportingIt) {
  EXPECT_TRUE(IsPython("/usr/bin/python3"));
  EXPECT_TRUE(IsPython("python"));
  EXPECT_TRUE(IsPython("/opt/venv/bin/python3.11"));
  EXPECT_FALSE(IsPython("/usr/bin/bash"));
  EXPECT_FALSE(IsPython("python3-config"));
  EXPECT_FALSE(IsPython("/home/python3/train.sh"));
  EXPECT_TRUE(SameTorchRelease("1.13.0a0", "1.13.0"));
  EXPECT_TRUE(SameTorchRelease("2.6.0+cpu", "2.6.0"));
  EXPECT_FALSE(SameTorchRelease("2.6.1", "2.6.0"));
  EXPECT_FALSE(SameTorchRelease("2.11.0", "2.1.10"));
  EXPECT_FALSE(SameTorchRelease("", "1.13.0"));
  EXPECT_FALSE(SameTorchRelease("nightly", "nightly"));
  // A torch in the program's folder comes first, as for `python3 train.py`; its __init__ would
  // fail if it were imported.
  ScratchFolder dir;
  WriteText(dir.path() + "/torch/__init__.py", "raise SystemExit(7)\n");
  WriteText(dir.path() + "/torch/version.py", "__version__ = '9.8.7+local'\ncuda = None\n");
  absl::StatusOr<std::string> version =
      ProgramTorchVersion("/usr/bin/python3", {{"PYTHONPATH", "/nonexistent"}}, dir.path());
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, "9.8.7+local");
  // The machine's own (Debian's python3-torch), which the trainer's LibTorch matches.
  ScratchFolder empty;
  version = ProgramTorchVersion("/usr/bin/python3", {}, empty.path());
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_TRUE(SameTorchRelease(*version, TrainerTorchVersion())) << *version;
  // The trainer's LibTorch serves a store its release's clients reach with PyTorch's defaults
  // (Debian 12's 1.13 has no libuv choice; Debian 13's 2.6 lacks libuv and serves none).
  if (TorchStoreDefaultsWork()) {
    absl::StatusOr<std::unique_ptr<AgentStore>> store = ServeTorchStore(2);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_GT((*store)->port(), 0);
  } else {
    EXPECT_FALSE(ServeTorchStore(2).ok());
  }
  // A Python that cannot run is an error, not a version.
  EXPECT_FALSE(ProgramTorchVersion(empty.path() + "/python3", {}, empty.path()).ok());
}

TEST(FindCommandTest, PathThenWorkdirAndPathsWithASlashAsTheyAre) {
  ScratchFolder dir;
  WriteText(dir.path() + "/bin/tool", "#!/bin/sh\n");
  ::chmod((dir.path() + "/bin/tool").c_str(), 0755);
  WriteText(dir.path() + "/work/run.sh", "#!/bin/sh\n");
  ::chmod((dir.path() + "/work/run.sh").c_str(), 0755);
  WriteText(dir.path() + "/work/data.txt", "not executable");
  const std::string path = "/nonexistent:" + dir.path() + "/bin";
  EXPECT_EQ(*FindCommand("tool", path, dir.path() + "/work"), dir.path() + "/bin/tool");
  EXPECT_EQ(*FindCommand("run.sh", path, dir.path() + "/work"), dir.path() + "/work/run.sh");
  EXPECT_EQ(*FindCommand("./run.sh", path, dir.path() + "/work"), dir.path() + "/work/./run.sh");
  absl::StatusOr<std::string> missing = FindCommand("trian.py", path, dir.path() + "/work");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("'trian.py' was not found on this worker"));
  EXPECT_FALSE(FindCommand("./data.txt", path, dir.path() + "/work").ok());
}

TEST(ProgramFilesTest, ACheckpointGoesUpByAttemptAndComesBackVerified) {
  ScratchFolder dir;
  WriteText(dir.path() + "/ckpt/model.pt", "weights");
  WriteText(dir.path() + "/ckpt/shards/0.bin", std::string(100000, 'x'));
  MemoryStore store;
  const std::string step = "mem://c/job/step-000000000010";
  absl::StatusOr<std::vector<StoredFile>> files = UploadFiles(store, dir.path() + "/ckpt", step, 7);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].name, "g7/model.pt");
  EXPECT_EQ((*files)[1].name, "g7/shards/0.bin");
  EXPECT_EQ((*files)[1].size, 100000);
  ASSERT_TRUE(
      store.Put(step + "/" + ManifestName(7), EncodeManifest("job", 10, 7, 1, *files)).ok());

  const std::string restore = dir.path() + "/restore";
  absl::StatusOr<int64_t> restored = RestoreCheckpoint(store, step, restore);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 10);
  EXPECT_EQ(ReadText(restore + "/model.pt"), "weights");
  EXPECT_EQ(ReadText(restore + "/shards/0.bin"), std::string(100000, 'x'));

  // A changed object: DATA_LOSS naming it, and nothing left half restored.
  ASSERT_TRUE(store.Put(step + "/g7/model.pt", "weightz").ok());
  restored = RestoreCheckpoint(store, step, restore);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("g7/model.pt"));
  EXPECT_TRUE(fs::is_empty(restore));
}

TEST(ProgramFilesTest, AManifestNamingAPathOutsideIsRefused) {
  MemoryStore store;
  const std::string step = "mem://c/job/step-000000000010";
  ASSERT_TRUE(store
                  .Put(step + "/" + ManifestName(1),
                       EncodeManifest("job", 10, 1, 1, {{"g1/../../../etc/cron.d/x", 1, "00"}}))
                  .ok());
  ScratchFolder dir;
  absl::StatusOr<int64_t> restored = RestoreCheckpoint(store, step, dir.path() + "/restore");
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(restored.status().message(), HasSubstr("not a safe name"));
}

// Found by fuzz_checkpoint: a field of another type ended the trainer with nlohmann's
// type_error, where a bad manifest is an error like any other.
TEST(ProgramFilesTest, AManifestWithFieldsOfOtherTypesIsRefusedNotThrown) {
  for (const char* text : {R"({"format": {"name": "cosine"}, "objects": [], "step": 1})",
                           R"({"format": 7, "objects": [], "step": 1})", R"([{"format": "x"}])",
                           R"({"format": "trainyard-checkpoint/1", "objects": {}, "step": "1"})"}) {
    absl::StatusOr<Manifest> manifest = DecodeManifest(text);
    EXPECT_EQ(manifest.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST(ProgramFilesTest, ALinkInTheCheckpointFolderIsNotSentUp) {
  ScratchFolder dir;
  WriteText(dir.path() + "/ckpt/model.pt", "weights");
  fs::create_symlink("/etc/hostname", dir.path() + "/ckpt/host");
  MemoryStore store;
  absl::StatusOr<std::vector<StoredFile>> files =
      UploadFiles(store, dir.path() + "/ckpt", "mem://c/step-1", 1);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("host in the checkpoint folder"));
}

TEST(ProgramFilesTest, AWorkdirComesDownWithItsFoldersAndNothingOutside) {
  MemoryStore store;
  ASSERT_TRUE(store.Put("mem://b/code/train.py", "print(1)").ok());
  ASSERT_TRUE(store.Put("mem://b/code/lib/util.py", "x = 1").ok());
  ASSERT_TRUE(store.Put("mem://b/codex/other.py", "not ours").ok());
  ScratchFolder dir;
  ASSERT_TRUE(FetchWorkdir(store, "mem://b/code", dir.path()).ok());
  EXPECT_EQ(ReadText(dir.path() + "/train.py"), "print(1)");
  EXPECT_EQ(ReadText(dir.path() + "/lib/util.py"), "x = 1");
  EXPECT_FALSE(fs::exists(dir.path() + "/other.py"));
  EXPECT_EQ(FetchWorkdir(store, "mem://b/empty", dir.path()).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Put("mem://b/evil/../../x", "y").ok());
  EXPECT_EQ(FetchWorkdir(store, "mem://b/evil", dir.path()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::trainer::program
