// The coordinator's protection with real TLS (certificates made by `openssl` here), client
// certificates, tokens and task credentials, through the real binaries; and the same checks
// from a client that is not ours (foreign_client.py: Debian's grpcio, stubs from our protos).

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

ClusterOptions TlsCluster(const TestCertificates& certs) {
  ClusterOptions options;
  options.coordinator_args = {"--tls_cert=" + certs.Path("server.pem"),
                              "--tls_key=" + certs.Path("server.key"),
                              "--client_ca=" + certs.Path("ca.pem")};
  options.ca_file = certs.Path("ca.pem");
  options.coordinator_args.push_back("--allowed_local_paths=" + certs.dir + "/data");
  return options;
}

TEST(SecurityTest, OverTlsAJobTrainsAndOnlyTheRightCallersGetIn) {
  TempDir dir;
  TestCertificates certs(dir.path());
  Cluster cluster(TlsCluster(certs));
  // Agents and trainers speak TLS too: the job trains to its end.
  const v1::Job done = RunToSuccess(cluster, SyntheticJobYaml("over-tls", 20));
  EXPECT_EQ(done.owner(), "admin");

  // Alice with her client certificate and no token: her jobs are hers.
  const std::string spec_path = dir.path() + "/job.yaml";
  { std::ofstream(spec_path) << SyntheticJobYaml("alices", 20); }
  const std::map<std::string, std::string> alice = {
      {"TRAINYARD_CA_FILE", certs.Path("ca.pem")},
      {"TRAINYARD_CERT_FILE", certs.Path("alice.pem")},
      {"TRAINYARD_KEY_FILE", certs.Path("alice.key")},
      {"XDG_CONFIG_HOME", dir.path() + "/config"}};
  auto submitted = RunCli(cluster.address(), dir.path(), {"submit", spec_path, "--wait"},
                          absl::Seconds(120), alice);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string id = submitted.FirstLine();
  auto listed = RunCli(cluster.address(), dir.path(), {"jobs"}, absl::Seconds(60), alice);
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_TRUE(absl::StrContains(listed.output, id)) << listed.output;
  EXPECT_FALSE(absl::StrContains(listed.output, done.id())) << listed.output;
  auto described = cluster.Cli({"describe", id});
  EXPECT_TRUE(absl::StrContains(described.output, "alice")) << described.output;
  EXPECT_TRUE(absl::StrContains(described.output, "submitted by alice")) << described.output;
  auto theirs =
      RunCli(cluster.address(), dir.path(), {"describe", done.id()}, absl::Seconds(60), alice);
  EXPECT_EQ(theirs.exit_code, 4) << theirs.output;
  EXPECT_TRUE(absl::StrContains(theirs.output, "belongs to another user")) << theirs.output;

  // A client that trusts another CA does not get through; nor does plaintext.
  std::map<std::string, std::string> wrong_ca = alice;
  wrong_ca["TRAINYARD_CA_FILE"] = certs.Path("other-ca.pem");
  auto refused = RunCli(cluster.address(), dir.path(), {"jobs"}, absl::Seconds(60), wrong_ca);
  EXPECT_EQ(refused.exit_code, 4) << refused.output;
  EXPECT_TRUE(absl::StrContains(refused.output, "cannot reach the coordinator")) << refused.output;
  auto plain = RunCli(
      cluster.address(), dir.path(), {"jobs"}, absl::Seconds(60),
      {{"TRAINYARD_TOKEN", cluster.admin_token()}, {"XDG_CONFIG_HOME", dir.path() + "/config"}});
  EXPECT_EQ(plain.exit_code, 4) << plain.output;

  // Local paths outside the allowed folder are refused at submission, naming the field.
  const std::string snoop_path = dir.path() + "/snoop.yaml";
  {
    std::ofstream(snoop_path) << SyntheticJobYaml("snoop", 5,
                                                  "checkpoint: {uri: \"file:///etc/../root\"}\n");
  }
  auto snoop = cluster.Cli({"submit", snoop_path});
  EXPECT_EQ(snoop.exit_code, 2) << snoop.output;
  EXPECT_TRUE(absl::StrContains(
      snoop.output, "checkpoint.uri: 'file:///etc/../root': the segment '..' is not allowed"))
      << snoop.output;

  // The same checks from a client that is not ours.
  const std::string alice_token = cluster.CreateToken("alice", v1::TOKEN_USER);
  const std::string bob_token = cluster.CreateToken("bob", v1::TOKEN_USER);
  auto [code, output] = RunShell(absl::StrCat(
      "/usr/bin/python3 ", SourceDir(), "/tests/integration/foreign_client.py ", cluster.address(),
      " ", SourceDir(), "/proto ", certs.Path("ca.pem"), " ", certs.Path("other-ca.pem"), " ",
      cluster.admin_token(), " ", alice_token, " ", bob_token));
  EXPECT_EQ(code, 0) << output;
  EXPECT_TRUE(absl::StrContains(output, "0 failed")) << output;
}

// A user's token cannot make a job read or write outside --allowed_local_paths: not with the
// spelling that was taken for a URI and never checked ("A/x://../../B"), nor its relatives, nor
// through a symbolic link made once the coordinator had accepted the job (the trainer's own
// check on the worker's disk refuses it).
TEST(SecurityTest, ALocalPathStaysInTheAllowedFolders) {
  TempDir dir;
  const std::string allowed = dir.path() + "/a/b/c";
  const std::string outside = dir.path() + "/outside";
  std::filesystem::create_directories(allowed);
  std::filesystem::create_directories(outside);
  ClusterOptions options;
  options.coordinator_args.push_back("--allowed_local_paths=" + allowed);
  Cluster cluster(options);
  const std::map<std::string, std::string> alice = {
      {"TRAINYARD_TOKEN", cluster.CreateToken("alice", v1::TOKEN_USER)},
      {"XDG_CONFIG_HOME", dir.path() + "/config"}};
  const std::string escape = allowed + "/x://../../../../outside";
  const std::vector<std::pair<std::string, std::string>> tries = {
      {"checkpoint.uri", "checkpoint: {uri: \"" + escape + "\"}\n"},
      {"checkpoint.uri", "checkpoint: {uri: \"file://" + allowed + "/%2e%2e/%2e%2e/outside\"}\n"},
      {"checkpoint.uri", "checkpoint: {uri: \"/" + outside + "\"}\n"},
      {"distill.teacher", "loss: cross_entropy\ndistill: {teacher: \"" + escape +
                              "/m.pt\", temperature: 2, "
                              "alpha: 0.5}\n"}};
  for (const auto& [field, extra] : tries) {
    const std::string path = dir.path() + "/escape.yaml";
    { std::ofstream(path) << SyntheticJobYaml("escape", 5, extra); }
    auto refused =
        RunCli(cluster.address(), dir.path(), {"submit", path}, absl::Seconds(60), alice);
    EXPECT_EQ(refused.exit_code, 2) << extra << refused.output;
    EXPECT_TRUE(absl::StrContains(refused.output, field + ": ")) << extra << refused.output;
  }

  // A link out, made after the job was accepted, while it is held before its first checkpoint.
  const std::string yaml =
      SyntheticJobYaml("linked", 4,
                       "checkpoint: {uri: \"" + allowed +
                           "/ckpt\", every_steps: 100}\nrestart: {max_infrastructure_errors: 0}\n");
  absl::StatusOr<v1::Job> held = SubmitAndHold(cluster, "linked", yaml, 1, -1);
  ASSERT_TRUE(held.ok()) << held.status();
  std::filesystem::remove_all(allowed + "/ckpt");
  std::filesystem::create_directory_symlink(outside, allowed + "/ckpt");
  cluster.Release("linked");
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(held->id());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::FAILED) << done->reason();
  // The job's own doing, not the machine's: no restart was spent on it.
  EXPECT_TRUE(absl::StrContains(done->reason(), "outside the folders this job may use"))
      << done->reason();
  EXPECT_FALSE(absl::StrContains(done->reason(), "infrastructure")) << done->reason();
  absl::StatusOr<std::string> logs = cluster.Logs(held->id());
  ASSERT_TRUE(logs.ok()) << logs.status();
  EXPECT_TRUE(absl::StrContains(*logs, "outside the folders this job may use")) << *logs;
  EXPECT_TRUE(std::filesystem::is_empty(outside)) << "the trainer wrote through the link";
}

// The user id a process runs as (its real uid, from /proc), -1 if it cannot be read.
int ProcessUid(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int uid = -1;
    if (absl::StartsWith(line, "Uid:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(4, line.find('\t', 5) - 4)),
                         &uid)) {
      return uid;
    }
  }
  return -1;
}

// Whether user `uid` can read `path` (setpriv, as that user with no other groups).
bool CanRead(int uid, const std::string& path) {
  auto [code, output] = RunShell(absl::StrCat("setpriv --reuid=", uid, " --regid=", uid,
                                              " --clear-groups cat '", path, "' >/dev/null 2>&1"));
  return code == 0;
}

// Where the agent runs as root with --task_uid_range, each job's trainer runs as its own user:
// it cannot read the agent's token file nor another task's credential (task.pb), and it starts
// without the agent's environment beyond what it needs; the jobs still train and checkpoint.
TEST(SecurityTest, TrainersRunAsTheirOwnUsersWithoutTheAgentsSecrets) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (the agent switches users)";
  ClusterOptions options;
  options.slots_per_worker = 2;
  options.worker_args = {"--task_uid_range=61000-61999"};
  options.env = {{"TRAINYARD_AGENT_SECRET", "not-for-trainers"}, {"AWS_REGION", "eu-test-1"}};
  Cluster cluster(options);
  // As an operator lays it out: folders the task users may pass through, the token file not.
  const std::string root = std::filesystem::path(cluster.state_dir()).parent_path().string();
  std::filesystem::permissions(root, std::filesystem::perms(0755));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_directory() && !entry.is_symlink()) {
      std::filesystem::permissions(entry.path(), std::filesystem::perms(0755));
    }
  }
  const std::string token_file = cluster.worker_dir(0) + ".token";
  std::filesystem::permissions(token_file, std::filesystem::perms(0600));

  const std::string extra = "checkpoint: {every_steps: 2}\n";
  absl::StatusOr<v1::Job> a =
      SubmitAndHold(cluster, "iso-a", SyntheticJobYaml("iso-a", 4, extra), 1, -1);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<v1::Job> b =
      SubmitAndHold(cluster, "iso-b", SyntheticJobYaml("iso-b", 4, extra), 1, -1);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string tasks = cluster.worker_dir(0) + "/tasks/";
  const std::optional<pid_t> pid_a = cluster.TrainerPid(0, TaskId(*a, 0));
  const std::optional<pid_t> pid_b = cluster.TrainerPid(0, TaskId(*b, 0));
  ASSERT_TRUE(pid_a.has_value() && pid_b.has_value());
  const int uid_a = ProcessUid(*pid_a);
  const int uid_b = ProcessUid(*pid_b);
  EXPECT_GE(uid_a, 61000);
  EXPECT_LE(uid_a, 61999);
  EXPECT_GE(uid_b, 61000);
  EXPECT_NE(uid_a, uid_b);

  // Its own credential it reads; its neighbour's and the agent's token it does not.
  EXPECT_TRUE(CanRead(uid_a, tasks + TaskId(*a, 0) + "/task.pb"));
  EXPECT_FALSE(CanRead(uid_a, tasks + TaskId(*b, 0) + "/task.pb"));
  EXPECT_FALSE(CanRead(uid_b, tasks + TaskId(*a, 0) + "/task.pb"));
  EXPECT_FALSE(CanRead(uid_a, token_file));
  EXPECT_FALSE(CanRead(uid_a, tasks + TaskId(*b, 0) + "/output.log"));
  // The agent's environment stays with the agent, but for what the runtime needs.
  const std::string environ = ReadFile(absl::StrCat("/proc/", *pid_a, "/environ"));
  EXPECT_FALSE(absl::StrContains(environ, "not-for-trainers"));
  EXPECT_TRUE(absl::StrContains(environ, "AWS_REGION=eu-test-1"));

  cluster.Release("iso-a");
  cluster.Release("iso-b");
  for (const v1::Job& job : {*a, *b}) {
    absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job.id());
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
    EXPECT_EQ(done->committed_step(), 4);
  }
}

TEST(SecurityTest, PlaintextBeyondLoopbackNeedsInsecure) {
  TempDir dir;
  Process refused({BinDir() + "/trainyard-coordinator", "--listen=0.0.0.0:0",
                   "--state_dir=" + dir.path() + "/a", "--metrics_listen="},
                  dir.path() + "/a.log");
  auto status = refused.Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_NE(WEXITSTATUS(*status), 0);
  EXPECT_TRUE(absl::StrContains(refused.Log(), "is not loopback and there is no TLS"))
      << refused.Log();

  const std::string port_file = dir.path() + "/port";
  Process allowed(
      {BinDir() + "/trainyard-coordinator", "--listen=0.0.0.0:0", "--insecure",
       "--state_dir=" + dir.path() + "/b", "--metrics_listen=", "--port_file=" + port_file},
      dir.path() + "/b.log");
  EXPECT_TRUE(PollUntil([&] { return !ReadFile(port_file).empty() || !allowed.running(); },
                        absl::Seconds(30)));
  EXPECT_TRUE(allowed.running()) << allowed.Log();
  EXPECT_TRUE(absl::StrContains(allowed.Log(), "tokens and job data travel in clear"))
      << allowed.Log();
  allowed.Stop();
}

}  // namespace
}  // namespace trainyard::testing
