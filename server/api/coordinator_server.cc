#include "server/api/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/channel.h"

namespace trainyard {
namespace {

// Serves server reflection on one builder's server, or keeps it off. Linking gRPC's reflection
// library registers its plugin for every server the process builds (a static initializer calls
// InitProtoReflectionServerBuilderPlugin()), the standby's and the health port's included: each
// builder is given this option, which removes that plugin unless asked to serve it.
class ReflectionOption : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool serve) : serve_(serve) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    static const std::string* const kName =
        new std::string(grpc::reflection::ProtoServerReflectionPlugin().name());
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return plugin->name() == *kName;
                                  }),
                   plugins->end());
    if (serve_) {
      plugins->push_back(std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>());
    }
  }

 private:
  const bool serve_;
};

// Ends a call at once with `status`.
class Refusal : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// On --health_listen, answers every call but the health service's with UNIMPLEMENTED. gRPC
// builds no server without a service of its own (the default health service joins later), and
// the reflection plugin, which used to be that service there, is off.
class CoordinatorServer::HealthOnly : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new Refusal(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat(context->method(), ": this port serves grpc.health.v1.Health only")));
  }
};

CoordinatorServer::CoordinatorServer(JobManager& manager, Authenticator& auth,
                                     int max_streams_per_caller, const WorkdirStore* workdirs)
    : manager_(manager),
      gate_(auth, max_streams_per_caller),
      job_service_(manager, gate_, auth, workdirs),
      agent_service_(manager, gate_),
      admin_service_(auth, manager, gate_),
      health_only_(std::make_unique<HealthOnly>()) {}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    JobManager& manager, Authenticator& auth, const CoordinatorServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<CoordinatorServer> server(
      new CoordinatorServer(manager, auth, options.max_streams_per_caller, options.workdirs));
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<ReflectionOption>(options.reflection));
  // gRPC shares a port with another process that listens on it (SO_REUSEPORT) unless told not
  // to: a second coordinator would take half of the first one's calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The transport proves a silent connection with pings the agent's transport answers; traffic
  // (an idle agent's long polls, a busy one's beats) puts them off, so a healthy agent is not
  // pinged at all (gRPC resets the keepalive timer on every read).
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIME_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.lease_ping_interval)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.lease_ping_timeout)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Agents and trainers ping too, to find a dead connection themselves
  // (CoordinatorClientArguments); a little more often than they do is no abuse.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kCoordinatorClientMinPingMs);
  builder.AddListeningPort(
      options.listen,
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials(),
      &server->port_);
  builder.RegisterService(&server->job_service_);
  builder.RegisterService(&server->agent_service_);
  builder.RegisterService(&server->admin_service_);
  if (options.searches != nullptr) {
    server->search_service_ = std::make_unique<SearchServiceImpl>(*options.searches, server->gate_);
    builder.RegisterService(server->search_service_.get());
  }
  // The largest request (a 1 MiB spec or log chunk, request_limits.cc) with room to spare.
  builder.SetMaxReceiveMessageSize(4 << 20);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  if (!options.health_listen.empty()) {
    grpc::ServerBuilder health;
    health.SetOption(std::make_unique<ReflectionOption>(false));
    health.RegisterCallbackGenericService(server->health_only_.get());
    health.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health.AddListeningPort(options.health_listen, grpc::InsecureServerCredentials(),
                            &server->health_port_);
    server->health_server_ = health.BuildAndStart();
    if (server->health_server_ == nullptr || server->health_port_ == 0) {
      server->server_->Shutdown();
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options.health_listen));
    }
    server->health_server_->GetHealthCheckService()->SetServingStatus(kLivenessService, true);
  }
  server->ticker_ =
      std::thread([&manager, searches = options.searches, tick_interval = options.tick_interval] {
        // WaitForTickRequest returns at once after Shutdown; the tick loop ends with it.
        while (true) {
          manager.WaitForTickRequest(tick_interval);
          if (manager.IsShutDown()) break;
          manager.Tick();
          if (searches != nullptr) searches->Tick();
        }
      });
  return server;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::Seconds(5)); }

std::shared_ptr<grpc::Channel> CoordinatorServer::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void CoordinatorServer::SetServing(bool serving) {
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    if (server != nullptr) server->GetHealthCheckService()->SetServingStatus(serving);
  }
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  manager_.Shutdown();
  if (health_server_ != nullptr)
    health_server_->Shutdown(absl::ToChronoTime(RealClock::Get().Now()));
  // Null when Start failed to listen: the server never ran.
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(RealClock::Get().Now() + grace));
  if (ticker_.joinable()) ticker_.join();
}

// Answers every call that no registered service takes (the API's) with UNAVAILABLE, naming the
// leader.
class StandbyServer::Refuser : public grpc::CallbackGenericService {
 public:
  explicit Refuser(const StandbyServer& owner) : owner_(owner) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    const std::string leader = owner_.leader();
    std::string message = "this coordinator stands by; ";
    if (leader.empty()) {
      absl::StrAppend(&message,
                      "no coordinator leads at the moment (a standby takes over "
                      "within the leader lease): try again shortly");
    } else {
      context->AddTrailingMetadata(kLeaderMetadata, leader);
      absl::StrAppend(&message, "the leader serves at ", leader,
                      " (give clients every coordinator's address, as --coordinator=A,B, and "
                      "they follow the leader)");
    }
    return new Refusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
  }

 private:
  const StandbyServer& owner_;
};

StandbyServer::StandbyServer() : refuser_(std::make_unique<Refuser>(*this)) {}

StandbyServer::~StandbyServer() {
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(RealClock::Get().Now()));
}

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<StandbyServer> standby(new StandbyServer());
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<ReflectionOption>(false));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients given several coordinators keep a connection here (for its health) and ping it as
  // they ping the leader.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kCoordinatorClientMinPingMs);
  builder.AddListeningPort(listen,
                           credentials != nullptr ? credentials : grpc::InsecureServerCredentials(),
                           &standby->port_);
  builder.RegisterCallbackGenericService(standby->refuser_.get());
  standby->server_ = builder.BuildAndStart();
  if (standby->server_ == nullptr || standby->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  grpc::HealthCheckServiceInterface* health = standby->server_->GetHealthCheckService();
  health->SetServingStatus(false);
  health->SetServingStatus(kLivenessService, true);
  return standby;
}

void StandbyServer::SetLeader(const std::string& address) {
  absl::MutexLock lock(&mu_);
  leader_ = address;
}

std::string StandbyServer::leader() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

}  // namespace trainyard
