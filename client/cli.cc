#include "client/cli.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/args.h"
#include "client/credentials.h"
#include "client/data_pack.h"
#include "client/format.h"
#include "client/local_cluster.h"
#include "client/views.h"
#include "common/channel.h"
#include "common/object_store.h"
#include "common/safetensors.h"
#include "common/shard_index.h"
#include "common/uri.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "trainyard/v1/admin_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"
#include "trainyard/v1/search_service.grpc.pb.h"
#include "worker/agent/subprocess.h"

namespace trainyard::cli {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(30);

const FlagSpec kOutputFlag{"output", 'o', true, "FORMAT", "table (default) or json"};

std::vector<FlagSpec> GlobalFlags() {
  return {{"coordinator", '\0', true, "ADDR",
           "coordinator host:port (default: $TRAINYARD_COORDINATOR, else 127.0.0.1:7070)"},
          {"token-file", '\0', true, "FILE",
           "file holding the bearer token (default: $TRAINYARD_TOKEN, $TRAINYARD_TOKEN_FILE, "
           "else the one `trainyard up` left for ADDR)"},
          {"ca", '\0', true, "FILE",
           "PEM CA of the coordinator's TLS certificate: use TLS (default: $TRAINYARD_CA_FILE)"},
          {"cert", '\0', true, "FILE", "PEM client certificate, with --key ($TRAINYARD_CERT_FILE)"},
          {"key", '\0', true, "FILE", "PEM key of --cert ($TRAINYARD_KEY_FILE)"},
          {"tls-server-name", '\0', true, "NAME",
           "name the coordinator's certificate carries, when not ADDR's host"},
          {"insecure", '\0', false, "",
           "allow plaintext to a coordinator not on this machine (the token travels in clear)"}};
}

std::vector<CommandSpec> Commands() {
  return {
      {"submit",
       "FILE",
       "Submit the job spec in FILE (YAML; - for stdin) and print its id.",
       {{"wait", '\0', false, "",
         "follow the job until it ends; exit 0 succeeded, 1 failed, 3 "
         "cancelled"},
        {"resume-from", '\0', true, "JOB",
         "start from the latest committed checkpoint of JOB (sets checkpoint.resume_from)"}},
       1,
       1},
      {"jobs",
       "",
       "List jobs, newest first.",
       {{"state", '\0', true, "STATE", "only jobs in STATE (PENDING, RUNNING, FAILED, ...)"},
        kOutputFlag},
       0,
       0},
      {"describe",
       "JOB",
       "Show a job: state, progress, tasks and every event.",
       {kOutputFlag},
       1,
       1},
      {"logs",
       "JOB",
       "Print the logs of a job's ranks and parameter-server shards.",
       {{"follow", 'f', false, "", "keep printing until the job ends"},
        {"rank", '\0', true, "N", "only rank N (default: every rank and shard)"},
        {"shard", '\0', true, "N", "only parameter-server shard N"}},
       1,
       1},
      {"cancel", "JOB", "Cancel a job.", {}, 1, 1},
      {"delete",
       "JOB",
       "Delete a finished job now: its record, events, tasks and logs (the coordinator does it "
       "--job_retention after the job finished in any case). Its checkpoints stay in storage "
       "unless --checkpoints is given.",
       {{"checkpoints", '\0', false, "",
         "first delete its checkpoints and exported model (everything under its checkpoint "
         "URI), with this machine's storage credentials (for s3://, the AWS_* variables the "
         "workers use)"}},
       1,
       1},
      {"workers", "", "List the worker machines.", {kOutputFlag}, 0, 0},
      {"checkpoints",
       "JOB",
       "List a job's committed checkpoints, newest first.",
       {kOutputFlag},
       1,
       1},
      {"data",
       "inspect URI | pack PREFIX INPUT...",
       "`data inspect URI`: print the index of a sharded safetensors data set (a path, file:// "
       "or s3:// URI with wildcards in file names), read from the shards' headers only: shards, "
       "samples, tensors, dtypes, shapes and bytes; s3:// uses this machine's AWS_* variables. "
       "`data pack PREFIX TENSOR=FILE.npy...` or `data pack PREFIX FILE.csv --columns SPEC`: "
       "write PREFIX-00000.safetensors, ... (local files) from NumPy arrays (the first dimension "
       "is the sample) or CSV columns; nothing is written unless all of it is.",
       {kOutputFlag,
        {"columns", '\0', true, "SPEC",
         "pack, CSV: which columns make which tensor, e.g. 'x=age,income:F32;y=label:I64' "
         "(dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)"},
        {"shard-size", '\0', true, "BYTES",
         "pack: data per shard (256MB by default; 64MiB, 1GB, plain bytes)"}},
       2,
       1000},
      {"search",
       "ACTION [ARG]",
       "Hyperparameter searches, whose trials are jobs: `search submit FILE` (a search spec: "
       "name, searcher {name: random|grid|asha, metric, max_trials, ...}, hyperparameters by "
       "field path, template: a job spec; prints the search's id), `search list`, "
       "`search describe ID` (every trial's values, rung, metric and state; the best trial and "
       "its model), `search cancel ID` (with its running trials), "
       "`search extend ID --max-trials N`.",
       {{"max-trials", '\0', true, "N", "extend: the search's new total of trials"},
        {"wait", '\0', false, "",
         "submit: follow the search until it ends; exit 0 succeeded, 1 failed, 3 cancelled"},
        kOutputFlag},
       1,
       2},
      {"token",
       "ACTION [ARG]",
       "Manage API tokens (admins): `token create NAME --role user|admin|agent [--ttl 30d]` "
       "prints a new token once (for an agent, NAME is the worker it may register as); "
       "`token list`; `token revoke ID`.",
       {{"role", '\0', true, "ROLE", "create: admin, user (default) or agent"},
        {"ttl", '\0', true, "DURATION",
         "create: how long it is valid (30d, 12h; default: until revoked)"},
        kOutputFlag},
       1,
       2},
      {"up",
       "",
       "Run a local cluster (coordinator and workers) in the foreground.",
       {{"workers", '\0', true, "N", "number of workers (default 2)"},
        {"slots", '\0', true, "N", "CPU slots per worker (default: cores / workers)"},
        {"port", '\0', true, "P", "coordinator port (default 7070; 0 picks a free one)"},
        {"state_dir", '\0', true, "DIR", "where state and logs go (default: a new temp folder)"}},
       0,
       0},
  };
}

grpc::ChannelArguments ChannelArguments() {
  grpc::ChannelArguments args;
  // `submit --wait` and `logs -f` ride out a coordinator restart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 * 1024 * 1024);
  return args;
}

bool IsTerminal() { return isatty(STDOUT_FILENO) == 1; }

bool IsFinal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
}

// Deletes every object under a job's checkpoint URI (and, for a local folder, the folder).
absl::Status DeleteCheckpointObjects(const std::string& checkpoint_uri) {
  if (checkpoint_uri.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<ObjectStore>> store = OpenObjectStore(checkpoint_uri);
  if (!store.ok()) return store.status();
  // The trailing '/' keeps job-1 from matching job-10's objects.
  const std::string prefix = absl::StrCat(absl::StripSuffix(checkpoint_uri, "/"), "/");
  absl::StatusOr<std::vector<ObjectInfo>> objects = (*store)->List(prefix);
  if (!objects.ok()) return objects.status();
  int64_t bytes = 0;
  size_t done = 0;
  for (const ObjectInfo& object : *objects) {
    if (absl::Status s = (*store)->Delete(object.uri); !s.ok()) return s;
    bytes += object.size_bytes;
    if (++done % 100 == 0 && IsTerminal()) {
      std::cerr << "\rdeleted " << done << " of " << objects->size() << " objects" << std::flush;
    }
  }
  if (done >= 100 && IsTerminal()) std::cerr << "\r";
  // A local folder is left without its empty subfolders.
  if (absl::StatusOr<std::string> path = LocalPath(checkpoint_uri); path.ok()) {
    std::error_code ec;
    std::vector<std::filesystem::path> dirs;
    for (auto it = std::filesystem::recursive_directory_iterator(*path, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec)) dirs.push_back(it->path());
    }
    // Deepest first, the folder itself last.
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) std::filesystem::remove(*it, ec);
    std::filesystem::remove(*path, ec);
  }
  std::cout << "deleted " << done << " checkpoint objects (" << HumanBytes(bytes) << ") under "
            << checkpoint_uri << "\n";
  return absl::OkStatus();
}

// "256MB", "64MiB", "1G", "1000": bytes.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  static const std::pair<const char*, int64_t> kUnits[] = {{"kib", int64_t{1} << 10},
                                                           {"mib", int64_t{1} << 20},
                                                           {"gib", int64_t{1} << 30},
                                                           {"kb", 1000},
                                                           {"mb", 1000000},
                                                           {"gb", 1000000000},
                                                           {"k", 1000},
                                                           {"m", 1000000},
                                                           {"g", 1000000000},
                                                           {"b", 1}};
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  int64_t unit = 1;
  absl::string_view number = lower;
  for (const auto& [suffix, size] : kUnits) {
    if (absl::EndsWith(lower, suffix)) {
      unit = size;
      number = absl::string_view(lower).substr(0, lower.size() - std::strlen(suffix));
      break;
    }
  }
  double value;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &value) || !(value > 0) ||
      value * static_cast<double>(unit) > 1e15) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size (256MB, 64MiB)"));
  }
  return static_cast<int64_t>(value * static_cast<double>(unit));
}

// `trainyard data pack PREFIX INPUT...`.
int Pack(const ParsedArgs& args) {
  if (args.args.size() < 3) {
    std::cerr << "error: data pack needs PREFIX and TENSOR=FILE.npy... or FILE.csv\n";
    return kExitUsage;
  }
  PackOptions options;
  options.prefix = args.args[1];
  if (args.Has("shard-size")) {
    absl::StatusOr<int64_t> size = ParseByteSize(args.Get("shard-size"));
    if (!size.ok()) {
      std::cerr << "error: --shard-size: " << size.status().message() << "\n";
      return kExitUsage;
    }
    options.shard_bytes = *size;
  }
  const std::vector<std::string> inputs(args.args.begin() + 2, args.args.end());
  if (inputs.size() == 1 && absl::EndsWithIgnoreCase(inputs[0], ".csv")) {
    if (!args.Has("columns")) {
      std::cerr << "error: packing " << inputs[0] << " needs --columns "
                << "(e.g. 'x=age,income:F32;y=label:I64')\n";
      return kExitUsage;
    }
    absl::StatusOr<std::vector<PackColumn>> columns = ParseCsvColumns(args.Get("columns"));
    if (!columns.ok()) {
      std::cerr << "error: " << columns.status().message() << "\n";
      return kExitUsage;
    }
    options.csv_path = inputs[0];
    options.tensors = *std::move(columns);
  } else {
    if (args.Has("columns")) {
      std::cerr << "error: --columns is for a CSV input\n";
      return kExitUsage;
    }
    for (const std::string& input : inputs) {
      const size_t eq = input.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == input.size()) {
        std::cerr << "error: '" << input << "' is not TENSOR=FILE.npy (or one FILE.csv)\n";
        return kExitUsage;
      }
      PackColumn column;
      column.tensor = input.substr(0, eq);
      column.npy_path = input.substr(eq + 1);
      options.tensors.push_back(std::move(column));
    }
  }
  const bool terminal = IsTerminal();
  options.progress = [terminal](int64_t shards, int64_t samples) {
    if (terminal) {
      std::cerr << "\rwrote " << shards << " shards, " << GroupThousands(samples) << " samples"
                << std::flush;
    }
  };
  absl::StatusOr<PackResult> result = PackShards(options);
  if (terminal) std::cerr << "\r\033[K";
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return absl::IsUnavailable(result.status()) ? kExitStorageError : kExitUsage;
  }
  std::cout << "wrote " << result->shards.size() << " shards, " << GroupThousands(result->samples)
            << " samples, " << HumanBytes(result->bytes) << ": " << options.prefix
            << "-*.safetensors\n";
  return kExitSucceeded;
}

// `trainyard data inspect URI` and `data pack`: need no coordinator.
int Data(const ParsedArgs& args) {
  if (args.args[0] == "pack") return Pack(args);
  if (args.args[0] != "inspect") {
    std::cerr << "error: data takes inspect or pack, got '" << args.args[0] << "'\n";
    return kExitUsage;
  }
  if (args.args.size() != 2) {
    std::cerr << "error: data inspect takes one URI\n";
    return kExitUsage;
  }
  absl::StatusOr<ShardIndex> index = IndexShards(args.args[1]);
  if (!index.ok()) {
    std::cerr << "error: " << index.status().message() << "\n";
    return absl::IsNotFound(index.status()) || absl::IsInvalidArgument(index.status())
               ? kExitUsage
               : kExitStorageError;
  }
  if (args.Get("output", "table") == "json") {
    nlohmann::json out;
    out["samples"] = index->samples;
    out["bytes"] = index->bytes;
    out["header_bytes_read"] = index->header_bytes_read;
    out["shards"] = nlohmann::json::array();
    for (const ShardInfo& shard : index->shards) {
      nlohmann::json s;
      s["uri"] = shard.uri;
      s["bytes"] = shard.size_bytes;
      s["samples"] = shard.samples;
      s["tensors"] = nlohmann::json::array();
      for (const SafetensorsSlot& t : shard.header.tensors) {
        s["tensors"].push_back({{"name", t.name},
                                {"dtype", t.dtype},
                                {"shape", t.shape},
                                {"begin", shard.header.data_start + t.begin},
                                {"end", shard.header.data_start + t.end}});
      }
      out["shards"].push_back(std::move(s));
    }
    std::cout << out.dump(2) << "\n";
    return kExitSucceeded;
  }
  std::cout << index->shards.size() << " shards, " << GroupThousands(index->samples) << " samples, "
            << HumanBytes(index->bytes)
            << " (headers read: " << HumanBytes(index->header_bytes_read) << ")\n\n";
  std::vector<std::vector<std::string>> shard_rows;
  for (const ShardInfo& shard : index->shards) {
    shard_rows.push_back({shard.uri, shard.samples < 0 ? "mixed" : GroupThousands(shard.samples),
                          HumanBytes(shard.size_bytes)});
  }
  std::cout << Table({"SHARD", "SAMPLES", "BYTES"}, shard_rows) << "\n";
  // The tensors of the first shard, per sample; shards that differ are named.
  const ShardInfo& first = index->shards.front();
  std::vector<std::vector<std::string>> tensor_rows;
  for (const SafetensorsSlot& t : first.header.tensors) {
    std::vector<std::string> dims;
    for (size_t i = 1; i < t.shape.size(); ++i) dims.push_back(absl::StrCat(t.shape[i]));
    int64_t bytes = 0;
    for (const ShardInfo& shard : index->shards) {
      for (const SafetensorsSlot& u : shard.header.tensors) {
        if (u.name == t.name) bytes += static_cast<int64_t>(u.end - u.begin);
      }
    }
    tensor_rows.push_back(
        {t.name, t.dtype, absl::StrCat("[", absl::StrJoin(dims, ", "), "]"), HumanBytes(bytes)});
  }
  std::cout << Table({"TENSOR", "DTYPE", "SHAPE PER SAMPLE", "BYTES (ALL SHARDS)"}, tensor_rows);
  for (const ShardInfo& shard : index->shards) {
    bool same = shard.header.tensors.size() == first.header.tensors.size();
    for (size_t i = 0; same && i < shard.header.tensors.size(); ++i) {
      const SafetensorsSlot& a = shard.header.tensors[i];
      const SafetensorsSlot& b = first.header.tensors[i];
      same = a.name == b.name && a.dtype == b.dtype &&
             std::vector<int64_t>(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end()) ==
                 std::vector<int64_t>(b.shape.begin() + (b.shape.empty() ? 0 : 1), b.shape.end());
    }
    if (!same) std::cout << "warning: " << shard.uri << " holds other tensors than the first\n";
  }
  return kExitSucceeded;
}

// A spec from a file, or from stdin for "-".
absl::StatusOr<std::string> ReadSpecFile(const std::string& file) {
  std::ostringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
    return text.str();
  }
  std::ifstream in(file);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", file));
  text << in.rdbuf();
  return text.str();
}

class Client {
 public:
  Client(std::string address, const ParsedArgs& args, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)),
        args_(args),
        stub_(v1::JobService::NewStub(channel)),
        admin_(v1::AdminService::NewStub(channel)),
        search_(v1::SearchService::NewStub(channel)) {}

  int Submit();
  int Jobs();
  int Describe();
  int Logs();
  int Cancel();
  int Delete();
  int Workers();
  int Checkpoints();
  int Token();
  int Search();

 private:
  // Prints the error and returns the exit code for it.
  int RpcError(const grpc::Status& status) const {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::cerr << "error: cannot reach the coordinator at " << address_ << ": "
                << status.error_message() << "\n";
    } else {
      std::cerr << "error: " << status.error_message() << "\n";
    }
    return kExitRpcError;
  }
  bool Json() const {
    const std::string output = args_.Get("output", "table");
    return output == "json";
  }
  int Follow(const std::string& id);
  int FollowSearch(const std::string& id);

  const std::string address_;
  const ParsedArgs& args_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<v1::SearchService::Stub> search_;
};

int Client::Submit() {
  absl::StatusOr<std::string> read = ReadSpecFile(args_.args[0]);
  if (!read.ok()) {
    std::cerr << "error: " << read.status().message() << "\n";
    return kExitUsage;
  }
  std::string yaml = *std::move(read);
  if (args_.Has("resume-from")) {
    absl::StatusOr<std::string> updated = SetResumeFrom(yaml, args_.Get("resume-from"));
    if (!updated.ok()) {
      std::cerr << "error: invalid job spec: " << updated.status().message() << "\n";
      return kExitUsage;
    }
    yaml = *updated;
  }
  v1::SubmitJobRequest request;
  request.set_spec_yaml(yaml);
  v1::Job job;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->SubmitJob(&context, request, &job);
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    const std::string& message = status.error_message();
    std::cerr << "error: "
              << (message.rfind("invalid job spec", 0) == 0 ? "" : "invalid job spec: ") << message
              << "\n";
    return kExitUsage;
  }
  if (!status.ok()) return RpcError(status);
  std::cout << job.id() << "\n" << std::flush;
  if (!args_.Has("wait")) return kExitSucceeded;
  return Follow(job.id());
}

int Client::Follow(const std::string& id) {
  const bool tty = IsTerminal();
  EtaEstimator eta;
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  std::string last_state_line;
  int64_t last_printed_step = -1;
  bool progress_shown = false;  // a redrawn line is on screen
  int failures = 0;
  v1::Job job;
  auto end_progress_line = [&]() {
    if (tty && progress_shown) std::cout << "\r\x1b[K";
    progress_shown = false;
  };
  while (true) {
    v1::WatchJobRequest request;
    request.set_id(id);
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>> reader =
        stub_->WatchJob(&context, request);
    v1::WatchJobResponse response;
    while (reader->Read(&response)) {
      failures = 0;
      job = response.job();
      const std::string state_line = StateLine(job);
      if (job.state() != last_state || (state_line != last_state_line && !IsFinal(job.state()))) {
        end_progress_line();
        if (!IsFinal(job.state())) std::cout << state_line << "\n";
        if (job.state() != last_state) last_printed_step = -1;
        last_state = job.state();
        last_state_line = state_line;
      }
      const v1::JobProgress& p = job.progress();
      if (job.state() == v1::RUNNING && p.step() > 0) {
        eta.Observe(absl::Now(), p.step());
        const std::string line = ProgressLine(p, eta.Eta(p.total_steps()));
        if (tty) {
          std::cout << "\r" << line << "\x1b[K";
          progress_shown = true;
        } else {
          const int64_t step_gap =
              p.total_steps() > 0 ? std::max<int64_t>(1, p.total_steps() / 20) : 1;
          if (last_printed_step < 0 || p.step() - last_printed_step >= step_gap ||
              (p.total_steps() > 0 && p.step() == p.total_steps() &&
               last_printed_step != p.step())) {
            std::cout << line << "\n";
            last_printed_step = p.step();
          }
        }
      }
      std::cout << std::flush;
      if (IsFinal(job.state())) break;
    }
    grpc::Status status = reader->Finish();
    if (IsFinal(job.state())) break;
    if (status.ok()) continue;  // the stream ended early (coordinator restart): watch again
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || ++failures > 30) {
      end_progress_line();
      return RpcError(status);
    }
    absl::SleepFor(absl::Seconds(1));
  }
  end_progress_line();
  const v1::JobProgress& p = job.progress();
  std::cout << "job " << job.id() << " " << JobStateName(job.state());
  if (!job.reason().empty()) std::cout << ": " << job.reason();
  std::cout << "\n";
  if (p.step() > 0) std::cout << "  final: " << ProgressLine(p, std::nullopt) << "\n";
  if (!job.model_uri().empty()) std::cout << "  model:       " << job.model_uri() << "\n";
  if (!job.checkpoint_uri().empty()) {
    std::cout << "  checkpoints: " << job.checkpoint_uri() << "\n";
  }
  std::cout << std::flush;
  switch (job.state()) {
    case v1::SUCCEEDED:
      return kExitSucceeded;
    case v1::CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitJobFailed;
  }
}

int Client::Jobs() {
  v1::ListJobsRequest request;
  if (args_.Has("state")) {
    const v1::JobState state = ParseJobState(args_.Get("state"));
    if (state == v1::JOB_STATE_UNSPECIFIED) {
      std::cerr << "error: unknown state '" << args_.Get("state")
                << "' (PENDING, SCHEDULED, RUNNING, SUCCEEDED, FAILED, CANCELLED, RESTARTING)\n";
      return kExitUsage;
    }
    request.add_states(state);
  }
  request.set_page_size(1000);
  v1::ListJobsResponse all;
  while (true) {
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub_->ListJobs(&context, request, &response);
    if (!status.ok()) return RpcError(status);
    for (v1::Job& job : *response.mutable_jobs()) *all.add_jobs() = std::move(job);
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  if (Json()) {
    std::cout << ToJson(all);
  } else {
    std::cout << JobsTable(std::vector<v1::Job>(all.jobs().begin(), all.jobs().end()), absl::Now(),
                           IsTerminal());
  }
  return kExitSucceeded;
}

int Client::Describe() {
  v1::GetJobRequest request;
  request.set_id(args_.args[0]);
  v1::Job job;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->GetJob(&context, request, &job);
  if (!status.ok()) return RpcError(status);
  std::cout << (Json() ? ToJson(job) : DescribeJob(job));
  return kExitSucceeded;
}

int Client::Logs() {
  int rank = -1;
  if (args_.Has("rank") && (!absl::SimpleAtoi(args_.Get("rank"), &rank) || rank < 0)) {
    std::cerr << "error: --rank takes a rank number, got '" << args_.Get("rank") << "'\n";
    return kExitUsage;
  }
  int shard = -1;
  if (args_.Has("shard") && (!absl::SimpleAtoi(args_.Get("shard"), &shard) || shard < 0)) {
    std::cerr << "error: --shard takes a shard number, got '" << args_.Get("shard") << "'\n";
    return kExitUsage;
  }
  if (rank >= 0 && shard >= 0) {
    std::cerr << "error: --rank and --shard select different tasks; give one\n";
    return kExitUsage;
  }
  // With several tasks in one stream, each line says which task wrote it.
  bool prefix = false;
  if (rank < 0 && shard < 0) {
    v1::GetJobRequest request;
    request.set_id(args_.args[0]);
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub_->GetJob(&context, request, &job);
    if (!status.ok()) return RpcError(status);
    std::set<std::pair<int, int>> tasks;  // (role, rank or shard)
    for (const v1::TaskInfo& task : job.tasks()) {
      tasks.emplace(task.role(), task.role() == v1::TASK_ROLE_SHARD ? task.shard() : task.rank());
    }
    prefix = tasks.size() > 1;
  }
  v1::GetJobLogsRequest request;
  request.set_id(args_.args[0]);
  request.set_rank(rank);
  if (shard >= 0) request.set_shard(shard);
  request.set_follow(args_.Has("follow"));
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader = stub_->GetJobLogs(&context, request);
  v1::LogChunk chunk;
  std::map<std::string, std::string> partial;  // "[rank 0] " or "[shard 1] " -> unfinished line
  while (reader->Read(&chunk)) {
    if (!prefix) {
      std::cout << chunk.data() << std::flush;
      continue;
    }
    const std::string label = chunk.role() == v1::TASK_ROLE_SHARD
                                  ? absl::StrCat("[shard ", chunk.shard(), "] ")
                                  : absl::StrCat("[rank ", chunk.rank(), "] ");
    std::string& buffer = partial[label];
    buffer += chunk.data();
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::cout << label << buffer.substr(start, nl + 1 - start);
    }
    buffer.erase(0, start);
    std::cout << std::flush;
  }
  for (const auto& [label, rest] : partial) {
    if (!rest.empty()) std::cout << label << rest << "\n";
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError(status);
  return kExitSucceeded;
}

int Client::Cancel() {
  v1::CancelJobRequest request;
  request.set_id(args_.args[0]);
  request.set_reason("cancelled by the user");
  v1::Job job;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->CancelJob(&context, request, &job);
  if (!status.ok()) return RpcError(status);
  std::cout << "job " << job.id() << " " << JobStateName(job.state()) << "\n";
  return kExitSucceeded;
}

int Client::Delete() {
  const std::string& id = args_.args[0];
  v1::DeleteJobRequest request;
  request.set_id(id);
  v1::DeleteJobResponse response;
  if (args_.Has("checkpoints")) {
    // Checked first, so that the objects go only when the job can go too.
    request.set_validate_only(true);
    grpc::ClientContext check;
    SetDeadline(check);
    if (grpc::Status s = stub_->DeleteJob(&check, request, &response); !s.ok()) return RpcError(s);
    v1::GetJobRequest get;
    get.set_id(id);
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    if (grpc::Status s = stub_->GetJob(&context, get, &job); !s.ok()) return RpcError(s);
    if (absl::Status s = DeleteCheckpointObjects(job.checkpoint_uri()); !s.ok()) {
      std::cerr << "error: deleting the checkpoints under " << job.checkpoint_uri() << ": "
                << s.message() << "\n(job " << id << " was not deleted; run the command again)\n";
      return kExitStorageError;
    }
    request.set_validate_only(false);
  }
  grpc::ClientContext context;
  SetDeadline(context);
  if (grpc::Status s = stub_->DeleteJob(&context, request, &response); !s.ok()) return RpcError(s);
  std::cout << "job " << id << " deleted\n";
  return kExitSucceeded;
}

int Client::Token() {
  const std::string& action = args_.args[0];
  const std::string arg = args_.args.size() > 1 ? args_.args[1] : "";
  if (action == "create") {
    if (arg.empty()) {
      std::cerr << "error: token create needs NAME\n";
      return kExitUsage;
    }
    v1::CreateTokenRequest request;
    request.set_name(arg);
    const std::string role = args_.Get("role", "user");
    if (role == "admin") {
      request.set_role(v1::TOKEN_ADMIN);
    } else if (role == "user") {
      request.set_role(v1::TOKEN_USER);
    } else if (role == "agent") {
      request.set_role(v1::TOKEN_AGENT);
    } else {
      std::cerr << "error: --role takes admin, user or agent, got '" << role << "'\n";
      return kExitUsage;
    }
    if (args_.Has("ttl")) {
      absl::Duration ttl;
      std::string text = args_.Get("ttl");
      // absl durations know h, m, s; days are what people give for tokens.
      if (int64_t days = 0;
          absl::EndsWith(text, "d") &&
          absl::SimpleAtoi(absl::string_view(text).substr(0, text.size() - 1), &days)) {
        text = absl::StrCat(days * 24, "h");
      }
      if (!absl::ParseDuration(text, &ttl) || ttl <= absl::ZeroDuration()) {
        std::cerr << "error: --ttl takes a positive duration (30d, 12h), got '" << args_.Get("ttl")
                  << "'\n";
        return kExitUsage;
      }
      request.set_ttl_seconds(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
    }
    v1::CreateTokenResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    if (grpc::Status s = admin_->CreateToken(&context, request, &response); !s.ok()) {
      return RpcError(s);
    }
    if (Json()) {
      std::cout << ToJson(response);
    } else {
      std::cout << response.secret() << "\n";
      std::cerr << "token " << response.token().id() << " for " << role << " '" << arg
                << "': shown once; keep it in a file only its user can read\n";
    }
    return kExitSucceeded;
  }
  if (action == "list") {
    v1::ListTokensResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    if (grpc::Status s = admin_->ListTokens(&context, v1::ListTokensRequest(), &response);
        !s.ok()) {
      return RpcError(s);
    }
    if (Json()) {
      std::cout << ToJson(response);
      return kExitSucceeded;
    }
    std::vector<std::vector<std::string>> rows;
    for (const v1::Token& t : response.tokens()) {
      std::string state = "valid";
      if (t.revoked_unix_ms() != 0) {
        state = "revoked by " + t.revoked_by();
      } else if (t.expires_unix_ms() != 0 &&
                 t.expires_unix_ms() <= absl::ToUnixMillis(absl::Now())) {
        state = "expired";
      }
      const std::string& role_name = v1::TokenRole_Name(t.role());
      absl::string_view role = role_name;
      absl::ConsumePrefix(&role, "TOKEN_");
      rows.push_back({t.id(), t.name(), absl::AsciiStrToLower(role), LocalTime(t.created_unix_ms()),
                      t.expires_unix_ms() == 0 ? "never" : LocalTime(t.expires_unix_ms()),
                      t.created_by(), state});
    }
    std::cout << Table({"ID", "NAME", "ROLE", "CREATED", "EXPIRES", "BY", "STATE"}, rows);
    return kExitSucceeded;
  }
  if (action == "revoke") {
    if (arg.empty()) {
      std::cerr << "error: token revoke needs ID (from `trainyard token list`)\n";
      return kExitUsage;
    }
    v1::RevokeTokenRequest request;
    request.set_id(arg);
    v1::Token response;
    grpc::ClientContext context;
    SetDeadline(context);
    if (grpc::Status s = admin_->RevokeToken(&context, request, &response); !s.ok()) {
      return RpcError(s);
    }
    std::cout << "token " << arg << " of '" << response.name() << "' revoked\n";
    return kExitSucceeded;
  }
  std::cerr << "error: token takes create, list or revoke, got '" << action << "'\n";
  return kExitUsage;
}

// Polls the search (it has no watch stream) until it ends, redrawing one line on a terminal and
// printing each new line otherwise; rides out a coordinator restart as Follow does.
int Client::FollowSearch(const std::string& id) {
  constexpr absl::Duration kPollInterval = absl::Seconds(1);
  const bool tty = IsTerminal();
  std::string last_line;
  int failures = 0;
  v1::Search search;
  while (true) {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::GetSearchRequest request;
    request.set_id(id);
    grpc::Status status = search_->GetSearch(&context, request, &search);
    if (!status.ok()) {
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE || ++failures > 30) {
        if (tty && !last_line.empty()) std::cout << "\n";
        return RpcError(status);
      }
    } else {
      failures = 0;
      if (search.state() != v1::SEARCH_RUNNING) break;
      const std::string line = SearchProgressLine(search);
      if (line != last_line) {
        std::cout << (tty ? "\r" : "") << line << (tty ? "\x1b[K" : "\n") << std::flush;
        last_line = line;
      }
    }
    absl::SleepFor(kPollInterval);
  }
  if (tty && !last_line.empty()) std::cout << "\r\x1b[K";
  if (Json()) {
    std::cout << ToJson(search);
  } else {
    std::cout << SearchProgressLine(search) << "\n";
    if (!search.reason().empty()) std::cout << "  " << search.reason() << "\n";
    if (!search.best_model_uri().empty()) {
      std::cout << "  best model: " << search.best_model_uri() << "\n";
    }
  }
  std::cout << std::flush;
  switch (search.state()) {
    case v1::SEARCH_SUCCEEDED:
      return kExitSucceeded;
    case v1::SEARCH_CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitJobFailed;
  }
}

int Client::Search() {
  const std::string& action = args_.args[0];
  const bool has_arg = args_.args.size() > 1;
  auto needs_arg = [&](const char* what) {
    std::cerr << "error: search " << action << " takes " << what << "\n";
    return kExitUsage;
  };
  auto print = [&](const v1::Search& search) {
    if (Json()) {
      std::cout << ToJson(search);
    } else {
      std::cout << "search " << search.id() << " " << SearchStateName(search.state()) << " ("
                << search.reason() << ")\n";
    }
    return kExitSucceeded;
  };
  grpc::ClientContext context;
  SetDeadline(context);
  v1::Search search;
  if (action == "submit") {
    if (!has_arg) return needs_arg("a spec file (or - for stdin)");
    absl::StatusOr<std::string> yaml = ReadSpecFile(args_.args[1]);
    if (!yaml.ok()) {
      std::cerr << "error: " << yaml.status().message() << "\n";
      return kExitUsage;
    }
    v1::SubmitSearchRequest request;
    request.set_spec_yaml(*yaml);
    grpc::Status status = search_->SubmitSearch(&context, request, &search);
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      std::cerr << "error: invalid search spec: " << status.error_message() << "\n";
      return kExitUsage;
    }
    if (!status.ok()) return RpcError(status);
    if (Json() && !args_.Has("wait")) return print(search);
    std::cout << search.id() << "\n" << std::flush;
    return args_.Has("wait") ? FollowSearch(search.id()) : kExitSucceeded;
  }
  if (action == "list") {
    if (has_arg) return needs_arg("no argument");
    v1::ListSearchesResponse response;
    grpc::Status status = search_->ListSearches(&context, v1::ListSearchesRequest(), &response);
    if (!status.ok()) return RpcError(status);
    if (Json()) {
      std::cout << ToJson(response);
    } else {
      std::cout << SearchesTable({response.searches().begin(), response.searches().end()},
                                 absl::Now(), IsTerminal());
    }
    return kExitSucceeded;
  }
  if (!has_arg) return needs_arg("a search id");
  const std::string& id = args_.args[1];
  if (action == "describe") {
    v1::GetSearchRequest request;
    request.set_id(id);
    grpc::Status status = search_->GetSearch(&context, request, &search);
    if (!status.ok()) return RpcError(status);
    std::cout << (Json() ? ToJson(search) : DescribeSearch(search));
    return kExitSucceeded;
  }
  if (action == "cancel") {
    v1::CancelSearchRequest request;
    request.set_id(id);
    request.set_reason("cancelled by the user");
    grpc::Status status = search_->CancelSearch(&context, request, &search);
    if (!status.ok()) return RpcError(status);
    return print(search);
  }
  if (action == "extend") {
    int max_trials = 0;
    if (!absl::SimpleAtoi(args_.Get("max-trials"), &max_trials) || max_trials <= 0) {
      std::cerr << "error: search extend takes --max-trials N (the new total)\n";
      return kExitUsage;
    }
    v1::ExtendSearchRequest request;
    request.set_id(id);
    request.set_max_trials(max_trials);
    grpc::Status status = search_->ExtendSearch(&context, request, &search);
    if (!status.ok()) return RpcError(status);
    return print(search);
  }
  std::cerr << "error: unknown search action '" << action
            << "' (submit, list, describe, cancel, extend)\n";
  return kExitUsage;
}

int Client::Workers() {
  v1::ListWorkersResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response);
  if (!status.ok()) return RpcError(status);
  if (Json()) {
    std::cout << ToJson(response);
  } else {
    std::cout << WorkersTable(
        std::vector<v1::Worker>(response.workers().begin(), response.workers().end()), absl::Now());
  }
  return kExitSucceeded;
}

int Client::Checkpoints() {
  v1::ListCheckpointsRequest request;
  request.set_job_id(args_.args[0]);
  v1::ListCheckpointsResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->ListCheckpoints(&context, request, &response);
  if (!status.ok()) return RpcError(status);
  if (Json()) {
    std::cout << ToJson(response);
  } else {
    std::cout << CheckpointsTable(
        std::vector<v1::Checkpoint>(response.checkpoints().begin(), response.checkpoints().end()));
  }
  return kExitSucceeded;
}

int Up(const ParsedArgs& args) {
  LocalClusterOptions options;
  auto int_flag = [&args](const std::string& name, int* out, int min) {
    if (!args.Has(name)) return true;
    if (!absl::SimpleAtoi(args.Get(name), out) || *out < min) {
      std::cerr << "error: --" << name << " takes a number >= " << min << ", got '"
                << args.Get(name) << "'\n";
      return false;
    }
    return true;
  };
  if (!int_flag("workers", &options.workers, 1) || !int_flag("slots", &options.slots, 1) ||
      !int_flag("port", &options.port, 0)) {
    return kExitUsage;
  }
  options.state_dir = args.Get("state_dir");
  options.bin_dir = SelfExecutableDir();
  return RunLocalCluster(options);
}

}  // namespace

int RunCli(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> global_flags = GlobalFlags();
  const std::vector<CommandSpec> commands = Commands();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(global_flags, commands, argv);
  if (!parsed.ok()) {
    std::cerr << "error: " << parsed.status().message() << "\n";
    return kExitUsage;
  }
  if (parsed->help || parsed->command.empty()) {
    const CommandSpec* command = nullptr;
    for (const CommandSpec& c : commands) {
      if (c.name == parsed->command) command = &c;
    }
    const std::string text = command != nullptr ? CommandHelp("trainyard", global_flags, *command)
                                                : MainHelp("trainyard", global_flags, commands);
    if (parsed->help) {
      std::cout << text;
      return kExitSucceeded;
    }
    std::cerr << text;
    return kExitUsage;
  }
  const std::string output = parsed->Get("output", "table");
  if (output != "table" && output != "json") {
    std::cerr << "error: -o takes table or json, got '" << output << "'\n";
    return kExitUsage;
  }
  if (parsed->command == "up") return Up(*parsed);
  if (parsed->command == "data") return Data(*parsed);

  std::string address = parsed->Get("coordinator");
  if (address.empty()) {
    const char* env = std::getenv("TRAINYARD_COORDINATOR");
    address = env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
  }
  absl::StatusOr<ClientCredentials> credentials = ResolveCredentials(address, *parsed);
  if (!credentials.ok()) {
    std::cerr << "error: " << credentials.status().message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      NewClientChannel(address, *credentials, ChannelArguments());
  if (!channel.ok()) {
    std::cerr << "error: " << channel.status().message() << "\n";
    return kExitUsage;
  }
  Client client(address, *parsed, *std::move(channel));
  const std::string& name = parsed->command;
  if (name == "submit") return client.Submit();
  if (name == "jobs") return client.Jobs();
  if (name == "describe") return client.Describe();
  if (name == "logs") return client.Logs();
  if (name == "cancel") return client.Cancel();
  if (name == "delete") return client.Delete();
  if (name == "workers") return client.Workers();
  if (name == "checkpoints") return client.Checkpoints();
  if (name == "token") return client.Token();
  if (name == "search") return client.Search();
  std::cerr << "error: unknown command '" << name << "'\n";
  return kExitUsage;
}

}  // namespace trainyard::cli
