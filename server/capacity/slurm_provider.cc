#include "server/capacity/slurm_provider.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainyard {
namespace {

// The comment that names the Trainyard job an allocation was asked for.
constexpr absl::string_view kCommentPrefix = "trainyard-job=";
// squeue's fields: id, state, nodes, reason, comment, node list.
constexpr absl::string_view kSqueueFormat = "%i|%T|%D|%r|%k|%N";

AllocationState StateOf(absl::string_view slurm_state) {
  if (slurm_state == "PENDING" || slurm_state == "CONFIGURING" || slurm_state == "REQUEUED" ||
      slurm_state == "REQUEUE_HOLD" || slurm_state == "REQUEUE_FED" || slurm_state == "RESIZING") {
    return AllocationState::kPending;
  }
  if (slurm_state == "RUNNING") return AllocationState::kRunning;
  return AllocationState::kEnded;  // COMPLETING, CANCELLED, FAILED, TIMEOUT, PREEMPTED, ...
}

}  // namespace

std::optional<Allocation> ParseSqueueLine(absl::string_view line) {
  std::vector<std::string> fields = absl::StrSplit(absl::StripAsciiWhitespace(line), '|');
  if (fields.size() != 6 || fields[0].empty()) return std::nullopt;
  Allocation a;
  a.id = fields[0];
  for (char c : a.id) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && c != '_') return std::nullopt;
  }
  a.state = StateOf(fields[1]);
  if (!absl::SimpleAtoi(fields[2], &a.nodes) || a.nodes < 0) a.nodes = 0;
  a.detail = fields[1];
  if (a.state == AllocationState::kPending && !fields[3].empty() && fields[3] != "None") {
    absl::StrAppend(&a.detail, " (", fields[3], ")");
  }
  if (absl::StartsWith(fields[4], kCommentPrefix)) {
    a.job_id = fields[4].substr(kCommentPrefix.size());
  }
  if (a.state == AllocationState::kRunning && !fields[5].empty()) {
    a.node_names.push_back(fields[5]);  // compressed ("n[2-3]"): the caller expands it
  }
  return a;
}

SlurmProvider::SlurmProvider(SlurmOptions options, CommandRunner run)
    : options_(std::move(options)), run_(std::move(run)) {}

absl::StatusOr<CommandResult> SlurmProvider::Call(const std::vector<std::string>& argv) const {
  absl::StatusOr<CommandResult> r = run_(argv);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat(argv[0], ": ", r.status().message(),
                                     " (is Slurm's client installed on the coordinator's host?)"));
  }
  return r;
}

std::vector<std::string> SlurmProvider::SbatchArgs(const std::string& job_id, int nodes) const {
  std::vector<std::string> argv = {
      "sbatch", "--parsable", absl::StrCat("--job-name=", options_.job_name),
      absl::StrCat("--nodes=", nodes), absl::StrCat("--comment=", kCommentPrefix, job_id)};
  if (!options_.partition.empty()) argv.push_back("--partition=" + options_.partition);
  if (!options_.account.empty()) argv.push_back("--account=" + options_.account);
  if (!options_.qos.empty()) argv.push_back("--qos=" + options_.qos);
  if (!options_.time_limit.empty()) argv.push_back("--time=" + options_.time_limit);
  if (options_.gpus_per_node > 0) {
    argv.push_back(absl::StrCat("--gres=gpu:", options_.gpus_per_node));
  }
  if (!options_.output_dir.empty()) {
    argv.push_back(absl::StrCat("--output=", options_.output_dir, "/trainyard-agents-%j.out"));
  }
  // The agents' settings come from their file on the nodes, not from the coordinator's
  // environment (which holds its own secrets); the coordinator asks again itself when Slurm takes
  // nodes back, so the script does not requeue.
  std::string exported = "--export=TRAINYARD_REQUEUE=0";
  if (!options_.env_file.empty())
    absl::StrAppend(&exported, ",TRAINYARD_SLURM_ENV=", options_.env_file);
  argv.push_back(std::move(exported));
  for (const std::string& a : options_.extra_args) argv.push_back(a);
  argv.push_back(options_.script);
  return argv;
}

absl::StatusOr<std::string> SlurmProvider::Request(const std::string& job_id, int nodes) {
  absl::StatusOr<CommandResult> r = Call(SbatchArgs(job_id, nodes));
  if (!r.ok()) return r.status();
  if (!r->ok()) return absl::FailedPreconditionError(DescribeCommandEnd(*r));
  // --parsable: "ID" or "ID;CLUSTER".
  std::string id(absl::StripAsciiWhitespace(r->out));
  id = id.substr(0, id.find(';'));
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InternalError(
        absl::StrCat("sbatch answered '", id.substr(0, 100), "', not a job id"));
  }
  return id;
}

absl::StatusOr<std::vector<Allocation>> SlurmProvider::List() {
  absl::StatusOr<CommandResult> r = Call({"squeue", "--noheader", "--name=" + options_.job_name,
                                          absl::StrCat("--format=", kSqueueFormat)});
  if (!r.ok()) return r.status();
  if (!r->ok()) return absl::UnavailableError(absl::StrCat("squeue: ", DescribeCommandEnd(*r)));
  std::vector<Allocation> found;
  for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipWhitespace())) {
    std::optional<Allocation> a = ParseSqueueLine(line);
    // Only what a coordinator asked for (its comment names the job): agents an operator
    // started by hand under the same name are theirs, not ours to count or cancel.
    if (!a.has_value() || a->state == AllocationState::kEnded || a->job_id.empty()) continue;
    if (!a->node_names.empty()) {
      // Slurm's own expansion of its compressed node list.
      absl::StatusOr<CommandResult> names =
          Call({"scontrol", "show", "hostnames", a->node_names.front()});
      if (!names.ok()) return names.status();
      if (!names->ok()) {
        return absl::UnavailableError(absl::StrCat("scontrol: ", DescribeCommandEnd(*names)));
      }
      a->node_names = absl::StrSplit(names->out, absl::ByAnyChar(" \n"), absl::SkipWhitespace());
      absl::StrAppend(&a->detail, " on ", absl::StrJoin(a->node_names, ","));
    }
    found.push_back(std::move(*a));
  }
  return found;
}

absl::Status SlurmProvider::Release(const std::string& id) {
  absl::StatusOr<CommandResult> r = Call({"scancel", id});
  if (!r.ok()) return r.status();
  if (!r->ok())
    return absl::UnavailableError(absl::StrCat("scancel ", id, ": ", DescribeCommandEnd(*r)));
  return absl::OkStatus();
}

std::string SlurmProvider::HowItEnded(const std::string& id) {
  // slurmctld keeps an ended job for MinJobAge (5 minutes by default).
  absl::StatusOr<CommandResult> r = Call({"scontrol", "--oneliner", "show", "job", id});
  if (!r.ok() || !r->ok()) return "";
  std::string state;
  std::string reason;
  std::string exit_code;
  for (absl::string_view field : absl::StrSplit(r->out, ' ', absl::SkipWhitespace())) {
    if (absl::ConsumePrefix(&field, "JobState=")) state = std::string(field);
    if (absl::ConsumePrefix(&field, "Reason=")) reason = std::string(field);
    if (absl::ConsumePrefix(&field, "ExitCode=")) exit_code = std::string(field);
  }
  if (state.empty()) return "";
  std::string how = state;
  if (!reason.empty() && reason != "None") absl::StrAppend(&how, " (", reason, ")");
  if (!exit_code.empty()) absl::StrAppend(&how, ", exit code ", exit_code);
  if (!options_.output_dir.empty()) {
    absl::StrAppend(&how, "; its log: ", options_.output_dir, "/trainyard-agents-", id, ".out");
  }
  return how;
}

CommandRunner RealCommandRunner(absl::Duration timeout) {
  return [timeout](const std::vector<std::string>& argv) { return RunCommand(argv, {}, timeout); };
}

}  // namespace trainyard
