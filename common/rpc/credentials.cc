#include "common/rpc/credentials.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/sha256.h"

namespace trainyard {
namespace {

constexpr absl::string_view kTokenPrefix = "tyk_";
constexpr size_t kTokenIdLength = 12;
constexpr absl::string_view kTaskPrefix = "tyt1.";

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kAgent:
      return "agent";
    case Role::kTask:
      return "task";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseTokenRole(absl::string_view name) {
  if (name == "admin") return Role::kAdmin;
  if (name == "user") return Role::kUser;
  if (name == "agent") return Role::kAgent;
  return absl::InvalidArgumentError(
      absl::StrCat("role '", name, "' is not one of admin, user, agent"));
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t got = getrandom(out.data() + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      LogError("getrandom failed: ", errno);
      std::abort();
    }
    done += static_cast<size_t>(got);
  }
  return out;
}

NewToken GenerateToken() {
  NewToken t;
  t.id = absl::BytesToHexString(RandomBytes(kTokenIdLength / 2));
  std::string secret;
  absl::WebSafeBase64Escape(RandomBytes(32), &secret);
  t.token = absl::StrCat(kTokenPrefix, t.id, "_", secret);
  t.hash = Sha256Hex(t.token);
  return t;
}

absl::StatusOr<std::string> TokenId(absl::string_view token) {
  absl::string_view rest = token;
  if (!absl::ConsumePrefix(&rest, kTokenPrefix) || rest.size() <= kTokenIdLength + 1 ||
      rest[kTokenIdLength] != '_') {
    return absl::UnauthenticatedError("the bearer token is not a Trainyard token");
  }
  absl::string_view id = rest.substr(0, kTokenIdLength);
  for (char c : id) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) {
      return absl::UnauthenticatedError("the bearer token is not a Trainyard token");
    }
  }
  return std::string(id);
}

bool TokenMatches(absl::string_view token, absl::string_view stored_hash) {
  const std::string hash = Sha256Hex(token);
  return hash.size() == stored_hash.size() &&
         CRYPTO_memcmp(hash.data(), stored_hash.data(), hash.size()) == 0;
}

bool IsTaskCredential(absl::string_view credential) {
  return absl::StartsWith(credential, kTaskPrefix);
}

std::string SignTaskCredential(absl::string_view key, const TaskScope& scope) {
  std::string payload;
  absl::WebSafeBase64Escape(absl::StrCat(scope.job_id, "\n", scope.generation, "\n",
                                         scope.shard ? "shard" : "rank", "\n", scope.index),
                            &payload);
  const std::string signed_part = absl::StrCat(kTaskPrefix, payload);
  std::string mac;
  absl::WebSafeBase64Escape(HmacSha256(key, signed_part), &mac);
  return absl::StrCat(signed_part, ".", mac);
}

absl::StatusOr<TaskScope> VerifyTaskCredential(absl::string_view key,
                                               absl::string_view credential) {
  const absl::Status bad = absl::UnauthenticatedError("the task credential is not valid");
  const size_t dot = credential.rfind('.');
  if (!IsTaskCredential(credential) || dot < kTaskPrefix.size()) return bad;
  const absl::string_view signed_part = credential.substr(0, dot);
  std::string mac;
  if (!absl::WebSafeBase64Unescape(credential.substr(dot + 1), &mac)) return bad;
  const std::string expected = HmacSha256(key, signed_part);
  if (mac.size() != expected.size() ||
      CRYPTO_memcmp(mac.data(), expected.data(), mac.size()) != 0) {
    return bad;
  }
  std::string payload;
  if (!absl::WebSafeBase64Unescape(signed_part.substr(kTaskPrefix.size()), &payload)) return bad;
  std::vector<absl::string_view> parts = absl::StrSplit(payload, '\n');
  TaskScope scope;
  if (parts.size() != 4 || (parts[2] != "rank" && parts[2] != "shard") ||
      !absl::SimpleAtoi(parts[1], &scope.generation) || !absl::SimpleAtoi(parts[3], &scope.index)) {
    return bad;
  }
  scope.job_id = std::string(parts[0]);
  scope.shard = parts[2] == "shard";
  return scope;
}

std::string AttemptSecret(absl::string_view key, absl::string_view job_id, int64_t generation) {
  std::string secret;
  absl::WebSafeBase64Escape(HmacSha256(key, absl::StrCat("attempt\n", job_id, "\n", generation)),
                            &secret);
  return secret;
}

absl::Status WriteSecretFile(const std::string& path, absl::string_view content) {
  const std::string temp = absl::StrCat(path, ".tmp");
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", temp, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      return absl::UnavailableError(
          absl::StrCat("cannot write ", temp, ": ", std::strerror(error)));
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0 || std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadOrCreateKey(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (in) {
    std::stringstream contents;
    contents << in.rdbuf();
    std::string key = contents.str();
    if (key.size() < 32) {
      return absl::FailedPreconditionError(
          absl::StrCat("the key in ", path, " is shorter than 32 bytes"));
    }
    return key;
  }
  std::string key = RandomBytes(32);
  if (absl::Status s = WriteSecretFile(path, key); !s.ok()) return s;
  return key;
}

bool IsTokenText(absl::string_view token) {
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace trainyard
