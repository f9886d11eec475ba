#include "common/rpc/channel.h"

#include <arpa/inet.h>
#include <grpcpp/support/client_interceptor.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/rpc/credentials.h"

namespace trainyard {
namespace {

// Adds the bearer credential to every call's initial metadata. Call credentials would do the
// same on TLS channels only; the interceptor also serves plaintext loopback channels.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string& value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", value_});
    }
    methods->Proceed();
  }

 private:
  const std::string& value_;
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token) : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(value_);
  }

 private:
  const std::string value_;
};

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  if (!in || !(contents << in.rdbuf())) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  }
  return contents.str();
}

}  // namespace

absl::Status SplitHostPort(absl::string_view address, std::string* host, std::string* port) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find("]:");
    if (close == absl::string_view::npos || close + 2 == address.size()) {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not [HOST]:PORT"));
    }
    *host = std::string(address.substr(1, close - 1));
    *port = std::string(address.substr(close + 2));
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  *host = std::string(address.substr(0, colon));
  *port = std::string(address.substr(colon + 1));
  return absl::OkStatus();
}

std::vector<std::string> CoordinatorAddresses(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}

absl::StatusOr<std::string> CoordinatorTarget(absl::string_view list) {
  const std::vector<std::string> addresses = CoordinatorAddresses(list);
  if (addresses.empty()) return absl::InvalidArgumentError("no coordinator address given");
  if (addresses.size() == 1) return addresses[0];
  std::vector<std::string> v4, v6;
  std::vector<std::string> unresolved;
  for (const std::string& address : addresses) {
    std::string host, port;
    if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) {
      unresolved.push_back(address);
      continue;
    }
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      if (a->ai_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text,
                  sizeof(text));
        v4.push_back(absl::StrCat(text, ":", port));
      } else if (a->ai_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                  sizeof(text));
        v6.push_back(absl::StrCat("[", text, "]:", port));
      }
    }
    freeaddrinfo(found);
  }
  // One scheme per target: IPv4 when any address has one.
  if (!v4.empty()) return absl::StrCat("ipv4:", absl::StrJoin(v4, ","));
  if (!v6.empty()) return absl::StrCat("ipv6:", absl::StrJoin(v6, ","));
  return absl::UnavailableError(
      absl::StrCat("no coordinator address resolves: ", absl::StrJoin(unresolved, ", ")));
}

bool IsLoopbackAddress(absl::string_view address) {
  if (absl::StrContains(address, ',')) {
    const std::vector<std::string> all = CoordinatorAddresses(address);
    for (const std::string& one : all) {
      if (!IsLoopbackAddress(one)) return false;
    }
    return !all.empty();
  }
  absl::string_view host = address;
  if (absl::ConsumePrefix(&host, "[")) {
    host = host.substr(0, host.find(']'));
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  absl::ConsumePrefix(&host, "ipv4:");
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(path, "credential file");
  if (!contents.ok()) return contents.status();
  std::string line(absl::StripAsciiWhitespace(contents->substr(0, contents->find('\n'))));
  if (line.empty()) return absl::InvalidArgumentError(absl::StrCat("the file ", path, " is empty"));
  return line;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NewServerCredentials(
    const ServerTls& tls) {
  if (tls.cert_file.empty()) {
    if (!tls.key_file.empty() || !tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError("a TLS key or client CA needs the certificate too");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.key_file.empty()) return absl::InvalidArgumentError("a TLS certificate needs its key");
  grpc::SslServerCredentialsOptions options;
  absl::StatusOr<std::string> cert = ReadFile(tls.cert_file, "certificate file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(tls.key_file, "key file");
  if (!key.ok()) return key.status();
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(tls.client_ca_file, "client CA file");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

grpc::ChannelArguments CoordinatorClientArguments(absl::Duration ping_interval) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectTimeoutMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(ping_interval),
                                                   kCoordinatorClientPingMs, INT32_MAX)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kCoordinatorClientPingMs);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

// Keeps a channel's connections moving while no call waits on it. This gRPC (1.51) makes progress
// on a connection attempt (TCP, then TLS) only while some thread polls for it: a call waiting for
// the channel to be ready, a connectivity watch, or the backup poller every 5 s. round_robin with
// health checks connects on its own, and a call that fails fast polls nothing, so a client that
// only made such calls (a test's, the CLI's) waited up to minutes for the new leader after a
// takeover, each attempt overrunning its connect timeout. A thread that watches the channel's
// state polls it all the time; it wakes every 100 ms to see whether the channel is still in use.
class ChannelPoller {
 public:
  explicit ChannelPoller(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), thread_([this] { Run(); }) {}
  ~ChannelPoller() {
    stop_.store(true);
    thread_.join();
  }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  void Run() {
    while (!stop_.load()) {
      const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
      channel_->WaitForStateChange(state, GrpcDeadline(absl::Milliseconds(100)));
    }
  }

  const std::shared_ptr<grpc::Channel> channel_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

namespace {
// `args` with the integer arguments `ints` set, replacing any of the same keys (gRPC reads the
// first of two arguments of one key, so setting it again would change nothing).
grpc::ChannelArguments WithInts(const grpc::ChannelArguments& args,
                                const std::map<std::string, int>& ints) {
  grpc::ChannelArguments out;
  const grpc_channel_args c = args.c_channel_args();
  for (size_t i = 0; i < c.num_args; ++i) {
    const grpc_arg& arg = c.args[i];
    // The new arguments' own user agent stands (ChannelArguments sets one).
    if (ints.count(arg.key) > 0 || std::string(arg.key) == GRPC_ARG_PRIMARY_USER_AGENT_STRING) {
      continue;
    }
    switch (arg.type) {
      case GRPC_ARG_INTEGER:
        out.SetInt(arg.key, arg.value.integer);
        break;
      case GRPC_ARG_STRING:
        out.SetString(arg.key, arg.value.string);
        break;
      case GRPC_ARG_POINTER:
        out.SetPointerWithVtable(arg.key, arg.value.pointer.p, arg.value.pointer.vtable);
        break;
    }
  }
  for (const auto& [key, value] : ints) out.SetInt(key, value);
  return out;
}
}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewClientChannel(
    const std::string& address, const ClientCredentials& credentials,
    const grpc::ChannelArguments& args, bool own_poller) {
  grpc::ChannelArguments channel_args = args;
  absl::StatusOr<std::string> target = CoordinatorTarget(address);
  if (!target.ok()) return target.status();
  const std::vector<std::string> addresses = CoordinatorAddresses(address);
  if (addresses.size() > 1) {
    // Several coordinators: one leads, the others stand by and answer their health NOT_SERVING
    // (server/api/coordinator_server.h). round_robin over those that say SERVING is the leader,
    // followed across a takeover as soon as the new one says so.
    channel_args.SetServiceConfigJSON(R"({"loadBalancingConfig": [{"round_robin": {}}],)"
                                      R"( "healthCheckConfig": {"serviceName": ""}})");
    // A frozen leader answers nothing, its health included: only a ping finds it gone.
    channel_args =
        WithInts(channel_args, {{GRPC_ARG_KEEPALIVE_TIME_MS, kSeveralCoordinatorsPingMs},
                                {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kSeveralCoordinatorsPingTimeoutMs},
                                {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0}});
  }
  std::shared_ptr<grpc::ChannelCredentials> transport;
  if (!credentials.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadFile(credentials.ca_file, "CA file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (credentials.cert_file.empty() != credentials.key_file.empty()) {
      return absl::InvalidArgumentError("a client certificate needs both its file and its key");
    }
    if (!credentials.cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(credentials.cert_file, "certificate file");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(credentials.key_file, "key file");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    if (!credentials.server_name.empty()) {
      channel_args.SetSslTargetNameOverride(credentials.server_name);
    } else if (addresses.size() > 1) {
      // Each coordinator's certificate must then carry the first address's host name.
      const std::string& first = addresses[0];
      channel_args.SetSslTargetNameOverride(absl::StartsWith(first, "[")
                                                ? first.substr(1, first.find(']') - 1)
                                                : first.substr(0, first.rfind(':')));
    }
    transport = grpc::SslCredentials(ssl);
  } else {
    if (!credentials.cert_file.empty()) {
      return absl::InvalidArgumentError("a client certificate needs TLS: give the CA file too");
    }
    if (!credentials.insecure && !IsLoopbackAddress(address)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator ", address,
                       " is not on this machine: give the CA file of its TLS certificate, or allow "
                       "plaintext explicitly (--insecure)"));
    }
    transport = grpc::InsecureChannelCredentials();
  }
  if (!IsTokenText(credentials.token)) {
    return absl::InvalidArgumentError(
        "the token holds a character no token has (tokens are printable ASCII): check the "
        "token file or TRAINYARD_TOKEN");
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!credentials.token.empty()) {
    interceptors.push_back(std::make_unique<BearerInterceptorFactory>(credentials.token));
  }
  std::shared_ptr<grpc::Channel> channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      *target, transport, channel_args, std::move(interceptors));
  if (addresses.size() < 2 || !own_poller) return channel;
  // The poller lives as long as the channel's last user: the channel handed out shares its
  // ownership.
  auto poller = std::make_shared<ChannelPoller>(std::move(channel));
  return std::shared_ptr<grpc::Channel>(poller, poller->channel().get());
}

}  // namespace trainyard
