#ifndef TRAINYARD_COMMON_RPC_CREDENTIALS_H_
#define TRAINYARD_COMMON_RPC_CREDENTIALS_H_

// The secrets callers present to the coordinator, made and checked without gRPC.
//
// Bearer tokens of people and agents are "tyk_<id>_<secret>": the id (12 hex digits) names the
// stored record, the secret is 256 random bits. The coordinator keeps only the SHA-256 of the
// whole token; a plain hash is enough because the secret is random, not a password.
//
// A task credential is what one trainer or parameter-server process presents:
// "tyt1.<scope>.<mac>", the scope (job, generation, rank or shard) in web-safe base64 and an
// HMAC-SHA256 of "tyt1.<scope>" under the coordinator's task key. It is checked without a
// lookup; it stops working when its job moves to another generation or ends.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

enum class Role { kAdmin, kUser, kAgent, kTask };

// "admin", "user", "agent", "task".
absl::string_view RoleName(Role role);
// INVALID_ARGUMENT naming the roles a token may have (admin, user, agent).
absl::StatusOr<Role> ParseTokenRole(absl::string_view name);

// `n` bytes from the kernel's random source. Aborts if the kernel cannot give them.
std::string RandomBytes(size_t n);

struct NewToken {
  std::string id;     // 12 hex digits
  std::string token;  // what the holder presents; shown once
  std::string hash;   // what is stored: Sha256Hex(token)
};
NewToken GenerateToken();

// The id in a token; UNAUTHENTICATED when it is not a Trainyard token.
absl::StatusOr<std::string> TokenId(absl::string_view token);

// True when `token` hashes to `stored_hash`, compared in constant time.
bool TokenMatches(absl::string_view token, absl::string_view stored_hash);

// Whether `token` is printable ASCII without spaces, as every token and task credential is: what
// gRPC metadata may carry (gRPC ends the process on anything else), checked before it is sent.
bool IsTokenText(absl::string_view token);

// What a task credential allows: the calls of one process of one attempt of one job.
struct TaskScope {
  std::string job_id;
  int64_t generation = 0;
  bool shard = false;  // a parameter-server shard, not a worker rank
  int32_t index = 0;   // the rank, or the shard
};

bool IsTaskCredential(absl::string_view credential);
std::string SignTaskCredential(absl::string_view key, const TaskScope& scope);
// UNAUTHENTICATED when the credential is malformed or not signed with `key`.
absl::StatusOr<TaskScope> VerifyTaskCredential(absl::string_view key, absl::string_view credential);

// The secret every process of one attempt (job, generation) shares, and no other: what its
// parameter servers ask of callers. Web-safe base64 of an HMAC under `key`.
std::string AttemptSecret(absl::string_view key, absl::string_view job_id, int64_t generation);

// Writes `content` to `path` readable by its owner only (mode 0600), atomically (temp file, then
// rename). UNAVAILABLE naming the path when it cannot.
absl::Status WriteSecretFile(const std::string& path, absl::string_view content);

// The key in `path`, made (32 random bytes, mode 0600) when the file does not exist.
// FAILED_PRECONDITION when the file is there but shorter than 32 bytes; UNAVAILABLE when it
// cannot be read or written.
absl::StatusOr<std::string> LoadOrCreateKey(const std::string& path);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RPC_CREDENTIALS_H_
