#include "server/console/console_server.h"

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#include <httplib.h>
#include <openssl/ssl.h>

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "server/console/console_assets.h"

namespace trainyard {
namespace {

// Scripts, styles, images and calls from this origin only; nothing inline, no frames, no plugins.
constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// A stream with nothing to say writes a blank line this often, so that a closed tab is noticed
// (the write fails) and its call cancelled.
constexpr absl::Duration kStreamHeartbeat = absl::Seconds(15);

void SetJson(httplib::Response& response, int status, const std::string& body) {
  response.status = status;
  response.set_header("Cache-Control", "no-store");
  // With its charset: cpp-httplib then leaves it uncompressed (its brotli at the highest quality
  // took 2 s for a 1 MB answer).
  response.set_content(body, "application/json; charset=utf-8");
}

void SetJsonError(httplib::Response& response, grpc::StatusCode code, absl::string_view message) {
  SetJson(response, HttpStatusOf(code), JsonError(code, message));
}

grpc::StatusCode CodeOfHttp(int status) {
  switch (status) {
    case 400:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case 404:
      return grpc::StatusCode::NOT_FOUND;
    case 405:
      return grpc::StatusCode::UNIMPLEMENTED;
    case 413:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    default:
      return grpc::StatusCode::UNKNOWN;
  }
}

// The TLS server: the certificate chain and key of the options, checked against each other,
// TLS 1.2 or later.
std::unique_ptr<httplib::Server> NewTlsServer(const ConsoleOptions& options) {
  return std::make_unique<httplib::SSLServer>([&options](SSL_CTX& ctx) {
    return SSL_CTX_use_certificate_chain_file(&ctx, options.tls_cert_file.c_str()) == 1 &&
           SSL_CTX_use_PrivateKey_file(&ctx, options.tls_key_file.c_str(), SSL_FILETYPE_PEM) == 1 &&
           SSL_CTX_check_private_key(&ctx) == 1 &&
           SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION) == 1;
  });
}

}  // namespace

ConsoleServer::ConsoleServer(ConsoleOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<ConsoleServer>> ConsoleServer::Start(ConsoleOptions options) {
  const bool tls = !options.tls_cert_file.empty();
  if (tls != !options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("the console's TLS needs both a certificate and a key");
  }
  const size_t colon = options.listen.rfind(':');
  int requested = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(options.listen.substr(colon + 1), &requested) || requested < 0 ||
      requested > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("console address '", options.listen, "': give HOST:PORT"));
  }
  std::string host = options.listen.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  std::unique_ptr<ConsoleServer> server(new ConsoleServer(std::move(options)));
  const ConsoleOptions& o = server->options_;
  server->server_ = tls ? NewTlsServer(o) : std::make_unique<httplib::Server>();
  if (!server->server_->is_valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the console's TLS certificate and key do not load (", o.tls_cert_file, ", ",
                     o.tls_key_file, "): both PEM, the key the certificate's"));
  }
  server->Route();
  const int threads = std::max(o.threads, 2);
  server->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  const bool bound = requested == 0 ? (server->port_ = server->server_->bind_to_any_port(host)) > 0
                                    : server->server_->bind_to_port(host, requested);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat("the console cannot listen on ", o.listen));
  }
  if (requested != 0) server->port_ = requested;
  httplib::Server* http = server->server_.get();
  server->thread_ = std::thread([http] { http->listen_after_bind(); });
  std::string shown = host;
  if (shown.empty() || shown == "0.0.0.0" || shown == "::") shown = "localhost";
  if (absl::StrContains(shown, ':')) shown = absl::StrCat("[", shown, "]");
  server->url_ = absl::StrCat(tls ? "https://" : "http://", shown, ":", server->port_, "/");
  return server;
}

ConsoleServer::~ConsoleServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void ConsoleServer::SetGateway(std::shared_ptr<const JsonGateway> gateway) {
  absl::MutexLock lock(&mu_);
  gateway_ = std::move(gateway);
}

void ConsoleServer::SetLeader(const std::string& leader) {
  absl::MutexLock lock(&mu_);
  leader_ = leader;
}

void ConsoleServer::Route() {
  httplib::Headers headers = {{"Content-Security-Policy", kContentSecurityPolicy},
                              {"X-Content-Type-Options", "nosniff"},
                              {"X-Frame-Options", "DENY"},
                              {"Referrer-Policy", "no-referrer"},
                              {"Cross-Origin-Resource-Policy", "same-origin"}};
  if (!options_.tls_cert_file.empty()) {
    headers.emplace("Strict-Transport-Security", "max-age=31536000");
  }
  server_->set_default_headers(std::move(headers));
  server_->set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  server_->set_read_timeout(30);
  server_->set_write_timeout(30);
  server_->set_keep_alive_timeout(30);
  // What the library answers itself (413, 404, 400), as JSON under /api/, text elsewhere.
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request& request, httplib::Response& response) {
        if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string message =
            response.status == 413   ? "the request body is over --console_max_body_bytes"
            : response.status == 404 ? "no such page or call"
                                     : absl::StrCat("HTTP ", response.status);
        if (absl::StartsWith(request.path, "/api/")) {
          SetJson(response, response.status, JsonError(CodeOfHttp(response.status), message));
        } else {
          response.set_content(message + "\n", "text/plain; charset=utf-8");
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  server_->Post("/api/v1/.*", [this](const httplib::Request& request, httplib::Response& response) {
    ServeApi(request, response);
  });
  server_->Get("/api/v1/.*", [](const httplib::Request&, httplib::Response& response) {
    response.set_header("Allow", "POST");
    SetJson(response, 405,
            JsonError(grpc::StatusCode::UNIMPLEMENTED,
                      "call with POST and the request as JSON in the body"));
  });
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& response) {
    bool leading;
    {
      absl::MutexLock lock(&mu_);
      leading = gateway_ != nullptr;
    }
    response.status = leading ? 200 : 503;
    response.set_header("Cache-Control", "no-store");
    response.set_content(leading ? "leading\n" : "standing by\n", "text/plain; charset=utf-8");
  });
  server_->Get(".*", [this](const httplib::Request& request, httplib::Response& response) {
    ServeAsset(request, response);
  });
}

void ConsoleServer::ServeAsset(const httplib::Request& request, httplib::Response& response) {
  const ConsoleAsset* asset = FindConsoleAsset(request.path);
  if (asset == nullptr) {
    response.status = 404;
    response.set_content("no such page\n", "text/plain; charset=utf-8");
    return;
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_header("ETag", asset->etag);
  if (request.get_header_value("If-None-Match") == asset->etag) {
    response.status = 304;
    return;
  }
  response.set_content(std::string(asset->body), std::string(asset->content_type));
}

void ConsoleServer::ServeApi(const httplib::Request& request, httplib::Response& response) {
  const std::string name = request.path.substr(sizeof("/api/v1/") - 1);
  absl::StatusOr<JsonMethod> method = JsonGateway::Find(name);
  if (!method.ok()) {
    SetJsonError(response, grpc::StatusCode::NOT_FOUND, method.status().message());
    return;
  }
  // The credential: a bearer token in the header (never a cookie).
  std::string bearer;
  if (request.has_header("Authorization")) {
    const std::string authorization = request.get_header_value("Authorization");
    absl::string_view rest = authorization;
    if (!absl::ConsumePrefix(&rest, "Bearer ") || absl::StripAsciiWhitespace(rest).empty()) {
      response.set_header("WWW-Authenticate", "Bearer");
      SetJsonError(response, grpc::StatusCode::UNAUTHENTICATED,
                   "Authorization: give \"Bearer TOKEN\"");
      return;
    }
    bearer = std::string(absl::StripAsciiWhitespace(rest));
  }
  // Started under the lock that SetGateway takes to change the gateway: once it has let one go,
  // every call of it has started (and is counted by it: JsonGateway::WaitForCalls).
  absl::StatusOr<std::unique_ptr<JsonCall>> started = absl::UnavailableError("standing by");
  std::string leader;
  bool standing_by;
  {
    absl::ReaderMutexLock lock(&mu_);
    standing_by = gateway_ == nullptr;
    if (!standing_by) started = gateway_->Start(*method, request.body, bearer);
    leader = leader_;
  }
  if (standing_by) {
    response.set_header("Retry-After", "1");
    SetJsonError(response, grpc::StatusCode::UNAVAILABLE,
                 leader.empty()
                     ? "this coordinator stands by and no coordinator leads at the "
                       "moment: try again shortly"
                     : absl::StrCat("this coordinator stands by; the leader serves at ", leader));
    return;
  }
  if (!started.ok()) {
    const bool credential = started.status().code() == absl::StatusCode::kUnauthenticated;
    if (credential) response.set_header("WWW-Authenticate", "Bearer");
    SetJsonError(
        response,
        credential ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::INVALID_ARGUMENT,
        started.status().message());
    return;
  }
  // The first answer decides the status: a call that ends without one is an error (or, for a
  // stream, an empty 200); otherwise a unary call's answer is the body, and a stream's answers
  // follow it a line each, with a last line {"error": ...} if it ends in one.
  std::shared_ptr<JsonCall> call = *std::move(started);
  std::string first;
  JsonCall::Next next;
  while ((next = call->Read(&first, kStreamHeartbeat)) == JsonCall::Next::kQuiet) {
  }
  if (next == JsonCall::Next::kEnd) {
    const grpc::Status status = call->Finish();
    if (!status.ok()) {
      SetJsonError(response, status.error_code(), status.error_message());
    } else if (method->server_streaming) {
      response.set_header("Cache-Control", "no-store");
      response.set_content("", "application/x-ndjson");
    } else {
      SetJson(response, 200, "{}");
    }
    return;
  }
  if (!method->server_streaming) {
    call->Finish().IgnoreError();
    SetJson(response, 200, first);
    return;
  }
  response.set_header("Cache-Control", "no-store");
  response.set_header("X-Accel-Buffering", "no");
  response.set_chunked_content_provider(
      "application/x-ndjson", [call, first](size_t, httplib::DataSink& sink) {
        bool open = sink.write(first.data(), first.size()) && sink.write("\n", 1);
        std::string message;
        while (open) {
          const JsonCall::Next next = call->Read(&message, kStreamHeartbeat);
          if (next == JsonCall::Next::kEnd) break;
          open = next == JsonCall::Next::kMessage
                     ? sink.write(message.data(), message.size()) && sink.write("\n", 1)
                     : sink.write("\n", 1);
        }
        if (!open) {
          call->Cancel();
          call->Finish().IgnoreError();
          return false;
        }
        const grpc::Status status = call->Finish();
        if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
          const std::string error = absl::StrCat(
              "{\"error\": ", JsonError(status.error_code(), status.error_message()), "}\n");
          sink.write(error.data(), error.size());
        }
        sink.done();
        return true;
      });
}

}  // namespace trainyard
