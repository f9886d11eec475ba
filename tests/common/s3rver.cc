#include "tests/common/s3rver.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

}  // namespace

std::string S3rver::BinaryPath() {
  const char* tools = getenv("TRAINYARD_TOOLS_DIR");
  std::string dir = tools != nullptr ? tools : "";
  if (dir.empty()) {
    const char* source = getenv("TRAINYARD_SOURCE_DIR");
    if (source == nullptr) return "";
    dir = absl::StrCat(source, "/.tools");
  }
  const std::string path = dir + "/node_modules/.bin/s3rver";
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

absl::StatusOr<std::unique_ptr<S3rver>> S3rver::Start(const std::vector<std::string>& buckets) {
  const std::string binary = BinaryPath();
  if (binary.empty()) {
    return absl::UnavailableError("s3rver is not installed (run scripts/install-deps.sh)");
  }
  char templ[] = "/tmp/trainyard-s3rver-XXXXXX";
  if (mkdtemp(templ) == nullptr) return absl::UnavailableError("mkdtemp failed");
  std::unique_ptr<S3rver> server(new S3rver());
  server->dir_ = templ;
  const std::string data = server->dir_ + "/data";
  const std::string log = server->dir_ + "/s3rver.log";
  fs::create_directories(data);
  std::vector<std::string> args = {binary, "-d", data, "-a", "127.0.0.1", "-p", "0"};
  for (const std::string& b : buckets) {
    args.push_back("--configure-bucket");
    args.push_back(b);
  }
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    // s3rver's ListObjectsV2 continuation tokens use DES, which Node's OpenSSL 3 keeps in the
    // legacy provider.
    setenv("NODE_OPTIONS", "--openssl-legacy-provider", 1);
    FILE* out = freopen(log.c_str(), "w", stdout);
    (void)out;
    dup2(fileno(stdout), 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (pid < 0) return absl::UnavailableError("fork failed");
  server->pid_ = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    const std::string text = Slurp(log);
    const size_t at = text.find("listening on 127.0.0.1:");
    if (at != std::string::npos) {
      std::string port;
      for (size_t i = at + 23; i < text.size() && isdigit(text[i]); ++i) port.push_back(text[i]);
      int p = 0;
      if (absl::SimpleAtoi(port, &p) && p > 0) {
        server->endpoint_ = absl::StrCat("http://127.0.0.1:", p);
        return server;
      }
    }
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      server->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("s3rver exited: ", text));
    }
    absl::SleepFor(absl::Milliseconds(50));  // polling the log for the port it printed
  }
  return absl::UnavailableError(absl::StrCat("s3rver did not start: ", Slurp(log)));
}

S3rver::~S3rver() {
  if (pid_ > 0) {
    kill(-pid_, SIGTERM);
    kill(pid_, SIGTERM);
    int status;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    bool reaped = false;
    while (absl::Now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (!reaped) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
  }
  std::error_code ec;
  if (!dir_.empty() && getenv("TRAINYARD_KEEP_TEST_DIRS") == nullptr) fs::remove_all(dir_, ec);
}

std::map<std::string, std::string> S3rver::Env() const {
  return {{"AWS_ENDPOINT_URL", endpoint_},
          {"AWS_ACCESS_KEY_ID", "S3RVER"},
          {"AWS_SECRET_ACCESS_KEY", "S3RVER"},
          {"AWS_REGION", "us-east-1"}};
}

S3ClientOptions S3rver::ClientOptions() const {
  S3ClientOptions options;
  options.endpoint = endpoint_;
  options.credentials.access_key_id = "S3RVER";
  options.credentials.secret_access_key = "S3RVER";
  options.retry.max_attempts = 3;
  return options;
}

S3rver::CommandResult S3rver::Aws(const std::vector<std::string>& args) const {
  const std::string aws = access("/usr/bin/aws", X_OK) == 0 ? "/usr/bin/aws" : "aws";
  std::string command = "env";
  for (const auto& [k, v] : Env()) absl::StrAppend(&command, " ", k, "=", ShellQuote(v));
  absl::StrAppend(&command, " AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null ",
                  aws, " --endpoint-url ", ShellQuote(endpoint_));
  for (const std::string& a : args) absl::StrAppend(&command, " ", ShellQuote(a));
  absl::StrAppend(&command, " 2>&1");
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace trainyard::testing
