#ifndef TRAINYARD_SERVER_AUTH_AUTH_H_
#define TRAINYARD_SERVER_AUTH_AUTH_H_

// Room auth/: who is calling and what each role may do; tokens kept hashed through store/.
//
// Who is calling the coordinator, and what they may do.
//
// People and agents present bearer tokens (made by an admin, stored hashed in the coordinator's
// database) or client certificates (CN: the name; OU: the role, `user` when absent). Trainer and
// parameter-server processes present task credentials (common/rpc/credentials.h) that the
// coordinator hands their agent with each task. An agent's name is the worker name it may
// register and speak for.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rpc/credentials.h"
#include "google/protobuf/repeated_field.h"
#include "server/store/job_store.h"

namespace trainyard {

struct Principal {
  Role role = Role::kUser;
  std::string name;  // the person, or the worker an agent speaks for; "JOB/rank N" for a task
  TaskScope task;    // kTask only
  bool admin() const { return role == Role::kAdmin; }
};

// What the transport carried with a call.
struct CallerCredentials {
  std::string bearer;    // after "Bearer "; empty when none was sent
  std::string cert_pem;  // the client certificate TLS verified; empty when none
};

// The kinds of caller an RPC is for.
enum class Audience {
  kPeople,       // admins and users
  kAdmins,       // admins
  kAgents,       // agents
  kTasks,        // trainers and parameter servers
  kAgentsAdmins  // agents (for their own worker) and admins (for any)
};

// PERMISSION_DENIED naming `rpc`, the audience it is for and who called, when `principal` is not
// in `audience`.
absl::Status Allow(const Principal& principal, Audience audience, absl::string_view rpc);

// PERMISSION_DENIED unless `principal` is an admin or the job's owner.
absl::Status AllowJob(const Principal& principal, absl::string_view job_id,
                      absl::string_view owner);

// Whether `principal` may read job `job_id`'s checkpoints and exported model (and resume from
// them): as AllowJob, or a user its owner shares them with (`share_with`, "*" for every user).
absl::Status AllowCheckpoints(const Principal& principal, absl::string_view job_id,
                              absl::string_view owner,
                              const google::protobuf::RepeatedPtrField<std::string>& share_with);

// PERMISSION_DENIED unless `principal` is an admin or the search's owner.
absl::Status AllowSearch(const Principal& principal, absl::string_view search_id,
                         absl::string_view owner);

// PERMISSION_DENIED unless `principal` is an admin or the agent of worker `worker`.
absl::Status AllowWorker(const Principal& principal, absl::string_view worker);

// PERMISSION_DENIED unless `principal` is a task of job `job_id` in `generation`, and, when
// `rank` is given, that worker rank.
absl::Status AllowTask(const Principal& principal, absl::string_view job_id, int64_t generation,
                       std::optional<int32_t> rank = std::nullopt);

// A token as `trainyard token list` shows it (never the secret).
struct TokenInfo {
  std::string id;
  std::string name;
  Role role = Role::kUser;
  int64_t created_unix_ms = 0;
  int64_t expires_unix_ms = 0;  // 0: never
  int64_t revoked_unix_ms = 0;  // 0: not revoked
  std::string created_by;
  std::string revoked_by;
};

// Tokens, kept in memory and written through to the job store. Thread-safe.
class Authenticator {
 public:
  // `task_key` signs task credentials (at least 32 bytes). `store` and `clock` must outlive it.
  // Reads the stored tokens; the store's error when it cannot.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(JobStore& store,
                                                               std::string task_key,
                                                               const Clock& clock);

  // The principal behind `credentials`. UNAUTHENTICATED, saying why, when there is none, it is
  // unknown, expired or revoked, or the certificate names no role we know. A bearer credential
  // wins over a certificate.
  absl::StatusOr<Principal> Authenticate(const CallerCredentials& credentials) const;

  // Makes a token for `name` with `role`, valid for `ttl` (InfiniteDuration: until revoked),
  // recorded as made by `by`. Returns the token itself (shown once) and its record.
  // INVALID_ARGUMENT for a bad name or role; the store's error when it cannot be written.
  absl::StatusOr<std::pair<std::string, TokenInfo>> CreateToken(absl::string_view name, Role role,
                                                                absl::Duration ttl,
                                                                absl::string_view by);
  // NOT_FOUND for an unknown id, FAILED_PRECONDITION when already revoked.
  absl::StatusOr<TokenInfo> RevokeToken(absl::string_view id, absl::string_view by);
  std::vector<TokenInfo> ListTokens() const;  // oldest first

  // When no admin token is valid: makes one named "admin" and returns it; otherwise nullopt.
  absl::StatusOr<std::optional<std::string>> EnsureAdminToken();

 private:
  struct Record {
    TokenInfo info;
    std::string hash;
  };
  Authenticator(JobStore& store, std::string task_key, const Clock& clock)
      : store_(store), task_key_(std::move(task_key)), clock_(clock) {}
  absl::Status Write(const Record& record);
  absl::StatusOr<Principal> FromToken(absl::string_view token) const;
  absl::StatusOr<Principal> FromCertificate(absl::string_view pem) const;

  JobStore& store_;
  const std::string task_key_;
  const Clock& clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Record> tokens_ ABSL_GUARDED_BY(mu_);  // by id
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_AUTH_AUTH_H_
