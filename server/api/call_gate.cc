#include "server/api/call_gate.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/api/request_limits.h"

namespace trainyard {

CallerCredentials CallerOf(const grpc::ServerContextBase& context) {
  CallerCredentials c;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    if (absl::ConsumePrefix(&value, "Bearer ")) c.bearer = std::string(value);
  }
  if (std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& pem : auth->FindPropertyValues("x509_pem_cert")) {
      c.cert_pem.assign(pem.data(), pem.size());
      break;
    }
  }
  return c;
}

absl::StatusOr<Principal> CallGate::Admit(const grpc::ServerContextBase& context,
                                          const google::protobuf::Message& request,
                                          Audience audience, absl::string_view rpc) const {
  // Who calls is checked first: an anonymous caller learns nothing, not even the bounds.
  absl::StatusOr<Principal> caller = auth_.Authenticate(CallerOf(context));
  if (!caller.ok()) return caller.status();
  if (absl::Status s = Allow(*caller, audience, rpc); !s.ok()) return s;
  if (absl::Status s = CheckRequestLimits(request); !s.ok()) return s;
  return caller;
}

absl::StatusOr<CallGate::StreamSlot> CallGate::OpenStream(const Principal& caller) {
  std::string key = absl::StrCat(RoleName(caller.role), ":", caller.name);
  absl::MutexLock lock(&mu_);
  int& open = open_streams_[key];
  if (open >= max_streams_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        RoleName(caller.role), " '", caller.name, "' already holds ", open,
        " streams and long polls (WatchJob, GetJobLogs, Sync, RendezvousGet), the limit "
        "per caller; end one first"));
  }
  ++open;
  return StreamSlot(this, std::move(key));
}

CallGate::StreamSlot::~StreamSlot() {
  if (gate_ == nullptr) return;
  absl::MutexLock lock(&gate_->mu_);
  auto it = gate_->open_streams_.find(key_);
  if (it != gate_->open_streams_.end() && --it->second == 0) gate_->open_streams_.erase(it);
}

}  // namespace trainyard
