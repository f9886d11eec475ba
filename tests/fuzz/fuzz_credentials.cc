// Credentials as they arrive: a bearer token or a task credential in a call's metadata (anyone
// who reaches the port), and the files operators and users point the daemons and the CLI at (a
// token file, a metrics basic-auth file, an AWS shared credentials file, a coordinator port
// file), and the flags' lists (coordinator addresses, a task uid range, a role). The first byte
// picks which.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/string_view.h"
#include "client/local_cluster.h"
#include "common/rpc/channel.h"
#include "common/rpc/credentials.h"
#include "common/rpc/metrics_http.h"
#include "common/storage/s3_auth.h"
#include "tests/fuzz/fuzz_support.h"
#include "worker/agent/task_user.h"

namespace fs = std::filesystem;

namespace {

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";

const std::string& FilePath() {
  static const std::string path = trainyard::fuzz::MakeScratchDir("credentials") + "/file";
  return path;
}

std::string Write(absl::string_view bytes) {
  std::ofstream(FilePath(), std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return FilePath();
}

void Credential(absl::string_view text) {
  trainyard::TokenId(text).IgnoreError();
  trainyard::TokenMatches(text, "0000000000000000000000000000000000000000000000000000000000000000");
  if (!trainyard::IsTaskCredential(text)) return;
  absl::StatusOr<trainyard::TaskScope> scope = trainyard::VerifyTaskCredential(kKey, text);
  if (!scope.ok()) return;
  // Accepted: it says what a credential signed for that scope says.
  absl::StatusOr<trainyard::TaskScope> again =
      trainyard::VerifyTaskCredential(kKey, trainyard::SignTaskCredential(kKey, *scope));
  if (!again.ok() || again->job_id != scope->job_id || again->generation != scope->generation ||
      again->shard != scope->shard || again->index != scope->index) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
      Credential(rest);
      break;
    case 1:
      trainyard::ReadCredentialFile(Write(rest)).IgnoreError();
      trainyard::LoadMetricsHttpOptions(FilePath(), "", "").IgnoreError();
      break;
    case 2: {
      const std::string path = Write(rest);
      trainyard::LoadAwsCredentials([&](const char* name) -> const char* {
        if (std::strcmp(name, "AWS_SHARED_CREDENTIALS_FILE") == 0) return path.c_str();
        if (std::strcmp(name, "AWS_PROFILE") == 0) return "trainyard";
        return nullptr;
      }).IgnoreError();
      break;
    }
    case 3:
      trainyard::cli::ParsePortFile(std::string(rest)).IgnoreError();
      break;
    case 4:
      trainyard::CoordinatorAddresses(rest);  // (CoordinatorTarget also resolves: not fuzzed)
      break;
    default:
      trainyard::ParseTaskUidRange(rest).IgnoreError();
      trainyard::ParseTokenRole(rest).IgnoreError();
      break;
  }
  return 0;
}
