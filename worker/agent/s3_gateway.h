#ifndef TRAINYARD_WORKER_AGENT_S3_GATEWAY_H_
#define TRAINYARD_WORKER_AGENT_S3_GATEWAY_H_

// The agent's S3 gateway: how trainers reach object storage without the agent's keys. A trainer
// runs the job's spec, which any user with a token writes; with the agent's S3 keys it could
// read and overwrite every other job's data and checkpoints. Instead each task gets a key of its
// own (Grant), good only at this gateway and only while the task runs, and S3 settings that
// point its S3 client here. The gateway, on the worker's loopback, checks each request's SigV4
// signature against the task's key and its operation against the task's scope
// (s3_gateway_rules.h), then signs it again with the agent's credentials and streams it to the
// real endpoint and the answer back. Any S3 client works through it: the trainer's own, and
// botocore's (awscli, boto3) in a user's program.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/storage/s3_client.h"
#include "worker/agent/s3_gateway_rules.h"

struct mg_context;
struct mg_connection;

namespace trainyard {

struct S3GatewayOptions {
  // The agent's own S3 settings and credentials: where requests go on.
  S3ClientOptions upstream;
  std::string listen = "127.0.0.1:0";  // loopback: only this machine's trainers reach it
  int threads = 64;                    // requests served at once
  const Clock* clock = nullptr;        // null: RealClock
};

class S3Gateway {
 public:
  // Listens; UNAVAILABLE when it cannot.
  static absl::StatusOr<std::unique_ptr<S3Gateway>> Start(S3GatewayOptions options);
  ~S3Gateway();  // stops serving; requests in flight end first
  S3Gateway(const S3Gateway&) = delete;
  S3Gateway& operator=(const S3Gateway&) = delete;

  const std::string& endpoint() const { return endpoint_; }  // http://127.0.0.1:PORT

  // A key for `task_id` that reaches only `scope` (a new one replaces the task's last), and the
  // environment its trainer needs to use it: AWS_ENDPOINT_URL(_S3) here, path-style addressing,
  // the key, the region.
  std::map<std::string, std::string> Grant(const std::string& task_id, ObjectScope scope);
  // The task's key stops working.
  void Revoke(const std::string& task_id);

  int64_t requests() const;  // served, refused ones included
  int64_t refused() const;

  // The civetweb request handler's body; public for the C callback only.
  int Serve(mg_connection* connection);

 private:
  struct Key {
    std::string secret;
    std::string task_id;
    ObjectScope scope;
  };
  explicit S3Gateway(S3GatewayOptions options);

  const S3GatewayOptions options_;
  const Clock& clock_;
  S3Client upstream_;
  mg_context* server_ = nullptr;
  std::string endpoint_;
  mutable absl::Mutex mu_;
  std::map<std::string, Key> keys_ ABSL_GUARDED_BY(mu_);             // by key id
  std::map<std::string, std::string> by_task_ ABSL_GUARDED_BY(mu_);  // task id -> key id
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_S3_GATEWAY_H_
