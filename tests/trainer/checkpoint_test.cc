// The checkpoint writer's objects and its upload thread: what is stored is byte for byte the
// safetensors encoding of the snapshot, the manifest's sizes and hashes are those of the stored
// bytes, and the upload runs at a low priority on the CPUs it is given.

#include "worker/trainer/checkpoint/checkpoint.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "common/formats/safetensors.h"
#include "common/sha256.h"
#include "common/storage/file_object_store.h"
#include "common/storage/object_store.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/trainer/fake_coordinator.h"
#include "tests/trainer/test_files.h"
#include "worker/trainer/coordinator/coordinator_client.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {
namespace {

using ::trainyard::trainer::test_files::MakeTempDir;
using ::trainyard::trainer::test_files::ReadFile;
using ::trainyard::trainer::test_files::StepFile;

std::set<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

// A file store that notes, for each object written from pieces, the nice value and the CPUs of
// the thread that wrote it; or, with `join_pieces`, writes through the ObjectStore default.
class RecordingStore final : public ObjectStore {
 public:
  explicit RecordingStore(bool join_pieces = false) : join_pieces_(join_pieces) {}

  absl::Status Put(absl::string_view uri, absl::string_view data) override {
    return files_.Put(uri, data);
  }
  absl::StatusOr<std::string> PutPieces(absl::string_view uri,
                                        absl::Span<const absl::string_view> pieces) override {
    {
      absl::MutexLock lock(&mu_);
      nice_.push_back(getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))));
      cpus_.push_back(AllowedCpus());
    }
    if (join_pieces_) return ObjectStore::PutPieces(uri, pieces);
    return files_.PutPieces(uri, pieces);
  }
  absl::StatusOr<std::string> Get(absl::string_view uri) override { return files_.Get(uri); }
  absl::StatusOr<std::string> GetRange(absl::string_view uri, int64_t offset,
                                       int64_t length) override {
    return files_.GetRange(uri, offset, length);
  }
  absl::StatusOr<ObjectInfo> Head(absl::string_view uri) override { return files_.Head(uri); }
  absl::StatusOr<std::vector<ObjectInfo>> List(absl::string_view prefix) override {
    return files_.List(prefix);
  }
  absl::Status Delete(absl::string_view uri) override { return files_.Delete(uri); }

  std::vector<int> nice() {
    absl::MutexLock lock(&mu_);
    return nice_;
  }
  std::vector<std::set<int>> cpus() {
    absl::MutexLock lock(&mu_);
    return cpus_;
  }

 private:
  const bool join_pieces_;
  FileObjectStore files_;
  absl::Mutex mu_;
  std::vector<int> nice_ ABSL_GUARDED_BY(mu_);
  std::vector<std::set<int>> cpus_ ABSL_GUARDED_BY(mu_);
};

// Tensors of several dtypes, one of them a non-contiguous view and one empty.
CheckpointData SampleData(int64_t step) {
  CheckpointData data;
  torch::manual_seed(5);
  data.model.emplace_back("layer.weight", torch::randn({7, 5}));
  data.model.emplace_back("layer.bias", torch::randn({7}));
  data.model.emplace_back("transposed", torch::randn({4, 6}).t());
  data.model.emplace_back("counts", torch::arange(10, torch::kInt64));
  data.model.emplace_back("empty", torch::zeros({0, 3}));
  data.optimizer.emplace_back("layer.weight.exp_avg", torch::randn({7, 5}, torch::kFloat64));
  data.optimizer_name = "adamw";
  data.state.job_id = "job";
  data.state.step = step;
  data.state.lr_schedule = "constant";
  return data;
}

Checkpointer::Options OptionsFor(const std::string& base_uri) {
  Checkpointer::Options options;
  options.base_uri = base_uri;
  options.attempts = 1;
  return options;
}

TEST(CheckpointObjectsTest, StoredObjectsAreTheSnapshotsEncodingWithTheirHashesInTheManifest) {
  for (const bool join_pieces : {false, true}) {
    SCOPED_TRACE(join_pieces ? "store default PutPieces" : "file store PutPieces");
    const std::string dir = MakeTempDir();
    RecordingStore store(join_pieces);
    const CheckpointData data = SampleData(7);
    {
      Checkpointer checkpointer(&store, nullptr, RealClock::Get(), OptionsFor("file://" + dir));
      ASSERT_TRUE(checkpointer.SaveAsync(data));
      ASSERT_TRUE(checkpointer.Wait().ok());
    }
    const std::string step_dir = dir + "/step-000000000007";
    // The format is the one EncodeTensors writes, byte for byte.
    absl::StatusOr<std::string> model = EncodeTensors(data.model, {{"format", "trainyard/1"}});
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(ReadFile(StepFile(step_dir, "model")) == *model);
    absl::StatusOr<std::string> optimizer = EncodeTensors(data.optimizer, {{"optimizer", "adamw"}});
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    EXPECT_TRUE(ReadFile(StepFile(step_dir, "optimizer")) == *optimizer);

    const nlohmann::json manifest = nlohmann::json::parse(ReadFile(StepFile(step_dir, "MANIFEST")));
    ASSERT_EQ(manifest["objects"].size(), 3u);
    for (const nlohmann::json& object : manifest["objects"]) {
      const std::string name = object["name"].get<std::string>();
      const std::string bytes = ReadFile(step_dir + "/" + name);
      EXPECT_EQ(object["size"].get<int64_t>(), static_cast<int64_t>(bytes.size())) << name;
      EXPECT_EQ(object["sha256"].get<std::string>(), Sha256Hex(bytes)) << name;
    }
    absl::StatusOr<LoadedCheckpoint> loaded =
        ReadCheckpoint(store, CheckpointStepUri("file://" + dir, 7));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    for (const auto& [name, tensor] : data.model) {
      ASSERT_EQ(loaded->model.count(name), 1u) << name;
      EXPECT_TRUE(torch::equal(loaded->model[name], tensor)) << name;
    }
  }
}

// Saves `data` under a new folder and returns the step folder's URI.
std::string SaveToNewFolder(ObjectStore& store, CheckpointData data) {
  const std::string dir = MakeTempDir();
  const int64_t step = data.state.step;
  Checkpointer checkpointer(&store, nullptr, RealClock::Get(), OptionsFor("file://" + dir));
  EXPECT_TRUE(checkpointer.SaveAsync(std::move(data)));
  EXPECT_TRUE(checkpointer.Wait().ok());
  return CheckpointStepUri("file://" + dir, step);
}

// Flips one byte of tensor `name` in the safetensors file at `path`.
void CorruptTensor(const std::string& path, const std::string& name) {
  std::string bytes = ReadFile(path);
  absl::StatusOr<SafetensorsHeader> header = DecodeSafetensorsHeader(bytes, bytes.size());
  ASSERT_TRUE(header.ok()) << header.status();
  for (const SafetensorsSlot& slot : header->tensors) {
    if (slot.name != name) continue;
    ASSERT_LT(slot.begin, slot.end);
    bytes[header->data_start + slot.begin] ^= 0x5a;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return;
  }
  FAIL() << "no tensor " << name << " in " << path;
}

// A filtered read (a pipeline stage resuming) holds only the tensors it keeps, read in chunks:
// one tensor spans two chunks and one starts in the second; every byte is still checked, so a
// damaged tensor it does not keep still fails the read.
TEST(CheckpointReadTest, AFilterKeepsOnlyItsTensorsAndStillChecksEveryByte) {
  FileObjectStore store;
  CheckpointData data = SampleData(3);
  torch::manual_seed(9);
  data.model.insert(data.model.begin(), {"big", torch::randn({3'000'000})});  // 12 MB
  const NamedTensors model = data.model;
  const std::string step_uri = SaveToNewFolder(store, std::move(data));

  const std::set<std::string> wanted = {"big", "layer.bias", "counts"};
  CheckpointFilter keep;
  keep.model = [&](const std::string& name) { return wanted.count(name) > 0; };
  keep.optimizer = [](const std::string&) { return false; };
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(store, step_uri, &keep);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 3);
  EXPECT_EQ(loaded->optimizer_name, "adamw");
  EXPECT_TRUE(loaded->optimizer.empty());
  ASSERT_EQ(loaded->model.size(), wanted.size());
  for (const auto& [name, tensor] : model) {
    if (wanted.count(name) == 0) continue;
    ASSERT_EQ(loaded->model.count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(loaded->model[name], tensor)) << name;
  }

  CorruptTensor(StepFile(step_uri.substr(strlen("file://")), "model"), "transposed");
  absl::StatusOr<LoadedCheckpoint> damaged = ReadCheckpoint(store, step_uri, &keep);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_NE(damaged.status().message().find("model.g0.safetensors"), absl::string_view::npos)
      << damaged.status();
}

// A pipeline's export streams the model objects of its final checkpoint into one file: for one
// object, the file EncodeTensors would write of the same tensors with the export's metadata; a
// damaged object fails it and leaves no file.
TEST(CheckpointReadTest, TheMergedModelIsStreamedFromTheObjectsAndChecked) {
  FileObjectStore store;
  CheckpointData data = SampleData(4);
  torch::manual_seed(10);
  data.model.insert(data.model.begin(), {"big", torch::randn({3'000'000})});
  const NamedTensors model = data.model;
  const std::string step_uri = SaveToNewFolder(store, std::move(data));
  const std::map<std::string, std::string> metadata = {{"format", "export"}, {"layers", "2"}};
  const std::string path = MakeTempDir() + "/model.safetensors";

  ASSERT_TRUE(WriteMergedModel(store, step_uri, metadata, path).ok());
  absl::StatusOr<std::string> expected = EncodeTensors(model, metadata);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(ReadFile(path) == *expected);

  CorruptTensor(StepFile(step_uri.substr(strlen("file://")), "model"), "counts");
  const std::string again = MakeTempDir() + "/model.safetensors";
  absl::Status damaged = WriteMergedModel(store, step_uri, metadata, again);
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss) << damaged;
  EXPECT_FALSE(test_files::FileExists(again));
}

// A TorchScript pipeline's export gives each module its tensors from the merged file: read into
// the targets themselves (the storage kept), converted to a target's other dtype, or into a
// transposed view; a name the file lacks, another shape, a truncated file and no file are
// refused naming the file.
TEST(CheckpointReadTest, TensorsAreReadFromTheMergedModelIntoTheirTargets) {
  FileObjectStore store;
  CheckpointData data = SampleData(4);
  const NamedTensors model = data.model;
  const std::string step_uri = SaveToNewFolder(store, std::move(data));
  const std::string path = MakeTempDir() + "/model.safetensors";
  ASSERT_TRUE(WriteMergedModel(store, step_uri, {}, path).ok());

  torch::Tensor weight = torch::zeros({7, 5});
  const void* storage = weight.data_ptr();
  torch::Tensor bias = torch::zeros({7}, torch::kFloat64);
  torch::Tensor transposed = torch::zeros({4, 6}).t();
  torch::Tensor empty = torch::zeros({0, 3});
  absl::Status read = ReadTensorsInto(path, {{"layer.weight", weight},
                                             {"layer.bias", bias},
                                             {"transposed", transposed},
                                             {"empty", empty}});
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(weight.data_ptr(), storage);
  EXPECT_TRUE(torch::equal(weight, model[0].second));
  EXPECT_EQ(bias.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::allclose(bias, model[1].second.to(torch::kFloat64)));
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_TRUE(torch::equal(transposed, model[2].second));

  absl::Status missing = ReadTensorsInto(path, {{"layer.other", torch::zeros({7})}});
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find(path + ": no tensor 'layer.other'"), absl::string_view::npos);
  absl::Status shape = ReadTensorsInto(path, {{"layer.bias", torch::zeros({8})}});
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument) << shape;
  EXPECT_NE(shape.message().find("is [7], the model's [8]"), absl::string_view::npos) << shape;

  const std::string whole = ReadFile(path);
  const std::string truncated = MakeTempDir() + "/model.safetensors";
  std::ofstream(truncated, std::ios::binary) << whole.substr(0, whole.size() - 8);
  absl::Status short_file = ReadTensorsInto(truncated, {{"layer.weight", weight}});
  EXPECT_EQ(short_file.code(), absl::StatusCode::kDataLoss) << short_file;
  EXPECT_NE(short_file.message().find(truncated), absl::string_view::npos);
  absl::Status no_file = ReadTensorsInto(path + ".gone", {{"layer.weight", weight}});
  EXPECT_EQ(no_file.code(), absl::StatusCode::kNotFound) << no_file;
}

// trainer_state.json round-trips, with the parameter servers' layout as a JSON object when there
// is one and without the key when there is none; a state without it (older checkpoints) reads.
TEST(TrainerStateTest, RoundTripsWithAndWithoutAParameterServerLayout) {
  TrainerState state;
  state.job_id = "j-1";
  state.step = 7;
  state.world_size = 2;
  state.lr_schedule = "constant";
  absl::StatusOr<TrainerState> back = DecodeTrainerState(EncodeTrainerState(state));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 7);
  EXPECT_TRUE(back->parameter_servers.empty());
  EXPECT_FALSE(nlohmann::json::parse(EncodeTrainerState(state)).contains("parameter_servers"));

  state.parameter_servers = R"({"shards":2,"tables":[{"parameter":"embedding0.weight"}]})";
  const nlohmann::json encoded = nlohmann::json::parse(EncodeTrainerState(state));
  EXPECT_EQ(encoded["parameter_servers"]["shards"], 2);
  back = DecodeTrainerState(encoded.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(nlohmann::json::parse(back->parameter_servers),
            nlohmann::json::parse(state.parameter_servers));
}

// Found by fuzz_checkpoint under UndefinedBehaviorSanitizer: a number of another kind or range
// in an integer field (3.3e72 as world_size) went through nlohmann's cast to int.
TEST(TrainerStateTest, FieldsOfAnotherKindOrRangeAreRefused) {
  TrainerState state;
  state.job_id = "j-1";
  state.world_size = 2;
  state.lr_schedule = "constant";
  const nlohmann::json good = nlohmann::json::parse(EncodeTrainerState(state));
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"world_size", 3.33333e72},
                                                           {"world_size", 1.5},
                                                           {"world_size", int64_t{1} << 40},
                                                           {"world_size", "2"},
                                                           {"step", 18446744073709551615ull},
                                                           {"generation", true}}) {
    nlohmann::json bad = good;
    bad[key] = value;
    absl::StatusOr<TrainerState> back = DecodeTrainerState(bad.dump());
    EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument) << key << "=" << value;
  }
}

TEST(CheckpointObjectsTest, ATensorWithoutASafetensorsFormFailsTheSaveAndWritesNoManifest) {
  const std::string dir = MakeTempDir();
  RecordingStore store;
  CheckpointData data = SampleData(3);
  data.model.emplace_back("complex", torch::zeros({2}, torch::kComplexFloat));
  Checkpointer checkpointer(&store, nullptr, RealClock::Get(), OptionsFor("file://" + dir));
  ASSERT_TRUE(checkpointer.SaveAsync(std::move(data)));
  absl::Status saved = checkpointer.Wait();
  EXPECT_EQ(saved.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(saved.message().find("complex"), absl::string_view::npos) << saved;
  EXPECT_EQ(checkpointer.last_saved_step(), -1);
  EXPECT_FALSE(test_files::FileExists(StepFile(dir + "/step-000000000003", "MANIFEST")));
}

// An old attempt cut off from the coordinator (not yet fenced on its worker)
// still reaches the store, and saves the step that the new attempt has just committed. Its
// commit is refused, and nothing it writes touches the new attempt's checkpoint.
TEST(CheckpointAttemptsTest, AnOldAttemptSavingACommittedStepLeavesTheNewAttemptsCheckpointWhole) {
  FileObjectStore store;
  const std::string base = "file://" + MakeTempDir();
  CheckpointData newer = SampleData(10);
  newer.state.generation = 2;
  const NamedTensors newer_model = newer.model;
  FakeCoordinator coordinator(/*keep_last=*/3, base);
  {
    Checkpointer checkpointer(&store, &coordinator, RealClock::Get(), OptionsFor(base));
    ASSERT_TRUE(checkpointer.SaveAsync(std::move(newer)));
    ASSERT_TRUE(checkpointer.Wait().ok());
  }
  ASSERT_EQ(coordinator.committed_steps(), std::vector<int64_t>{10});

  CheckpointData older = SampleData(10);
  older.state.generation = 1;
  for (auto& [name, tensor] : older.model) tensor = tensor + 1;  // what it trained differs
  FakeCoordinator fenced(/*keep_last=*/3, base);
  fenced.set_commit_hook([](int) {
    return absl::FailedPreconditionError("attempt 1 of job is no longer current (now 2)");
  });
  {
    Checkpointer checkpointer(&store, &fenced, RealClock::Get(), OptionsFor(base));
    ASSERT_TRUE(checkpointer.SaveAsync(std::move(older)));
    EXPECT_EQ(checkpointer.Wait().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(fenced.committed_steps().empty());

  const std::string step_uri = CheckpointStepUri(base, 10);
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(store, step_uri);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.generation, 2);
  for (const auto& [name, tensor] : newer_model) {
    EXPECT_TRUE(torch::equal(loaded->model[name], tensor)) << name;
  }
  // Both attempts' objects are there, each under its own names.
  const std::string dir = step_uri.substr(strlen("file://"));
  for (const char* name : {"model.g1.safetensors", "model.g2.safetensors", "MANIFEST.g1.json",
                           "MANIFEST.g2.json", "trainer_state.g1.json", "trainer_state.g2.json"}) {
    EXPECT_TRUE(test_files::FileExists(dir + "/" + name)) << name;
  }
}

// Checkpoints written before objects were named by attempt ("model.safetensors", ...,
// "MANIFEST.json") are still read.
TEST(CheckpointAttemptsTest, ACheckpointOfTheEarlierLayoutIsRead) {
  FileObjectStore store;
  CheckpointData data = SampleData(4);
  const NamedTensors model = data.model;
  const std::string step_uri = SaveToNewFolder(store, std::move(data));
  const std::string dir = step_uri.substr(strlen("file://"));
  std::string manifest = ReadFile(dir + "/MANIFEST.g0.json");
  for (const char* base : {"model", "optimizer"}) {
    const std::string from = absl::StrCat(base, ".g0.safetensors");
    const std::string to = absl::StrCat(base, ".safetensors");
    ASSERT_EQ(std::rename((dir + "/" + from).c_str(), (dir + "/" + to).c_str()), 0);
    manifest = absl::StrReplaceAll(manifest, {{from, to}});
  }
  ASSERT_EQ(
      std::rename((dir + "/trainer_state.g0.json").c_str(), (dir + "/trainer_state.json").c_str()),
      0);
  manifest = absl::StrReplaceAll(manifest, {{"trainer_state.g0.json", "trainer_state.json"}});
  ASSERT_TRUE(store.Put(step_uri + "/MANIFEST.json", manifest).ok());
  ASSERT_TRUE(store.Delete(step_uri + "/MANIFEST.g0.json").ok());

  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(store, step_uri);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 4);
  for (const auto& [name, tensor] : model) {
    EXPECT_TRUE(torch::equal(loaded->model[name], tensor)) << name;
  }
}

TEST(CheckpointAttemptsTest, ManifestNamesCarryTheirAttempt) {
  EXPECT_EQ(ManifestName(12), "MANIFEST.g12.json");
  EXPECT_EQ(ManifestGeneration("MANIFEST.g12.json"), 12);
  EXPECT_EQ(ManifestGeneration("MANIFEST.json"), -1);
  for (const char* other : {"MANIFEST.g.json", "MANIFEST.g012.json", "MANIFEST.g-1.json",
                            "MANIFEST.g1x.json", "MANIFEST.g1.json.tmp", "model.g1.safetensors"}) {
    EXPECT_FALSE(ManifestGeneration(other).has_value()) << other;
  }
  FileObjectStore store;
  const std::string folder = "file://" + MakeTempDir() + "/step-000000000001";
  EXPECT_EQ(NewestManifestUri(store, folder).status().code(), absl::StatusCode::kNotFound);
  for (const char* name : {"MANIFEST.json", "MANIFEST.g9.json", "MANIFEST.g10.json",
                           "g11/MANIFEST.g11.json", "MANIFEST.g12.json.part"}) {
    ASSERT_TRUE(store.Put(folder + "/" + name, "{}").ok());
  }
  absl::StatusOr<std::string> newest = NewestManifestUri(store, folder);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, folder + "/MANIFEST.g10.json");
}

TEST(CheckpointUploadThreadTest, RunsAtNiceTenOnlyOnTheGivenCpusAndLeavesTheCallerAlone) {
  const std::set<int> before = AllowedCpus();
  ASSERT_FALSE(before.empty());
  const int cpu = *before.rbegin();
  const int caller_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  const std::string dir = MakeTempDir();
  RecordingStore store;
  Checkpointer::Options options = OptionsFor("file://" + dir);
  options.upload_cpus = {cpu};
  {
    Checkpointer checkpointer(&store, nullptr, RealClock::Get(), options);
    ASSERT_TRUE(checkpointer.SaveAsync(SampleData(1)));
    ASSERT_TRUE(checkpointer.Wait().ok());
  }
  ASSERT_EQ(store.nice().size(), 3u);  // model, optimizer, trainer state
  for (int nice : store.nice()) EXPECT_GE(nice, 10);
  for (const std::set<int>& cpus : store.cpus()) EXPECT_EQ(cpus, std::set<int>{cpu});
  EXPECT_EQ(AllowedCpus(), before);
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))), caller_nice);

  // Without upload_cpus the upload runs wherever the caller may.
  RecordingStore anywhere;
  {
    Checkpointer checkpointer(&anywhere, nullptr, RealClock::Get(), OptionsFor("file://" + dir));
    ASSERT_TRUE(checkpointer.SaveAsync(SampleData(2)));
    ASSERT_TRUE(checkpointer.Wait().ok());
  }
  ASSERT_FALSE(anywhere.cpus().empty());
  for (const std::set<int>& cpus : anywhere.cpus()) EXPECT_EQ(cpus, before);
}

// Retry waits between tries on its clock: on a simulated one the backoff doubles from 100 ms up
// to its cap in the clock's time alone, the last wait is cut short at the give-up time, an error
// the predicate does not retry ends it at once, and a limit on attempts is kept.
TEST(RetryTest, BacksOffOnItsClockAndGivesUpOnTime) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::vector<absl::Duration> tried_at;
  auto fail_until = [&](int ok_at) {
    return [&, ok_at] {
      tried_at.push_back(clock.Now() - start);
      return static_cast<int>(tried_at.size()) >= ok_at ? absl::OkStatus()
                                                        : absl::UnavailableError("refused");
    };
  };
  EXPECT_TRUE(Retry(clock,
                    CoordinatorRetry(start + absl::Seconds(60), absl::Milliseconds(100),
                                     absl::Milliseconds(300)),
                    IsRetryableCoordinatorError, fail_until(5))
                  .ok());
  EXPECT_EQ(tried_at, (std::vector<absl::Duration>{absl::ZeroDuration(), absl::Milliseconds(100),
                                                   absl::Milliseconds(300), absl::Milliseconds(600),
                                                   absl::Milliseconds(900)}));

  tried_at.clear();
  const absl::Time again = clock.Now();
  absl::Status gave_up = Retry(
      clock,
      CoordinatorRetry(again + absl::Milliseconds(250), absl::Milliseconds(100), absl::Seconds(1)),
      IsRetryableCoordinatorError, fail_until(100));
  EXPECT_EQ(gave_up.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(tried_at.size(), 3u);  // at 0, 100 and 250 ms (the last wait cut to 150 ms)
  EXPECT_EQ(clock.Now() - again, absl::Milliseconds(250));

  tried_at.clear();
  EXPECT_EQ(
      Retry(clock, CoordinatorRetry(clock.Now() + absl::Seconds(60)), IsRetryableCoordinatorError,
            [&] {
              tried_at.push_back(absl::ZeroDuration());
              return absl::FailedPreconditionError("fenced off");
            })
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tried_at.size(), 1u);

  // Storage writes: every failure but a refusal, at most max_attempts calls, no time limit.
  tried_at.clear();
  RetryPolicy storage;
  storage.max_attempts = 4;
  storage.backoff = absl::Milliseconds(200);
  const absl::Time third = clock.Now();
  EXPECT_EQ(Retry(clock, storage, UnlessRefused,
                  [&] {
                    tried_at.push_back(clock.Now() - third);
                    return absl::InternalError("disk full");
                  })
                .code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(tried_at,
            (std::vector<absl::Duration>{absl::ZeroDuration(), absl::Milliseconds(200),
                                         absl::Milliseconds(600), absl::Milliseconds(1400)}));
}

}  // namespace
}  // namespace trainyard::trainer
