#include "worker/trainer/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/formats/safetensors.h"
#include "common/json_fields.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/storage/uri.h"
#include "worker/trainer/checkpoint/checkpoint_files.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {
namespace {

using checkpoint_files::kModelBase;
using checkpoint_files::kOptimizerBase;
using checkpoint_files::ObjectName;
using checkpoint_files::PartListName;
using checkpoint_files::ReadField;
using checkpoint_files::StateObjectName;
using nlohmann::json;

// Restricts the calling thread (and the threads it starts later) to `cpus`.
void PinThisThread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    LogWarning("checkpoint upload: cannot restrict the thread to CPUs ", absl::StrJoin(cpus, ","),
               ": ", std::strerror(errno));
  }
}

}  // namespace

std::string EncodeTrainerState(const TrainerState& s) {
  json j = {{"format", "trainyard-trainer-state/1"},
            {"job_id", s.job_id},
            {"generation", s.generation},
            {"step", s.step},
            {"epoch", s.epoch},
            {"data_cursor", s.data_cursor},
            {"world_size", s.world_size},
            {"global_batch_size", s.global_batch_size},
            {"total_steps", s.total_steps},
            {"rng",
             {{"torch_cpu_generator", s.torch_rng_state},
              {"data_order",
               {{"kind", "mt19937_64(seed*1000003+epoch) fisher-yates"},
                {"seed", s.seed},
                {"shuffle", s.shuffle}}}}},
            {"lr_scheduler", {{"name", s.lr_schedule}, {"last_lr", s.last_lr}, {"step", s.step}}}};
  if (!s.parameter_servers.empty()) {
    j["parameter_servers"] = json::parse(s.parameter_servers, nullptr, /*allow_exceptions=*/false);
  }
  if (!s.pipeline.empty()) {
    j["pipeline"] = json::parse(s.pipeline, nullptr, /*allow_exceptions=*/false);
  }
  if (s.loss_scale > 0) {
    // torch.cuda.amp.GradScaler.state_dict()'s names.
    j["loss_scaler"] = {{"scale", s.loss_scale}, {"_growth_tracker", s.loss_scale_growth_tracker}};
  }
  return j.dump(2);
}

absl::StatusOr<TrainerState> DecodeTrainerState(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("trainer_state.json: not a JSON object");
  }
  TrainerState s;
  const json& rng = j.contains("rng") ? j["rng"] : json::object();
  const json& order = rng.contains("data_order") ? rng["data_order"] : json::object();
  const json& lr = j.contains("lr_scheduler") ? j["lr_scheduler"] : json::object();
  if (!ReadField(j, "job_id", s.job_id) || !ReadField(j, "generation", s.generation) ||
      !ReadField(j, "step", s.step) || !ReadField(j, "epoch", s.epoch) ||
      !ReadField(j, "data_cursor", s.data_cursor) || !ReadField(j, "world_size", s.world_size) ||
      !ReadField(j, "global_batch_size", s.global_batch_size) ||
      !ReadField(j, "total_steps", s.total_steps) ||
      !ReadField(rng, "torch_cpu_generator", s.torch_rng_state) ||
      !ReadField(order, "seed", s.seed) || !ReadField(order, "shuffle", s.shuffle) ||
      !ReadField(lr, "name", s.lr_schedule) || !ReadField(lr, "last_lr", s.last_lr)) {
    return absl::InvalidArgumentError("trainer_state.json: missing or mistyped fields");
  }
  if (j.contains("parameter_servers")) s.parameter_servers = j["parameter_servers"].dump();
  if (j.contains("pipeline")) s.pipeline = j["pipeline"].dump();
  if (j.contains("loss_scaler")) {
    const json& scaler = j["loss_scaler"];
    if (!ReadField(scaler, "scale", s.loss_scale) ||
        !ReadField(scaler, "_growth_tracker", s.loss_scale_growth_tracker)) {
      return absl::InvalidArgumentError("trainer_state.json: loss_scaler is missing fields");
    }
  }
  return s;
}

std::string TorchRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  return absl::BytesToHexString(absl::string_view(static_cast<const char*>(state.data_ptr()),
                                                  static_cast<size_t>(state.nbytes())));
}

absl::Status RestoreTorchRngState(const std::string& hex) {
  if (hex.empty() || hex.size() % 2 != 0 ||
      hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return absl::InvalidArgumentError("torch_cpu_generator: not a hex string");
  }
  // Decoded here: Abseil's HexStringToBytes changed its signature (newer releases return a bool
  // and deprecate the old form), and the text is already checked.
  auto nibble = [](char c) {
    return static_cast<uint8_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  };
  torch::Tensor state = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  uint8_t* bytes = state.data_ptr<uint8_t>();
  for (size_t i = 0; i < hex.size() / 2; ++i) {
    bytes[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("torch_cpu_generator: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

Checkpointer::Checkpointer(ObjectStore* store, CoordinatorClient* coordinator, const Clock& clock,
                           Options options)
    : store_(store), coordinator_(coordinator), clock_(clock), options_(std::move(options)) {
  // Only our own step folders: resume lists may name another job's checkpoints too.
  const std::string own = JoinUri(options_.base_uri, kCheckpointStepPrefix);
  for (const std::string& uri : options_.committed) {
    if (absl::StartsWith(uri, own)) committed_.insert(uri);
  }
}

Checkpointer::~Checkpointer() { Wait().IgnoreError(); }

bool Checkpointer::SaveAsync(int64_t step, absl::FunctionRef<CheckpointData()> snapshot,
                             bool final_save, absl::Time give_up_at) {
  // A later pipeline stage saves whenever the first does (which decides whether to skip): its
  // objects must be there when the first stage lists them.
  if (options_.parts > 1 && options_.part > 0) final_save = true;
  if (upload_.joinable() && !final_save) {
    absl::MutexLock lock(&mu_);
    // Waiting out a coordinator outage would stall training for nothing.
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return upload_done_ || commit_retrying_;
    };
    // An upload running far longer than saves usually take is a store in trouble (unreachable,
    // say): waiting for it would stall training for nothing too. Waits at most until it has
    // taken twice the longest recent save and a second more, and never beyond max_wait.
    absl::Duration wait = options_.max_wait;
    if (!recent_durations_.empty()) {
      const absl::Duration usual =
          *std::max_element(recent_durations_.begin(), recent_durations_.end());
      const absl::Duration running = clock_.Now() - upload_started_;
      wait = std::clamp(2 * usual + absl::Seconds(1) - running, absl::ZeroDuration(), wait);
    }
    mu_.AwaitWithTimeout(absl::Condition(&settled), wait);
    if (!upload_done_) {
      skipped_++;
      if (commit_retrying_) {
        // Once per outage: at a short checkpoint period there would be a line every few steps.
        if (skip_logged_step_ != upload_step_) {
          skip_logged_step_ = upload_step_;
          LogWarning("checkpoint of step ", step, " skipped: the commit of step ", upload_step_,
                     " is being retried (the coordinator is unreachable); due checkpoints are "
                     "skipped until it goes through");
        }
      } else {
        LogWarning("checkpoint of step ", step, " skipped: the checkpoint of step ", upload_step_,
                   " is still uploading after ",
                   absl::FormatDuration(
                       absl::Trunc(clock_.Now() - upload_started_, absl::Milliseconds(1))),
                   recent_durations_.empty() ? "" : " (longer than saves usually take)");
      }
      return false;
    }
  }
  absl::Status previous = Wait();
  if (!previous.ok()) {
    LogWarning("checkpoint of step ", upload_step_, " was not saved: ", previous.ToString());
  }
  CheckpointData data = snapshot();
  upload_step_ = data.state.step;
  upload_started_ = clock_.Now();
  {
    absl::MutexLock lock(&mu_);
    upload_done_ = false;
  }
  upload_ = std::thread([this, give_up_at, data = std::move(data)]() mutable {
    // Serialising, hashing and sending compete with training for the CPU: the training thread
    // goes first. Threads the upload starts (parallel parts) inherit the lower priority.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
    if (!options_.upload_cpus.empty()) PinThisThread(options_.upload_cpus);
    torch::NoGradGuard no_grad;
    try {
      upload_status_ = Save(data, give_up_at);
    } catch (const std::exception& e) {
      upload_status_ = absl::InternalError(
          absl::StrCat("checkpoint of step ", data.state.step, ": ", DescribeTorchError(e)));
    }
    // The snapshot's memory goes before the training thread is told the upload is over.
    data = CheckpointData();
    absl::MutexLock lock(&mu_);
    upload_done_ = true;
    commit_retrying_ = false;
  });
  return true;
}

absl::Status Checkpointer::Wait() { return WaitUntil(absl::InfiniteFuture()); }

absl::Status Checkpointer::WaitUntil(absl::Time deadline) {
  if (!upload_.joinable()) return absl::OkStatus();
  if (deadline != absl::InfiniteFuture()) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&upload_done_), deadline - clock_.Now())) {
      return absl::DeadlineExceededError(
          absl::StrCat("the checkpoint of step ", upload_step_, " is still being saved"));
    }
  }
  upload_.join();
  absl::Status status = std::move(upload_status_);
  upload_status_ = absl::OkStatus();
  return status;
}

namespace {

// UNAVAILABLE (the store failed), but PERMISSION_DENIED stays so: a place the job may not write
// (outside its allowed folders, or refused by the store) is its spec's doing, and retrying on
// another attempt will not change it.
absl::Status UploadFailed(const absl::Status& status) {
  return absl::Status(absl::IsPermissionDenied(status) ? absl::StatusCode::kPermissionDenied
                                                       : absl::StatusCode::kUnavailable,
                      absl::StrCat("checkpoint upload: ", status.message()));
}

}  // namespace

absl::StatusOr<std::string> Checkpointer::PutPiecesWithRetries(
    const std::string& uri, const std::vector<absl::string_view>& pieces) {
  std::string sha256;
  absl::Status status = Retry(clock_, StorageRetry(), UnlessRefused, [&]() -> absl::Status {
    absl::StatusOr<std::string> put = store_->PutPieces(uri, pieces);
    if (!put.ok()) return put.status();
    sha256 = *std::move(put);
    return absl::OkStatus();
  });
  if (!status.ok()) return UploadFailed(status);
  return sha256;
}

absl::Status Checkpointer::PutWithRetries(const std::string& uri, const std::string& bytes) {
  absl::Status status =
      Retry(clock_, StorageRetry(), UnlessRefused, [&] { return store_->Put(uri, bytes); });
  if (!status.ok()) return UploadFailed(status);
  return status;
}

namespace {

// The objects pipeline stage `part` of attempt `generation` listed in the step folder `step_uri`,
// once it has: polled, backing off to a second apart, until `wait` has passed or `give_up_at`.
absl::StatusOr<json> AwaitPart(ObjectStore& store, const Clock& clock, const std::string& step_uri,
                               int part, int64_t generation, absl::Duration wait,
                               absl::Time give_up_at) {
  const std::string uri = JoinUri(step_uri, PartListName(part, generation));
  const absl::Time deadline = std::min(give_up_at, clock.Now() + wait);
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    absl::StatusOr<std::string> bytes = store.Get(uri);
    if (bytes.ok()) {
      json list = json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
      int64_t listed_generation = -1;
      if (list.is_discarded() || !ReadField(list, "generation", listed_generation) ||
          listed_generation != generation || !list.contains("objects") ||
          !list["objects"].is_array()) {
        return absl::DataLossError(absl::StrCat(uri, ": not a list of this attempt's objects"));
      }
      return list["objects"];
    } else if (!absl::IsNotFound(bytes.status())) {
      LogWarning("checkpoint: reading ", uri, ": ", bytes.status().ToString());
    }
    if (clock.Now() + pause > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("checkpoint: pipeline stage ", part,
                                                      " did not list its objects in ", uri,
                                                      " within ", absl::FormatDuration(wait)));
    }
    clock.SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(1));
  }
}

}  // namespace

absl::Status Checkpointer::Save(const CheckpointData& data, absl::Time give_up_at) {
  const int64_t step = data.state.step;
  const std::string step_uri = CheckpointStepUri(options_.base_uri, step);
  // Leftovers of an earlier attempt go before we write, so that keys are never overwritten.
  if (options_.collect_garbage && coordinator_ != nullptr && !collected_once_) {
    collected_once_ = true;
    CollectGarbage(step);
  }
  // Each object is written from the snapshot's tensors as they are, and its hash for the
  // manifest comes from the pass over the bytes that the store makes to write them.
  absl::StatusOr<SafetensorsPieces> model = LayOutTensors(data.model, {{"format", "trainyard/1"}});
  if (!model.ok()) return model.status();
  absl::StatusOr<SafetensorsPieces> optimizer =
      LayOutTensors(data.optimizer, {{"optimizer", data.optimizer_name}});
  if (!optimizer.ok()) return optimizer.status();
  const int part = options_.parts > 1 ? options_.part : -1;
  const std::string state = part <= 0 ? EncodeTrainerState(data.state) : std::string();
  const std::string model_name = ObjectName(kModelBase, part, data.state.generation);
  const std::string optimizer_name = ObjectName(kOptimizerBase, part, data.state.generation);
  std::vector<std::pair<std::string, std::vector<absl::string_view>>> writes = {
      {model_name, model->Pieces()}, {optimizer_name, optimizer->Pieces()}};
  const std::string state_name = StateObjectName(data.state.generation);
  if (part <= 0) writes.push_back({state_name, {state}});

  json objects = json::array();
  int64_t total_bytes = 0;
  for (const auto& [name, pieces] : writes) {
    absl::StatusOr<std::string> sha256 = PutPiecesWithRetries(JoinUri(step_uri, name), pieces);
    if (!sha256.ok()) return sha256.status();
    int64_t size = 0;
    for (absl::string_view piece : pieces) size += static_cast<int64_t>(piece.size());
    objects.push_back({{"name", name}, {"size", size}, {"sha256", *sha256}});
    total_bytes += size;
  }
  if (part > 0) {
    // A later stage: its list, for the first stage's manifest. It commits nothing itself.
    json list = {{"generation", data.state.generation}, {"step", step}, {"objects", objects}};
    absl::Status put =
        PutWithRetries(JoinUri(step_uri, PartListName(part, data.state.generation)), list.dump(2));
    if (!put.ok()) return put;
    last_saved_step_ = step;
    LogInfo("checkpoint stage ", part, " written: ", step_uri, " (", total_bytes, " bytes)");
    RecordDuration(data.snapshot_time + (clock_.Now() - upload_started_));
    return absl::OkStatus();
  }
  for (int other = 1; part == 0 && other < options_.parts; ++other) {
    absl::StatusOr<json> listed = AwaitPart(*store_, clock_, step_uri, other, data.state.generation,
                                            options_.parts_wait, give_up_at);
    if (!listed.ok()) return listed.status();
    for (const json& entry : *listed) {
      objects.push_back(entry);
      total_bytes += JsonInt(entry, "size", 0);
    }
  }
  json manifest = {{"format", kCheckpointFormat},
                   {"job_id", data.state.job_id},
                   {"step", step},
                   {"generation", data.state.generation},
                   {"created_unix_ms", absl::ToUnixMillis(clock_.Now())},
                   {"objects", objects}};
  const std::string manifest_bytes = manifest.dump(2);
  absl::Status put =
      PutWithRetries(JoinUri(step_uri, ManifestName(data.state.generation)), manifest_bytes);
  if (!put.ok()) return put;
  total_bytes += static_cast<int64_t>(manifest_bytes.size());
  last_saved_step_ = step;
  LogInfo("checkpoint written: ", step_uri, " (", total_bytes, " bytes)");

  if (coordinator_ == nullptr) {
    RecordDuration(data.snapshot_time + (clock_.Now() - upload_started_));
    return absl::OkStatus();
  }
  std::vector<std::string> retired;
  const absl::Time commit_give_up = std::min(give_up_at, clock_.Now() + options_.commit_retry_for);
  bool failed_once = false;
  absl::Status commit =
      Retry(clock_, CoordinatorRetry(commit_give_up, options_.backoff, options_.max_backoff),
            IsRetryableCoordinatorError, [&]() -> absl::Status {
              absl::StatusOr<std::vector<std::string>> r =
                  coordinator_->CommitCheckpoint(step, total_bytes, upload_started_);
              if (!r.ok()) {
                if (!failed_once && IsRetryableCoordinatorError(r.status())) {
                  failed_once = true;
                  LogWarning("checkpoint commit of step ", step, " failed, retrying for up to ",
                             absl::FormatDuration(commit_give_up - clock_.Now()), ": ",
                             r.status().ToString());
                  absl::MutexLock lock(&mu_);
                  commit_retrying_ = true;
                }
                return r.status();
              }
              retired = *std::move(r);
              return absl::OkStatus();
            });
  if (!commit.ok()) {
    return absl::Status(commit.code(),
                        absl::StrCat("checkpoint commit of step ", step, ": ", commit.message()));
  }
  if (failed_once) LogInfo("checkpoint commit of step ", step, " went through");
  RecordDuration(data.snapshot_time + (clock_.Now() - upload_started_));
  {
    absl::MutexLock lock(&mu_);
    last_committed_step_ = step;
  }
  committed_.insert(step_uri);
  for (const std::string& uri : retired) {
    committed_.erase(uri);
    DeleteRetired(uri);
  }
  if (options_.collect_garbage) CollectGarbage(step + 1);
  return absl::OkStatus();
}

void Checkpointer::RecordDuration(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  recent_durations_.push_back(duration);
  while (recent_durations_.size() > kRecentSaves) recent_durations_.pop_front();
}

void Checkpointer::CollectGarbage(int64_t keep_from) {
  std::string base = options_.base_uri;
  if (base.empty() || base.back() != '/') base += '/';
  absl::StatusOr<std::vector<ObjectInfo>> objects =
      store_->List(JoinUri(base, kCheckpointStepPrefix));
  if (!objects.ok()) {
    LogWarning("garbage collection: cannot list ", base, ": ", objects.status().ToString());
    return;
  }
  std::set<std::string> garbage;
  for (const ObjectInfo& info : *objects) {
    if (!absl::StartsWith(info.uri, base)) continue;
    const std::string relative = info.uri.substr(base.size());
    const size_t slash = relative.find('/');
    if (slash == std::string::npos) continue;  // a stray object, not inside a step folder
    const std::string folder = JoinUri(options_.base_uri, relative.substr(0, slash));
    if (committed_.count(folder) > 0) continue;
    // A pipeline's later stages may be writing the folders of this save and the next.
    int64_t step = -1;
    if (options_.parts > 1 &&
        absl::SimpleAtoi(
            relative.substr(strlen(kCheckpointStepPrefix), slash - strlen(kCheckpointStepPrefix)),
            &step) &&
        step >= keep_from) {
      continue;
    }
    garbage.insert(folder);
  }
  for (const std::string& folder : garbage) {
    LogInfo("garbage collection: deleting ", folder, " (no committed checkpoint refers to it)");
    DeleteRetired(folder);
  }
}

void Checkpointer::DeleteRetired(const std::string& step_uri) {
  std::string prefix = step_uri;
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  absl::StatusOr<std::vector<ObjectInfo>> objects = store_->List(prefix);
  if (!objects.ok()) {
    LogWarning("cannot list retired checkpoint ", step_uri, ": ", objects.status().ToString());
    return;
  }
  // The manifest goes first so that a half-deleted folder never looks like a checkpoint.
  std::vector<std::string> uris;
  for (const ObjectInfo& info : *objects) {
    const size_t slash = info.uri.rfind('/');
    if (ManifestGeneration(absl::string_view(info.uri).substr(slash + 1)).has_value()) {
      uris.insert(uris.begin(), info.uri);
    } else {
      uris.push_back(info.uri);
    }
  }
  for (const std::string& uri : uris) {
    absl::Status status = store_->Delete(uri);
    if (!status.ok()) LogWarning("cannot delete ", uri, ": ", status.ToString());
  }
}

}  // namespace trainyard::trainer
