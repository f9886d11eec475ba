#ifndef TRAINYARD_TESTS_COMMON_S3RVER_H_
#define TRAINYARD_TESTS_COMMON_S3RVER_H_

// s3rver (an S3 endpoint in Node.js, installed by scripts/install-deps.sh under .tools/) on
// loopback for tests, plus a runner for the `aws` CLI against it.

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/storage/s3_client.h"

namespace trainyard::testing {

class S3rver {
 public:
  // The s3rver binary: $TRAINYARD_TOOLS_DIR/node_modules/.bin/s3rver; empty when missing.
  static std::string BinaryPath();

  // Starts s3rver on 127.0.0.1 with a port the kernel picks and its data in a new temporary
  // folder, creating `buckets`; returns once it answers HTTP. UNAVAILABLE when it cannot.
  static absl::StatusOr<std::unique_ptr<S3rver>> Start(const std::vector<std::string>& buckets);
  ~S3rver();  // stops the server and removes its folder
  S3rver(const S3rver&) = delete;
  S3rver& operator=(const S3rver&) = delete;

  const std::string& endpoint() const { return endpoint_; }  // http://127.0.0.1:PORT
  // s3rver's fixed credentials and the endpoint, as a process would get them.
  std::map<std::string, std::string> Env() const;
  S3ClientOptions ClientOptions() const;

  struct CommandResult {
    int exit_code = -1;
    std::string output;
  };
  // Runs `aws --endpoint-url ENDPOINT <args>` with s3rver's credentials; waits for it.
  CommandResult Aws(const std::vector<std::string>& args) const;

 private:
  S3rver() = default;
  pid_t pid_ = -1;
  std::string dir_;
  std::string endpoint_;
};

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_S3RVER_H_
