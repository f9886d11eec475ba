#include "client/cli.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/credentials.h"
#include "client/local_cluster.h"
#include "common/clock.h"
#include "common/rpc/channel.h"
#include "common/storage/object_store.h"
#include "grpcpp/grpcpp.h"
#include "worker/agent/subprocess.h"

namespace trainyard::cli {
namespace {

const FlagSpec kOutputFlag{"output", 'o', true, "FORMAT", "table (default) or json"};

std::vector<FlagSpec> GlobalFlags() {
  return {{"coordinator", '\0', true, "ADDR",
           "coordinator host:port, or a comma-separated list of a cluster's coordinators "
           "(default: $TRAINYARD_COORDINATOR, else 127.0.0.1:7070)"},
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

// The commands on jobs: submit, follow, inspect, cancel and delete them.
std::vector<CommandSpec> JobCommands() {
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
       1,
       {}},
      {"jobs",
       "",
       "List jobs, newest first.",
       {{"state", '\0', true, "STATE", "only jobs in STATE (PENDING, RUNNING, FAILED, ...)"},
        kOutputFlag},
       0,
       0,
       {}},
      {"describe",
       "JOB",
       "Show a job: state, progress, tasks and every event.",
       {kOutputFlag},
       1,
       1,
       {}},
      {"debug",
       "JOB",
       "Show what each running rank of a job is doing: its phase and for how long, its step, its "
       "last collectives and messages, and which rank holds the others up if one does (once "
       "the others have waited on it for a second; a stopped process at once).",
       {{"stacks", '\0', false, "",
         "also every thread's stack of each trainer (its worker attaches a debugger: gdb)"},
        kOutputFlag},
       1,
       1,
       {}},
      {"logs",
       "JOB",
       "Print the logs of a job's ranks and parameter-server shards.",
       {{"follow", 'f', false, "", "keep printing until the job ends"},
        {"rank", '\0', true, "N", "only rank N (default: every rank and shard)"},
        {"shard", '\0', true, "N", "only parameter-server shard N"}},
       1,
       1,
       {}},
      {"cancel", "JOB", "Cancel a job.", {}, 1, 1, {}},
      {"delete",
       "JOB",
       "Delete a finished job now: its record, events, tasks and logs. The coordinator does it "
       "--job_retention after the job finished in any case. Its checkpoints stay in storage "
       "unless --checkpoints is given.",
       {{"checkpoints", '\0', false, "",
         "first delete its checkpoints and exported model (everything under its checkpoint "
         "URI), with this machine's storage credentials (for s3://, the AWS_* variables the "
         "workers use)"}},
       1,
       1,
       {}},
  };
}

// What the cluster holds: workers, checkpoints, data sets, searches.
std::vector<CommandSpec> ClusterCommands() {
  return {
      {"workers",
       "[return-gpu WORKER INDEX]",
       "List the worker machines, with the GPUs their agents took out of service and why. "
       "`return-gpu` (admins) returns such a GPU: its agent checks it again and takes it back "
       "into service if the check passes.",
       {kOutputFlag},
       0,
       3,
       {{"return-gpu",
         "WORKER INDEX",
         "Return GPU INDEX of WORKER to service: its agent checks it again first.",
         {}}}},
      {"checkpoints",
       "JOB",
       "List a job's committed checkpoints, newest first.",
       {kOutputFlag},
       1,
       1,
       {}},
      {"data",
       "ACTION ARGS",
       "Inspect a sharded safetensors data set, or pack one from NumPy arrays or CSV. Both run "
       "on this machine; s3:// uses its AWS_* variables.",
       {kOutputFlag,
        {"columns", '\0', true, "SPEC",
         "pack, CSV: which columns make which tensor, e.g. 'x=age,income:F32;y=label:I64' "
         "(dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U16 U8 BOOL)"},
        {"shard-size", '\0', true, "BYTES",
         "pack: data per shard (256MB by default; 64MiB, 1GB, plain bytes)"},
        {"text", '\0', false, "",
         "pack: the arguments are text files and, last, PREFIX: the text as token shards for "
         "data.tokens"},
        {"tokenizer", '\0', true, "NAME",
         "pack --text: how text becomes token ids: bytes (each byte one id; the default)"}},
       2,
       1000,
       {{"inspect",
         "URI",
         "Print the index of a sharded safetensors data set, read from the shards' headers "
         "only: shards, samples, tensors, dtypes, shapes and bytes. URI is a path, file:// or "
         "s3:// URI with wildcards in file names (quote it, so that the shell leaves them).",
         {"output"}},
        {"pack",
         "PREFIX NAME=FILE.npy... | PREFIX FILE.csv | --text FILE... PREFIX",
         "Write PREFIX-00000.safetensors, ... (local files) from NumPy arrays (the first "
         "dimension is the sample; every array the same number of samples), from CSV "
         "columns (--columns), or from text files (--text: their tokens, in order, as one 1-D "
         "tensor "
         "'tokens' per shard, what data.tokens reads). Nothing is written unless all of it is.",
         {"columns", "shard-size", "text", "tokenizer"}}}},
      {"search",
       "ACTION [ARG]",
       "Hyperparameter searches: submit, list, describe, cancel, extend. Their trials are "
       "jobs.",
       {{"max-trials", '\0', true, "N", "extend: the search's new total of trials"},
        {"wait", '\0', false, "",
         "submit: follow the search until it ends; exit 0 succeeded, 1 failed, 3 cancelled"},
        kOutputFlag},
       1,
       2,
       {{"submit",
         "FILE",
         "Submit the search spec in FILE and print the search's id: name, searcher {name: "
         "random|grid|asha, metric, max_trials, ...}, hyperparameters by field path, and "
         "template: a job spec.",
         {"wait"}},
        {"list",
         "",
         "List searches, newest first, with their trials run, made and allowed.",
         {"output"}},
        {"describe",
         "ID",
         "Show a search: every trial's values, rung, metric and state; the best trial and its "
         "model.",
         {"output"}},
        {"cancel", "ID", "Cancel a search and its running trials.", {}},
        {"extend", "ID --max-trials N", "Allow a search more trials in total.", {"max-trials"}}}},
  };
}

// The administrators' commands, and a local cluster.
std::vector<CommandSpec> AdminCommands() {
  return {
      {"token",
       "ACTION [ARG]",
       "Manage API tokens (admins): create, list, revoke.",
       {{"role", '\0', true, "ROLE", "create: admin, user (default) or agent"},
        {"ttl", '\0', true, "DURATION",
         "create: how long it is valid (30d, 12h; default: until revoked)"},
        kOutputFlag},
       1,
       2,
       {{"create",
         "NAME",
         "Print a new token once. For an agent, NAME is the worker it may register as; for a "
         "person, who they are.",
         {"role", "ttl"}},
        {"list",
         "",
         "List tokens: id, name, role, when made and by whom, expiry and state (never the "
         "tokens themselves).",
         {"output"}},
        {"revoke", "ID", "Revoke a token: it is refused from now on.", {}}}},
      {"queue",
       "ACTION [NAME]",
       "Queues share the cluster between teams: each has a quota of slots and GPUs, may borrow "
       "what others leave idle, and competes by weight. Admins create, update and delete them; "
       "everyone may list and describe them.",
       {{"slots", '\0', true, "N", "create, update: quota of CPU slots (a number or unlimited)"},
        {"gpus", '\0', true, "N", "create, update: quota of GPUs (a number or unlimited)"},
        {"borrow-slots", '\0', true, "N",
         "create, update: slots it may hold beyond its quota while others leave them idle "
         "(default unlimited)"},
        {"borrow-gpus", '\0', true, "N", "create, update: GPUs likewise (default unlimited)"},
        {"weight", '\0', true, "W", "create, update: fair-share weight (default 1)"},
        {"max-priority", '\0', true, "N",
         "create, update: the highest priority a user's job may ask for in it (admins' jobs are "
         "exempt); 'none' (the default) for no cap"},
        {"users", '\0', true, "A,B",
         "create, update: who may submit to it (default everyone); a job without queue: goes to "
         "the first queue that names its submitter"},
        kOutputFlag},
       1,
       2,
       {{"create",
         "NAME",
         "Create a queue (quotas 0 unless given).",
         {"slots", "gpus", "borrow-slots", "borrow-gpus", "weight", "max-priority", "users"}},
        {"update",
         "NAME",
         "Change the flags given of a queue; the others stay.",
         {"slots", "gpus", "borrow-slots", "borrow-gpus", "weight", "max-priority", "users"}},
        {"delete", "NAME", "Delete a queue that has no job not finished.", {}},
        {"list",
         "",
         "List queues: weight, use against quota and borrowed, jobs, preemptions, max priority.",
         {"output"}},
        {"describe",
         "NAME",
         "Show a queue and its jobs not finished, in line order.",
         {"output"}}}},
      {"console",
       "",
       "Print a one-time login link to the web console for your credentials (or open it).",
       {{"url", '\0', true, "URL",
         "the console's address (default: $TRAINYARD_CONSOLE_URL, else the one `trainyard up` "
         "noted for this coordinator)"},
        {"open", '\0', false, "", "open the link in a browser (xdg-open)"}},
       0,
       0,
       {}},
      {"up",
       "",
       "Run a local cluster (coordinator and workers) in the foreground.",
       {{"workers", '\0', true, "N", "number of workers (default 2)"},
        {"slots", '\0', true, "N", "CPU slots per worker (default: cores / workers)"},
        {"port", '\0', true, "P", "coordinator port (default 7070; 0 picks a free one)"},
        {"state-dir", '\0', true, "DIR", "where state and logs go (default: a new temp folder)"}},
       0,
       0,
       {}},
  };
}

// In the order --help lists them.
std::vector<CommandSpec> Commands() {
  std::vector<CommandSpec> all;
  for (auto group : {JobCommands, ClusterCommands, AdminCommands}) {
    for (CommandSpec& command : group()) all.push_back(std::move(command));
  }
  return all;
}

grpc::ChannelArguments ChannelArguments() {
  grpc::ChannelArguments args;
  // `submit --wait` and `logs -f` ride out a coordinator restart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectTimeoutMs);  // a connect's time
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 * 1024 * 1024);
  return args;
}

// `trainyard console`: the console's URL with a one-time login code for the caller after `#`
// (which browsers never send to a server).
int ConsoleLink(const ParsedArgs& args, const std::string& address,
                const std::shared_ptr<grpc::Channel>& channel) {
  std::string url = args.Get("url");
  if (url.empty()) {
    const char* env = std::getenv("TRAINYARD_CONSOLE_URL");
    if (env != nullptr) url = env;
  }
  if (url.empty()) {
    absl::StatusOr<std::string> noted =
        ReadCredentialFile(LocalCredentialsDir(address) + "/console_url");
    if (noted.ok()) url = *noted;
  }
  if (url.empty()) {
    std::cerr << "error: where is the console? Give --url https://HOST:PORT/ or set "
                 "TRAINYARD_CONSOLE_URL (the coordinator serves it on its --console_listen)\n";
    return kExitUsage;
  }
  if (!absl::EndsWith(url, "/")) url += "/";
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ConsoleLogin login;
  const grpc::Status status = v1::JobService::NewStub(channel)->CreateConsoleLogin(
      &context, v1::CreateConsoleLoginRequest(), &login);
  if (!status.ok()) {
    std::cerr << "error: " << status.error_message() << "\n";
    return kExitRpcError;
  }
  const std::string link = absl::StrCat(url, "#login=", login.code());
  std::cout << link << "\n"
            << "(it logs a browser in once, within 5 minutes)\n";
  if (args.Has("open")) {
    SubprocessOptions opener;
    opener.argv = {"xdg-open", link};
    if (absl::StatusOr<pid_t> pid = StartSubprocess(opener); !pid.ok()) {
      std::cerr << "error: cannot open a browser: " << pid.status().message() << "\n";
      return 1;
    }
  }
  return 0;
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
  options.state_dir = args.Get("state-dir");
  options.bin_dir = SelfExecutableDir();
  return RunLocalCluster(options);
}

}  // namespace

bool IsTerminal() { return isatty(STDOUT_FILENO) == 1; }

bool IsFinal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

namespace {
bool g_wait_for_leader = false;
}  // namespace

void WaitForLeader(bool wait) { g_wait_for_leader = wait; }

void FollowLeader(grpc::ClientContext& context) {
  // Given several coordinators, a call made while none leads (a takeover) waits for the new
  // leader instead of failing.
  if (g_wait_for_leader) context.set_wait_for_ready(true);
}

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(absl::ToChronoTime(RealClock::Get().Now() + kRpcTimeout));
  FollowLeader(context);
}

// A spec from a file, or from stdin for "-".
absl::StatusOr<std::string> ReadSpecFile(const std::string& file) {
  std::ostringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
    return text.str();
  }
  std::ifstream in(file);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read ", file, ": ", std::strerror(errno)));
  text << in.rdbuf();
  return text.str();
}

int Client::RpcError(const grpc::Status& status) const {
  if (absl::StartsWith(status.error_message(), "this coordinator stands by")) {
    // A standby's answer (server/api/coordinator_server.h): it says where the leader is.
    std::cerr << "error: " << address_ << ": " << status.error_message() << "\n";
  } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
             status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "error: cannot reach the coordinator at " << address_ << ": "
              << status.error_message() << "\n";
  } else {
    std::cerr << "error: " << status.error_message() << "\n";
  }
  return kExitRpcError;
}

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
    // `up` and `data` run on this machine alone: no coordinator, no credentials.
    const bool local = command != nullptr && (command->name == "up" || command->name == "data");
    // `CMD ACTION --help` (or `help CMD ACTION`): that action alone.
    const ActionSpec* action = nullptr;
    if (command != nullptr) {
      const size_t at = parsed->args.size() > 0 && parsed->args[0] == command->name ? 1 : 0;
      if (parsed->args.size() > at) action = FindAction(*command, parsed->args[at]);
    }
    const std::string text =
        action != nullptr    ? ActionHelp("trainyard", global_flags, *command, *action, local)
        : command != nullptr ? CommandHelp("trainyard", global_flags, *command, local)
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
  // The object stores, their S3 settings and credentials read once, here.
  const std::unique_ptr<ObjectStoreResolver> stores =
      NewObjectStoreResolver([](const char* name) { return std::getenv(name); });
  if (parsed->command == "data") return Data(*parsed, *stores);

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
      // Its calls wait for the channel to be ready (WaitForLeader): they poll it themselves.
      NewClientChannel(address, *credentials, ChannelArguments(), /*own_poller=*/false);
  if (!channel.ok()) {
    std::cerr << "error: " << channel.status().message() << "\n";
    return kExitUsage;
  }
  WaitForLeader(CoordinatorAddresses(address).size() > 1);
  if (parsed->command == "console") return ConsoleLink(*parsed, address, *channel);
  Client client(address, *parsed, *std::move(channel), *stores);
  const std::string& name = parsed->command;
  if (name == "submit") return client.Submit();
  if (name == "jobs") return client.Jobs();
  if (name == "describe") return client.Describe();
  if (name == "debug") return client.Debug();
  if (name == "logs") return client.Logs();
  if (name == "cancel") return client.Cancel();
  if (name == "delete") return client.Delete();
  if (name == "workers") return client.Workers();
  if (name == "checkpoints") return client.Checkpoints();
  if (name == "token") return client.Token();
  if (name == "queue") return client.Queue();
  if (name == "search") return client.Search();
  std::cerr << "error: unknown command '" << name << "'\n";
  return kExitUsage;
}

}  // namespace trainyard::cli
