#include "server/auth/auth.h"

#include <openssl/bio.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainyard {
namespace {

constexpr size_t kMaxTokenNameLength = 128;

absl::string_view AudienceName(Audience audience) {
  switch (audience) {
    case Audience::kPeople:
      return "users and admins";
    case Audience::kAdmins:
      return "admins";
    case Audience::kAgents:
      return "worker agents";
    case Audience::kTasks:
      return "trainer and parameter-server processes";
    case Audience::kAgentsAdmins:
      return "worker agents and admins";
  }
  return "nobody";
}

std::string Who(const Principal& p) { return absl::StrCat(RoleName(p.role), " '", p.name, "'"); }

std::string TaskName(const TaskScope& scope) {
  return absl::StrCat(scope.job_id, "/", scope.shard ? "shard " : "rank ", scope.index);
}

// A certificate's first entry of `nid` in its subject; empty when it has none.
std::string SubjectEntry(X509* cert, int nid) {
  X509_NAME* subject = X509_get_subject_name(cert);
  const int index = X509_NAME_get_index_by_NID(subject, nid, -1);
  if (index < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
  unsigned char* utf8 = nullptr;
  const int length = ASN1_STRING_to_UTF8(&utf8, data);
  if (length < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(length));
  OPENSSL_free(utf8);
  return out;
}

absl::Status ValidTokenName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxTokenNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: must be 1 to ", kMaxTokenNameLength, " characters"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != '@') {
      return absl::InvalidArgumentError(
          absl::StrCat("name: '", name, "' may hold only letters, digits and - _ . @"));
    }
  }
  return absl::OkStatus();
}

StoredToken ToStored(const TokenInfo& info, const std::string& hash) {
  StoredToken t;
  t.id = info.id;
  t.name = info.name;
  t.role = std::string(RoleName(info.role));
  t.hash = hash;
  t.created_unix_ms = info.created_unix_ms;
  t.expires_unix_ms = info.expires_unix_ms;
  t.revoked_unix_ms = info.revoked_unix_ms;
  t.created_by = info.created_by;
  t.revoked_by = info.revoked_by;
  return t;
}

}  // namespace

absl::Status Allow(const Principal& p, Audience audience, absl::string_view rpc) {
  bool ok = false;
  switch (audience) {
    case Audience::kPeople:
      ok = p.role == Role::kAdmin || p.role == Role::kUser;
      break;
    case Audience::kAdmins:
      ok = p.role == Role::kAdmin;
      break;
    case Audience::kAgents:
      ok = p.role == Role::kAgent;
      break;
    case Audience::kTasks:
      ok = p.role == Role::kTask;
      break;
    case Audience::kAgentsAdmins:
      ok = p.role == Role::kAgent || p.role == Role::kAdmin;
      break;
  }
  if (ok) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(rpc, " is for ", AudienceName(audience), ", not for ", Who(p)));
}

absl::Status AllowJob(const Principal& p, absl::string_view job_id, absl::string_view owner) {
  if (p.admin() || (p.role == Role::kUser && p.name == owner)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("job ", job_id, " belongs to another user; ", Who(p), " may not see it"));
}

absl::Status AllowCheckpoints(const Principal& p, absl::string_view job_id, absl::string_view owner,
                              const google::protobuf::RepeatedPtrField<std::string>& share_with) {
  absl::Status owned = AllowJob(p, job_id, owner);
  if (owned.ok() || p.role != Role::kUser) return owned;
  for (const std::string& user : share_with) {
    if (user == p.name || user == "*") return absl::OkStatus();
  }
  return owned;
}

absl::Status AllowSearch(const Principal& p, absl::string_view search_id, absl::string_view owner) {
  if (p.admin() || (p.role == Role::kUser && p.name == owner)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("search ", search_id, " belongs to another user; ", Who(p), " may not see it"));
}

absl::Status AllowWorker(const Principal& p, absl::string_view worker) {
  if (p.admin() || (p.role == Role::kAgent && p.name == worker)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(Who(p), " may not speak for worker '", worker, "'"));
}

absl::Status AllowTask(const Principal& p, absl::string_view job_id, int64_t generation,
                       std::optional<int32_t> rank) {
  if (p.role != Role::kTask) {
    return absl::PermissionDeniedError(absl::StrCat(Who(p), " is not a task of job ", job_id));
  }
  if (p.task.job_id != job_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("the credential of ", TaskName(p.task), " is not for job ", job_id));
  }
  if (p.task.generation != generation) {
    return absl::PermissionDeniedError(absl::StrCat("the credential of ", TaskName(p.task),
                                                    " is for generation ", p.task.generation,
                                                    ", not ", generation));
  }
  // A shard speaks for the ranks it serves in rendezvous; only a rank's own number is checked.
  if (rank.has_value() && !p.task.shard && p.task.index != *rank) {
    return absl::PermissionDeniedError(
        absl::StrCat("the credential of ", TaskName(p.task), " is not for rank ", *rank));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(JobStore& store,
                                                                     std::string task_key,
                                                                     const Clock& clock) {
  if (task_key.size() < 32) {
    return absl::InvalidArgumentError("the task credential key must be at least 32 bytes");
  }
  absl::StatusOr<std::vector<StoredToken>> stored = store.LoadTokens();
  if (!stored.ok()) return stored.status();
  std::unique_ptr<Authenticator> auth(new Authenticator(store, std::move(task_key), clock));
  absl::MutexLock lock(&auth->mu_);
  for (const StoredToken& t : *stored) {
    absl::StatusOr<Role> role = ParseTokenRole(t.role);
    if (!role.ok()) {
      return absl::DataLossError(absl::StrCat("token ", t.id, ": ", role.status().message()));
    }
    Record r;
    r.info.id = t.id;
    r.info.name = t.name;
    r.info.role = *role;
    r.info.created_unix_ms = t.created_unix_ms;
    r.info.expires_unix_ms = t.expires_unix_ms;
    r.info.revoked_unix_ms = t.revoked_unix_ms;
    r.info.created_by = t.created_by;
    r.info.revoked_by = t.revoked_by;
    r.hash = t.hash;
    auth->tokens_[t.id] = std::move(r);
  }
  return auth;
}

absl::StatusOr<Principal> Authenticator::Authenticate(const CallerCredentials& c) const {
  if (!c.bearer.empty()) {
    if (IsTaskCredential(c.bearer)) {
      absl::StatusOr<TaskScope> scope = VerifyTaskCredential(task_key_, c.bearer);
      if (!scope.ok()) return scope.status();
      Principal p;
      p.role = Role::kTask;
      p.name = TaskName(*scope);
      p.task = *std::move(scope);
      return p;
    }
    return FromToken(c.bearer);
  }
  if (!c.cert_pem.empty()) return FromCertificate(c.cert_pem);
  return absl::UnauthenticatedError(
      "no credential: give a token (--token-file, TRAINYARD_TOKEN) or a client certificate");
}

absl::StatusOr<Principal> Authenticator::FromToken(absl::string_view token) const {
  absl::StatusOr<std::string> id = TokenId(token);
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(*id);
  if (it == tokens_.end() || !TokenMatches(token, it->second.hash)) {
    return absl::UnauthenticatedError("the token is not known here");
  }
  const TokenInfo& info = it->second.info;
  if (info.revoked_unix_ms != 0) {
    return absl::UnauthenticatedError(absl::StrCat("token ", info.id, " was revoked"));
  }
  if (info.expires_unix_ms != 0 && absl::ToUnixMillis(clock_.Now()) >= info.expires_unix_ms) {
    return absl::UnauthenticatedError(absl::StrCat("token ", info.id, " has expired"));
  }
  Principal p;
  p.role = info.role;
  p.name = info.name;
  return p;
}

absl::StatusOr<Principal> Authenticator::FromCertificate(absl::string_view pem) const {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = bio == nullptr ? nullptr : PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) return absl::UnauthenticatedError("the client certificate cannot be read");
  const std::string name = SubjectEntry(cert, NID_commonName);
  const std::string unit = SubjectEntry(cert, NID_organizationalUnitName);
  X509_free(cert);
  if (name.empty()) return absl::UnauthenticatedError("the client certificate has no CN");
  absl::StatusOr<Role> role = unit.empty() ? Role::kUser : ParseTokenRole(unit);
  if (!role.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat("the client certificate's OU: ", role.status().message()));
  }
  Principal p;
  p.role = *role;
  p.name = name;
  return p;
}

absl::Status Authenticator::Write(const Record& record) {
  StoreMutation m;
  m.tokens.push_back(ToStored(record.info, record.hash));
  return store_.Apply(m);
}

absl::StatusOr<std::pair<std::string, TokenInfo>> Authenticator::CreateToken(absl::string_view name,
                                                                             Role role,
                                                                             absl::Duration ttl,
                                                                             absl::string_view by) {
  if (absl::Status s = ValidTokenName(name); !s.ok()) return s;
  if (role == Role::kTask) {
    return absl::InvalidArgumentError("role: task credentials are made by the coordinator");
  }
  if (ttl <= absl::ZeroDuration()) return absl::InvalidArgumentError("ttl: must be > 0");
  NewToken made = GenerateToken();
  Record r;
  r.info.id = made.id;
  r.info.name = std::string(name);
  r.info.role = role;
  const absl::Time now = clock_.Now();
  r.info.created_unix_ms = absl::ToUnixMillis(now);
  if (ttl != absl::InfiniteDuration()) r.info.expires_unix_ms = absl::ToUnixMillis(now + ttl);
  r.info.created_by = std::string(by);
  r.hash = made.hash;
  absl::MutexLock lock(&mu_);
  if (tokens_.count(r.info.id)) return absl::InternalError("token id collision; try again");
  if (absl::Status s = Write(r); !s.ok()) return s;
  tokens_[r.info.id] = r;
  LogInfo("token ", r.info.id, " for ", RoleName(role), " '", name, "' created by ", by);
  return std::make_pair(std::move(made.token), r.info);
}

absl::StatusOr<TokenInfo> Authenticator::RevokeToken(absl::string_view id, absl::string_view by) {
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(id);
  if (it == tokens_.end()) return absl::NotFoundError(absl::StrCat("token '", id, "' not found"));
  if (it->second.info.revoked_unix_ms != 0) {
    return absl::FailedPreconditionError(absl::StrCat("token ", id, " is already revoked"));
  }
  Record r = it->second;
  r.info.revoked_unix_ms = absl::ToUnixMillis(clock_.Now());
  r.info.revoked_by = std::string(by);
  if (absl::Status s = Write(r); !s.ok()) return s;
  it->second = r;
  LogInfo("token ", id, " of ", RoleName(r.info.role), " '", r.info.name, "' revoked by ", by);
  return r.info;
}

std::vector<TokenInfo> Authenticator::ListTokens() const {
  std::vector<TokenInfo> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : tokens_) out.push_back(r.info);
  }
  std::sort(out.begin(), out.end(), [](const TokenInfo& a, const TokenInfo& b) {
    return std::tie(a.created_unix_ms, a.id) < std::tie(b.created_unix_ms, b.id);
  });
  return out;
}

absl::StatusOr<std::optional<std::string>> Authenticator::EnsureAdminToken() {
  {
    absl::MutexLock lock(&mu_);
    const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
    for (const auto& [id, r] : tokens_) {
      if (r.info.role == Role::kAdmin && r.info.revoked_unix_ms == 0 &&
          (r.info.expires_unix_ms == 0 || r.info.expires_unix_ms > now_ms)) {
        return std::nullopt;
      }
    }
  }
  absl::StatusOr<std::pair<std::string, TokenInfo>> made =
      CreateToken("admin", Role::kAdmin, absl::InfiniteDuration(), "coordinator");
  if (!made.ok()) return made.status();
  return std::optional<std::string>(std::move(made->first));
}

}  // namespace trainyard
