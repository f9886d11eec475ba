// Checkpoints on S3 (s3rver on loopback) through the whole system: a job checkpoints to s3://,
// its trainer is killed, its newest checkpoint is corrupted after the commit, and a resubmitted
// job (trainyard submit --resume-from) skips the corrupt one with a warning event, resumes from
// the previous committed step, and collects garbage in its own checkpoint folder. Data shards and
// TorchScript models are read from S3 too.

#include <signal.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/formats/safetensors.h"
#include "common/sha256.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/s3_object_store.h"
#include "common/storage/uri.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/run_shell.h"
#include "tests/common/s3rver.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using trainyard::v1::Job;

std::string S3Job(const std::string& name, int64_t max_steps) {
  return SyntheticJobYaml(name, max_steps,
                          "checkpoint: {uri: \"s3://ckpt/runs\", every_steps: 5, keep_last: 2}\n");
}

// The step folders (s3://ckpt/runs/JOB/step-...) that hold any object.
std::set<std::string> StepFolders(ObjectStore& store, const std::string& job_id) {
  std::set<std::string> folders;
  auto objects = store.List(absl::StrCat("s3://ckpt/runs/", job_id, "/step-"));
  EXPECT_TRUE(objects.ok()) << objects.status();
  if (!objects.ok()) return folders;
  for (const ObjectInfo& o : *objects) folders.insert(o.uri.substr(0, o.uri.rfind('/')));
  return folders;
}

void ExpectValidManifest(ObjectStore& store, const std::string& step_uri) {
  auto manifest_uri = NewestManifestUri(store, step_uri);
  ASSERT_TRUE(manifest_uri.ok()) << manifest_uri.status();
  auto text = store.Get(*manifest_uri);
  ASSERT_TRUE(text.ok()) << text.status();
  nlohmann::json manifest = nlohmann::json::parse(*text);
  ASSERT_GE(manifest["objects"].size(), 3u);
  for (const auto& object : manifest["objects"]) {
    auto data = store.Get(JoinUri(step_uri, object["name"].get<std::string>()));
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(static_cast<int64_t>(data->size()), object["size"].get<int64_t>()) << object["name"];
    EXPECT_EQ(Sha256Hex(*data), object["sha256"].get<std::string>());
  }
}

TEST(S3CheckpointTest, CheckpointsKillResumeAndSkipACorruptCheckpoint) {
  if (S3rver::BinaryPath().empty()) GTEST_SKIP() << "s3rver is not installed";
  auto s3 = S3rver::Start({"ckpt"});
  ASSERT_TRUE(s3.ok()) << s3.status();
  S3ObjectStore store(std::make_unique<S3Client>((*s3)->ClientOptions()));
  ClusterOptions options;
  options.env = (*s3)->Env();
  Cluster cluster(options);

  auto first = cluster.Submit(S3Job("s3-resume", 100000000));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->checkpoint_uri(), absl::StrCat("s3://ckpt/runs/", first->id()));
  auto committed =
      cluster.WaitFor(first->id(), [](const Job& job) { return job.committed_step() >= 15; });
  ASSERT_TRUE(committed.ok()) << committed.status();

  // Kill the trainer: the job fails with its checkpoints in place.
  std::optional<pid_t> pid = cluster.TrainerPid(0, absl::StrCat(first->id(), ".g1.r0"));
  ASSERT_TRUE(pid.has_value());
  // It wrote those checkpoints with a key of its own, through its agent's gateway: none of the
  // agent's S3 settings reached it.
  std::map<std::string, std::string> trainer_env;
  {
    std::ifstream environ(absl::StrCat("/proc/", *pid, "/environ"), std::ios::binary);
    for (std::string entry; std::getline(environ, entry, '\0');) {
      const size_t eq = entry.find('=');
      if (eq != std::string::npos) trainer_env[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
  }
  const std::map<std::string, std::string> agent_env = (*s3)->Env();
  ASSERT_TRUE(absl::StartsWith(trainer_env["AWS_ACCESS_KEY_ID"], "TY"))
      << trainer_env["AWS_ACCESS_KEY_ID"];
  for (const auto& [name, value] : agent_env) {
    if (name != "AWS_REGION") {
      EXPECT_NE(trainer_env[name], value) << name;
    }
  }
  ASSERT_EQ(kill(*pid, SIGKILL), 0);
  auto failed = cluster.WaitForFinal(first->id());
  ASSERT_TRUE(failed.ok()) << failed.status();
  ASSERT_EQ(failed->state(), v1::FAILED) << failed->reason();
  const int64_t last = failed->committed_step();
  const std::string newest =
      absl::StrCat("s3://ckpt/runs/", first->id(), "/step-", absl::StrFormat("%012d", last));
  const std::string previous =
      absl::StrCat("s3://ckpt/runs/", first->id(), "/step-", absl::StrFormat("%012d", last - 5));
  ExpectValidManifest(store, newest);
  ExpectValidManifest(store, previous);
  // Retention (keep_last: 2) deleted the older ones; at most the upload in flight when the
  // trainer died is there besides.
  std::set<std::string> folders = StepFolders(store, first->id());
  EXPECT_TRUE(folders.count(newest) && folders.count(previous));
  EXPECT_LE(folders.size(), 3u);

  auto listed = cluster.Cli({"checkpoints", first->id()});
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_TRUE(absl::StrContains(listed.output, newest)) << listed.output;

  // Corrupt the newest committed checkpoint after its commit: truncate its model.
  std::string model;
  auto in_newest = store.List(newest + "/");
  ASSERT_TRUE(in_newest.ok()) << in_newest.status();
  for (const ObjectInfo& o : *in_newest) {
    if (absl::StrContains(o.uri, "/model.g")) model = o.uri;
  }
  ASSERT_FALSE(model.empty()) << newest;
  auto bytes = store.Get(model);
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(store.Put(model, bytes->substr(0, bytes->size() / 2)).ok());

  const std::string spec_path = cluster.state_dir() + "/../s3-resume.yaml";
  std::ofstream(spec_path) << S3Job("s3-resume", last + 10);
  // An object no committed manifest refers to, as an upload cut off by a crash leaves behind, in
  // the folder of the job about to be submitted (ids are NAME-N): its trainer deletes it before
  // it writes its first checkpoint.
  const std::string garbage = "s3://ckpt/runs/s3-resume-2/step-000099999999/model.safetensors";
  ASSERT_TRUE(store.Put(garbage, "partial").ok());
  auto submit = cluster.Cli({"submit", spec_path, "--resume-from", first->id(), "--wait"});
  EXPECT_EQ(submit.exit_code, 0) << submit.output;
  const std::string second_id = submit.FirstLine();
  auto second = cluster.Get(second_id);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->state(), v1::SUCCEEDED) << second->reason();
  EXPECT_EQ(second->committed_step(), last + 10);

  // The corrupt checkpoint was detected and skipped: the run starts after the previous one, and
  // the job carries a warning event naming the checkpoint.
  auto logs = cluster.Logs(second_id);
  ASSERT_TRUE(logs.ok());
  std::map<int64_t, double> losses = ParseStepLosses(*logs);
  ASSERT_FALSE(losses.empty()) << *logs;
  EXPECT_EQ(losses.begin()->first, last - 5 + 1) << *logs;
  bool warned = false;
  for (const auto& event : second->events()) {
    warned |= absl::StrContains(event.reason(), "warning: checkpoint " + newest) &&
              absl::StrContains(event.reason(), "DATA_LOSS");
  }
  EXPECT_TRUE(warned);
  auto describe = cluster.Cli({"describe", second_id});
  EXPECT_TRUE(absl::StrContains(describe.output, "skipped")) << describe.output;
  ExpectValidManifest(store, absl::StrCat("s3://ckpt/runs/", second_id, "/step-",
                                          absl::StrFormat("%012d", last + 10)));
  ASSERT_EQ(second_id, "s3-resume-2");
  EXPECT_EQ(store.Head(garbage).status().code(), absl::StatusCode::kNotFound);
  // keep_last: 2 committed step folders remain, nothing else.
  EXPECT_EQ(StepFolders(store, second_id).size(), 2u);

  // Deleting the second job with its checkpoints (the CLI uses this machine's credentials, as
  // the workers do) leaves nothing under its URI, as the AWS CLI sees it; the first job deleted
  // without --checkpoints leaves its objects.
  for (const auto& [key, value] : (*s3)->Env()) setenv(key.c_str(), value.c_str(), 1);
  auto deleted = cluster.Cli({"delete", second_id, "--checkpoints"});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.output;
  EXPECT_TRUE(absl::StrContains(deleted.output, "job " + second_id + " deleted")) << deleted.output;
  auto listing = (*s3)->Aws({"s3", "ls", "--recursive", "s3://ckpt/runs/"});
  ASSERT_EQ(listing.exit_code, 0) << listing.output;
  EXPECT_FALSE(absl::StrContains(listing.output, second_id + "/")) << listing.output;
  EXPECT_TRUE(absl::StrContains(listing.output, first->id() + "/step-")) << listing.output;
  EXPECT_NE(cluster.Cli({"describe", second_id}).exit_code, 0);
  auto kept = cluster.Cli({"delete", first->id()});
  EXPECT_EQ(kept.exit_code, 0) << kept.output;
  ExpectValidManifest(store, previous);
  EXPECT_EQ(cluster.Get(first->id()).status().code(), absl::StatusCode::kNotFound);
}

// Shards in s3rver read by a data_parallel job (2 ranks on one worker) through a worker cache
// that holds four of the eight shards: the job learns, the cache stays within its bound, and
// the ranks fetch the tensors they name and nothing else.
TEST(S3DataTest, AJobStreamsShardsThroughABoundedWorkerCache) {
  if (S3rver::BinaryPath().empty()) GTEST_SKIP() << "s3rver is not installed";
  auto s3 = S3rver::Start({"data"});
  ASSERT_TRUE(s3.ok()) << s3.status();
  S3ObjectStore store(std::make_unique<S3Client>((*s3)->ClientOptions()));
  constexpr int kShards = 8;
  constexpr int64_t kRows = 2000, kWidth = 64;
  int64_t column_bytes = 0, unused_bytes = 0;
  for (int shard = 0; shard < kShards; ++shard) {
    // Four classes; the first 8 features sit around 60 * class, the rest are noise.
    std::string x(kRows * kWidth, '\0'), y(kRows * 8, '\0'), unused(kRows * kWidth * 4, '\1');
    uint64_t state = 977 + shard;
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t label = (r * 7 + shard) % 4;
      std::memcpy(&y[r * 8], &label, 8);
      for (int64_t c = 0; c < kWidth; ++c) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const int noise = static_cast<int>((state >> 33) % 40);
        x[r * kWidth + c] = static_cast<char>(c < 8 ? 60 * label + noise : (state >> 40) % 256);
      }
    }
    auto file = EncodeSafetensors({{"x", "U8", {kRows, kWidth}, x},
                                   {"y", "I64", {kRows}, y},
                                   {"unused", "F32", {kRows, kWidth}, unused}},
                                  {});
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(store.Put(absl::StrCat("s3://data/ds/train-", shard, ".safetensors"), *file).ok());
    column_bytes += static_cast<int64_t>(x.size() + y.size());
    unused_bytes += static_cast<int64_t>(unused.size());
  }
  ClusterOptions options;
  options.env = (*s3)->Env();
  options.slots_per_worker = 2;
  constexpr int64_t kCacheBytes = 1000000;  // six shards' x and y (144 KB each), not eight
  options.worker_args = {absl::StrCat("--data_cache_bytes=", kCacheBytes)};
  Cluster cluster(options);
  auto job = cluster.Submit(R"(name: s3-data
strategy: data_parallel
workers: 2
model:
  builtin: mlp
  args: {inputs: 64, hidden: [32], classes: 4}
data:
  train: s3://data/ds/train-*.safetensors
  features: x
  labels: y
  feature_scale: 0.00392
  shuffle_window: 2000
  prefetch_shards: 1
  validation_split: 0.05
  validation: {every_epoch: true}
batch_size: 64
optimizer: {name: adamw, lr: 0.01}
epochs: 2
log_every_steps: 50
seed: 3
)");
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = cluster.WaitForFinal(job->id(), absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  auto logs = cluster.Logs(job->id());
  ASSERT_TRUE(logs.ok());
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n" << *logs;
  EXPECT_TRUE(done->progress().has_val_accuracy());
  EXPECT_GT(done->progress().val_accuracy(), 0.9) << *logs;

  // What the ranks fetched: every shard's x and y at least once (the cache cannot keep them
  // across the two epochs), never the unused tensor, which is larger than all of them.
  int64_t fetched = 0;
  int reports = 0;
  for (absl::string_view line : absl::StrSplit(*logs, '\n')) {
    const size_t at = line.find("data: fetched ");
    if (at == absl::string_view::npos) continue;
    int64_t bytes = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(at + 14, line.find(' ', at + 14) - (at + 14)), &bytes))
        << line;
    fetched += bytes;
    ++reports;
  }
  EXPECT_EQ(reports, 2) << *logs;
  EXPECT_GE(fetched, column_bytes);
  EXPECT_LE(fetched, 3 * column_bytes);
  EXPECT_LT(fetched, unused_bytes);
  // The worker's cache never needed more than its bound: what is left is within it.
  int64_t on_disk = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(cluster.worker_dir(0) + "/cache/shards", ec), end;
       !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (stat(it->path().c_str(), &st) == 0) on_disk += static_cast<int64_t>(st.st_blocks) * 512;
  }
  EXPECT_GT(on_disk, 0);
  EXPECT_LE(on_disk, kCacheBytes);

  // Without a window, every shard would have to be in the cache at once: refused, naming the
  // field, before any step.
  auto whole = cluster.Submit(R"(name: s3-whole
model:
  builtin: mlp
  args: {inputs: 64, hidden: [32], classes: 4}
data: {train: "s3://data/ds/train-*.safetensors", features: x, labels: y}
batch_size: 64
max_steps: 10
)");
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto refused = cluster.WaitForFinal(whole->id());
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(refused->reason(),
                                "data.shuffle_window: a permutation of all samples needs all"))
      << refused->reason();
  EXPECT_EQ(refused->progress().step(), 0);
}

// A model in three TorchScript files (model.stages), two of them on S3 and one local, trains as a
// 2-stage pipeline: the coordinator reads all three at submission, the stages group them by the
// tensor bytes of their archives (ranged reads on S3) and load theirs (S3 through the worker's
// object cache), and the job ends where the single job on the same files ends.
TEST(S3ModelTest, AModelInTorchScriptFilesOnS3TrainsAsAPipeline) {
  if (S3rver::BinaryPath().empty()) GTEST_SKIP() << "s3rver is not installed";
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with torch to write the modules";
  }
  auto s3 = S3rver::Start({"models"});
  ASSERT_TRUE(s3.ok()) << s3.status();
  S3ObjectStore store(std::make_unique<S3Client>((*s3)->ClientOptions()));
  TempDir dir;
  // 288, 528 and 51 parameters: balanced on 2 stages, [0, 1] and [2] hold 816 and 51, [0] and
  // [1, 2] 288 and 579: the second split is the one.
  const auto [written, write_output] = RunShell(absl::StrCat(
      "/usr/bin/python3 -c \"import sys, torch; from torch import nn; torch.manual_seed(5); "
      "parts = [nn.Sequential(nn.Linear(8, 32), nn.Tanh()), "
      "nn.Sequential(nn.Linear(32, 16), nn.Tanh()), nn.Linear(16, 3)]; "
      "[torch.jit.script(p).save(f'{sys.argv[1]}/{i}.pt') for i, p in enumerate(parts)]\" ",
      dir.path(), " 2>&1"));
  ASSERT_EQ(written, 0) << write_output;
  for (int i = 0; i < 2; ++i) {
    std::ifstream in(absl::StrCat(dir.path(), "/", i, ".pt"), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_TRUE(store.Put(absl::StrCat("s3://models/lm/", i, ".pt"), bytes).ok());
  }
  ClusterOptions options;
  options.env = (*s3)->Env();
  options.workers = 2;
  options.slots_per_worker = 1;
  Cluster cluster(options);
  auto job = [&](const std::string& name, const std::string& strategy_lines) {
    return ScriptFilesJobYaml(name, strategy_lines,
                              {"s3://models/lm/0.pt", "s3://models/lm/1.pt", dir.path() + "/2.pt"});
  };
  const Job single = RunToSuccess(cluster, job("single", "strategy: single"));
  EXPECT_EQ(single.model_needs().read_size(), 3);
  EXPECT_EQ(single.model_needs().stage_tensor_bytes_size(), 3);
  const Job piped =
      RunToSuccess(cluster, job("piped", "strategy: pipeline\nworkers: 2\npipeline: {stages: 2}"));
  EXPECT_LE(MaxDifference(CommittedModel(single), CommittedModel(piped)), 1e-5);
  auto logs = cluster.Logs(piped.id());
  ASSERT_TRUE(logs.ok());
  EXPECT_TRUE(absl::StrContains(*logs, "holds model.stages files 1 to 2")) << *logs;
  const std::string exported(absl::StripPrefix(piped.model_uri(), "file://"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(exported, "/", i, ".pt"))) << exported;
  }
}

}  // namespace
}  // namespace trainyard::testing
