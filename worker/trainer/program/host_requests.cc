// What a program asks of its host over the socket: reports, the stop step, commits.

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/json_fields.h"
#include "common/log.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/uri.h"
#include "worker/trainer/program/files.h"
#include "worker/trainer/program/host.h"

namespace trainyard::trainer::program {
namespace {

using nlohmann::json;

constexpr char kCommitKey[] = "program/commit/";
// A program's own metrics: at most this many names, each of at most kMaxMetricName bytes.
constexpr size_t kMaxMetrics = 64;
constexpr size_t kMaxMetricName = 64;

json Refused(absl::string_view why) { return {{"ok", false}, {"error", std::string(why)}}; }

bool IsMetricName(const std::string& name) {
  if (name.empty() || name.size() > kMaxMetricName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-';
  });
}

// `request[key]` as a step: an integer >= 0.
std::optional<int64_t> StepOf(const json& request) {
  const auto it = request.find("step");
  if (it == request.end() || !it->is_number_integer()) return std::nullopt;
  const int64_t step = it->get<int64_t>();
  if (step < 0) return std::nullopt;
  return step;
}

// Rank 0's outcome of a commit as the other ranks read it: "ok", or "<code> <message>".
std::string EncodeOutcome(const absl::Status& status) {
  if (status.ok()) return "ok";
  return absl::StrCat(static_cast<int>(status.code()), " ", status.message());
}
absl::Status DecodeOutcome(const std::string& text) {
  const size_t space = text.find(' ');
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (space == std::string::npos || !absl::SimpleAtoi(text.substr(0, space), &code) || code <= 0 ||
      code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(text);
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("rank 0: ", text.substr(space + 1)));
}

}  // namespace

json Host::Handle(const json& request) {
  const std::string op = JsonString(request, "op");
  if (op == "report") return OnReport(request);
  if (op == "commit") return OnCommit(request);
  if (op == "stopping") {
    const std::optional<int64_t> step = StepOf(request);
    if (!step.has_value()) return Refused("stopping: step must be an integer >= 0");
    absl::MutexLock lock(&mu_);
    stopping_at_ = *step;
    return {{"ok", true}};
  }
  return Refused(absl::StrCat("unknown request '", op, "'"));
}

json Host::OnReport(const json& request) {
  const std::optional<int64_t> step = StepOf(request);
  if (!step.has_value()) return Refused("report: step must be an integer >= 0");
  const json metrics = JsonField(request, "metrics", json::object());
  if (!metrics.is_object() || metrics.size() > kMaxMetrics) {
    return Refused(absl::StrCat("report: at most ", kMaxMetrics, " metrics, by name"));
  }
  trainyard::v1::JobProgress progress;
  {
    absl::MutexLock lock(&mu_);
    progress_.set_step(*step);
    progress_.set_steps_unknown(false);
    progress_.set_world_size(task_.world_size());
    progress_.set_attempt_start_step(restore_step_);
    progress_.set_rendezvous_seconds(rendezvous_seconds_);
    progress_.set_checkpoint_load_seconds(restore_seconds_);
    for (const auto& [name, value] : metrics.items()) {
      if (!value.is_number() || !IsMetricName(name)) continue;
      const double v = value.get<double>();
      if (name == "loss") {
        progress_.set_loss(v);
      } else if (name == "val_loss") {
        progress_.set_has_val_loss(true);
        progress_.set_val_loss(v);
      } else if (name == "val_accuracy") {
        progress_.set_has_val_accuracy(true);
        progress_.set_val_accuracy(v);
      } else if (name == "samples_per_second") {
        progress_.set_samples_per_second(v);
      } else if (name == "epoch") {
        progress_.set_epoch(static_cast<int64_t>(v));
      } else if (name == "total_steps") {
        progress_.set_total_steps(static_cast<int64_t>(v));
      } else {
        (*progress_.mutable_metrics())[name] = v;
      }
    }
    reported_ = true;
    progress = progress_;
  }
  reported_or_ended_.SignalAll();
  if (reporter_ != nullptr) reporter_->Update(progress);
  if (options_.before_step) options_.before_step(*step, restore_step_);
  // A test that holds the program at a step needs to see every step; otherwise the module sends
  // the latest figures at most every 50 ms (it writes each step to the step file itself).
  return {{"ok", true}, {"every_step", static_cast<bool>(options_.before_step)}};
}

json Host::OnCommit(const json& request) {
  const std::optional<int64_t> step = StepOf(request);
  if (!step.has_value()) return Refused("commit_checkpoint: step must be an integer >= 0");
  absl::Status status;
  {
    absl::MutexLock lock(&commit_mu_);
    status = Commit(*step);
  }
  if (!status.ok()) {
    Fail(status);
    return Refused(status.message());
  }
  return {{"ok", true}};
}

void Host::Fail(const absl::Status& status) {
  LogError("checkpoint: ", status.message());
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = status;
}

absl::Status Host::Commit(int64_t step) {
  const int64_t n = ++commits_;
  const absl::Time started = clock_.Now();
  if (checkpoint_store_ == nullptr) {
    return absl::FailedPreconditionError(
        "commit_checkpoint: the job has no checkpoint store (checkpoint.uri, or the "
        "coordinator's --checkpoint_root)");
  }
  const std::string step_uri = CheckpointStepUri(task_.checkpoint_uri(), step);
  absl::StatusOr<std::vector<StoredFile>> files =
      UploadFiles(*checkpoint_store_, paths_.checkpoint_dir, step_uri, task_.generation());
  const bool alone = task_.world_size() <= 1 || options_.rendezvous == nullptr;
  if (!alone && task_.rank() != 0) {
    json mine = {{"step", step}};
    if (files.ok()) {
      mine["objects"] = EncodeFiles(*files);
    } else {
      mine["error"] = std::string(files.status().message());
    }
    const std::string key = absl::StrCat(kCommitKey, n, "/", task_.rank());
    if (absl::Status s = options_.rendezvous->Set(key, mine.dump()); !s.ok()) return s;
    if (!files.ok()) return files.status();
    absl::StatusOr<std::string> done =
        options_.rendezvous->Get(absl::StrCat(kCommitKey, n, "/done"),
                                 options_.peer_timeout + options_.coordinator_retry_for);
    if (!done.ok()) return done.status();
    if (*done != "ok") return DecodeOutcome(*done);
    EmptyFolder(paths_.checkpoint_dir);
    return absl::OkStatus();
  }
  if (!files.ok()) return files.status();
  absl::Status status = CommitAsRankZero(n, step, *std::move(files), started);
  if (!alone) {
    options_.rendezvous->Set(absl::StrCat(kCommitKey, n, "/done"), EncodeOutcome(status))
        .IgnoreError();
  }
  if (status.ok()) EmptyFolder(paths_.checkpoint_dir);
  return status;
}

absl::Status Host::CommitAsRankZero(int64_t n, int64_t step, std::vector<StoredFile> files,
                                    absl::Time started) {
  std::map<std::string, int> writer;  // restored path -> rank
  for (const StoredFile& f : files) writer[RestoredPath(f.name)] = 0;
  const bool alone = task_.world_size() <= 1 || options_.rendezvous == nullptr;
  for (int r = 1; !alone && r < task_.world_size(); ++r) {
    absl::StatusOr<std::string> text =
        options_.rendezvous->Get(absl::StrCat(kCommitKey, n, "/", r), options_.peer_timeout);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          absl::StrCat("commit_checkpoint of step ", step, ": rank ", r,
                                       " did not commit in time: ", text.status().message()));
    }
    const json theirs = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!theirs.is_object()) return absl::InternalError(absl::StrCat("rank ", r, ": bad entry"));
    if (theirs.contains("error")) {
      return absl::UnavailableError(absl::StrCat("commit_checkpoint of step ", step, ": rank ", r,
                                                 ": ", JsonString(theirs, "error")));
    }
    const int64_t their_step = JsonInt(theirs, "step", -1);
    if (their_step != step) {
      return absl::InvalidArgumentError(
          absl::StrCat("commit_checkpoint: rank ", r, " committed step ", their_step,
                       " where rank 0 committed "
                       "step ",
                       step, ": every rank commits the same steps, in the same order"));
    }
    absl::StatusOr<std::vector<StoredFile>> their_files =
        DecodeFiles(JsonField(theirs, "objects", json::array()));
    if (!their_files.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", r, "'s part of the commit: ", their_files.status().message()));
    }
    for (StoredFile& f : *their_files) {
      const auto [it, fresh] = writer.emplace(RestoredPath(f.name), r);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat("commit_checkpoint of step ", step,
                                                       ": ranks ", it->second, " and ", r,
                                                       " both wrote '", it->first,
                                                       "': each file of a checkpoint has one "
                                                       "writer"));
      }
      files.push_back(std::move(f));
    }
  }
  int64_t bytes = 0;
  for (const StoredFile& f : files) bytes += f.size;
  const std::string step_uri = CheckpointStepUri(task_.checkpoint_uri(), step);
  const std::string manifest = EncodeManifest(task_.job_id(), step, task_.generation(),
                                              absl::ToUnixMillis(clock_.Now()), files);
  if (absl::Status s =
          checkpoint_store_->Put(JoinUri(step_uri, ManifestName(task_.generation())), manifest);
      !s.ok()) {
    return s;
  }
  if (options_.coordinator == nullptr) return absl::OkStatus();
  std::vector<std::string> retired;
  absl::Status committed =
      Retry(clock_, CoordinatorRetry(clock_.Now() + options_.coordinator_retry_for),
            IsRetryableCoordinatorError, [&]() -> absl::Status {
              absl::StatusOr<std::vector<std::string>> r =
                  options_.coordinator->CommitCheckpoint(step, bytes, started);
              if (!r.ok()) return r.status();
              retired = *std::move(r);
              return absl::OkStatus();
            });
  if (!committed.ok()) {
    return absl::Status(committed.code(),
                        absl::StrCat("commit of step ", step, ": ", committed.message()));
  }
  LogInfo("committed the checkpoint of step ", step, " (", files.size(), " files, ", bytes,
          " bytes)");
  for (const std::string& folder : retired) {
    absl::StatusOr<std::vector<ObjectInfo>> objects =
        checkpoint_store_->List(absl::StrCat(folder, "/"));
    if (!objects.ok()) continue;
    for (const ObjectInfo& o : *objects) checkpoint_store_->Delete(o.uri).IgnoreError();
  }
  return absl::OkStatus();
}

}  // namespace trainyard::trainer::program
