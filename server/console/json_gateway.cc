#include "server/console/json_gateway.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rpc/credentials.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using google::protobuf::Message;

// The services people use; agents' and tasks' are gRPC only.
constexpr const char* kServices[] = {"JobService", "SearchService", "AdminService"};
constexpr char kPackage[] = "trainyard.v1";

// Unary calls end within this; streams (WatchJob, GetJobLogs following) last as long as the
// client reads.
constexpr int kUnaryDeadlineSeconds = 60;

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

bool FromBuffer(const grpc::ByteBuffer& buffer, Message* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return message->ParseFromString(bytes);
}

}  // namespace

int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    default:
      return 500;
  }
}

std::string JsonError(grpc::StatusCode code, absl::string_view message) {
  // gRPC's codes are absl's, number for number: their names as absl spells them.
  const nlohmann::json error = {
      {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))},
      {"message", std::string(message)}};
  // Bytes that are not UTF-8 (a message may quote a job's output) become U+FFFD.
  return error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<JsonMethod> JsonGateway::Find(absl::string_view name) {
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '/');
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  if (parts.size() == 2) {
    for (const char* service : kServices) {
      if (parts[0] != service) continue;
      const google::protobuf::ServiceDescriptor* s =
          pool->FindServiceByName(absl::StrCat(kPackage, ".", service));
      const google::protobuf::MethodDescriptor* m =
          s == nullptr ? nullptr : s->FindMethodByName(std::string(parts[1]));
      if (m == nullptr || m->client_streaming()) break;
      return JsonMethod{m, absl::StrCat("/", s->full_name(), "/", m->name()), m->server_streaming(),
                        m->name() != "GetJobMetrics"};
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no call '", name,
                   "': the API offers JobService, SearchService and AdminService calls as "
                   "POST /api/v1/SERVICE/METHOD (docs/user-guide.md, \"The JSON API\")"));
}

absl::StatusOr<std::unique_ptr<JsonCall>> JsonGateway::Start(const JsonMethod& method,
                                                             absl::string_view json,
                                                             const std::string& bearer) const {
  if (!IsTokenText(bearer)) {
    return absl::UnauthenticatedError(
        "the bearer token holds a character no token has (tokens are printable ASCII)");
  }
  google::protobuf::MessageFactory* factory = google::protobuf::MessageFactory::generated_factory();
  std::unique_ptr<Message> request(factory->GetPrototype(method.method->input_type())->New());
  if (!json.empty()) {
    google::protobuf::util::JsonParseOptions parse;
    parse.ignore_unknown_fields = false;
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(std::string(json), request.get(), parse);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("the body is not a ",
                                                     method.method->input_type()->name(),
                                                     " in JSON: ", std::string(parsed.message())));
    }
  }
  std::unique_ptr<JsonCall> call(new JsonCall());
  call->gateway_ = shared_from_this();
  {
    absl::MutexLock lock(&mu_);
    ++calls_;
  }
  call->method_ = method.method;
  call->print_defaults_ = method.print_defaults;
  call->stub_ = std::make_unique<grpc::GenericStub>(channel_);
  if (!bearer.empty()) call->context_.AddMetadata("authorization", absl::StrCat("Bearer ", bearer));
  if (!method.server_streaming) {
    call->context_.set_deadline(
        absl::ToChronoTime(RealClock::Get().Now() + absl::Seconds(kUnaryDeadlineSeconds)));
  }
  call->call_ = call->stub_->PrepareCall(&call->context_, method.path, &call->cq_);
  call->call_->StartCall(nullptr);
  bool open = call->Await();
  if (open) {
    call->call_->Write(ToBuffer(request->SerializeAsString()), nullptr);
    open = call->Await();
  }
  if (open) {
    call->call_->WritesDone(nullptr);
    open = call->Await();
  }
  // A call that failed to start ends at its first Read, and Finish says why.
  return call;
}

bool JsonCall::Await() {
  void* tag = nullptr;
  bool ok = false;
  return cq_.Next(&tag, &ok) && ok;
}

JsonCall::Next JsonCall::Read(std::string* json, absl::Duration wait) {
  if (ended_) return Next::kEnd;
  if (!reading_) {
    call_->Read(&buffer_, nullptr);
    reading_ = true;
  }
  void* tag = nullptr;
  bool ok = false;
  const grpc::CompletionQueue::NextStatus next =
      cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(RealClock::Get().Now() + wait));
  if (next == grpc::CompletionQueue::TIMEOUT) return Next::kQuiet;
  reading_ = false;
  if (next != grpc::CompletionQueue::GOT_EVENT || !ok) {
    ended_ = true;
    return Next::kEnd;
  }
  google::protobuf::MessageFactory* factory = google::protobuf::MessageFactory::generated_factory();
  std::unique_ptr<Message> response(factory->GetPrototype(method_->output_type())->New());
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = print_defaults_;
  json->clear();
  if (!FromBuffer(buffer_, response.get()) ||
      !google::protobuf::util::MessageToJsonString(*response, json, print).ok()) {
    undecodable_ = true;
    Cancel();
    return Read(json, wait);
  }
  return Next::kMessage;
}

void JsonCall::Cancel() { context_.TryCancel(); }

grpc::Status JsonCall::Finish() {
  grpc::Status status;
  if (finished_) return status;
  finished_ = true;
  while (!ended_) {  // answers nobody reads any more
    std::string ignored;
    Cancel();
    if (Read(&ignored, absl::Seconds(10)) == Next::kQuiet) break;
  }
  call_->Finish(&status, nullptr);
  Await();
  if (undecodable_) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("a ", method_->output_type()->name(),
                                     " from the coordinator could not be written as JSON"));
  }
  return status;
}

JsonCall::~JsonCall() {
  if (!finished_) {
    Cancel();
    Finish();
  }
  cq_.Shutdown();
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
  }
  call_.reset();
  stub_.reset();  // its copy of the channel goes before the gateway hears the call is over
  absl::MutexLock lock(&gateway_->mu_);
  --gateway_->calls_;
}

bool JsonGateway::WaitForCalls(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

}  // namespace trainyard
