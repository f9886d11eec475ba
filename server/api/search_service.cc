#include "server/api/search_service.h"

#include <utility>
#include <vector>

#include "common/rpc/grpc_status.h"

namespace trainyard {

using grpc::ServerContext;
using grpc::Status;

absl::StatusOr<Principal> SearchServiceImpl::AdmitForSearch(
    const ServerContext& context, const google::protobuf::Message& request, absl::string_view rpc,
    absl::string_view id) {
  absl::StatusOr<Principal> caller = gate_.Admit(context, request, Audience::kPeople, rpc);
  if (!caller.ok() || caller->admin()) return caller;
  absl::StatusOr<std::string> owner = manager_.Owner(id);
  if (!owner.ok()) return owner.status();
  if (absl::Status s = AllowSearch(*caller, id, *owner); !s.ok()) return s;
  return caller;
}

Status SearchServiceImpl::SubmitSearch(ServerContext* context,
                                       const v1::SubmitSearchRequest* request,
                                       v1::Search* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kPeople, "SubmitSearch");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Search> search = manager_.Submit(request->spec_yaml(), &*caller);
  if (!search.ok()) return ToGrpcStatus(search.status());
  *response = *std::move(search);
  return Status::OK;
}

Status SearchServiceImpl::GetSearch(ServerContext* context, const v1::GetSearchRequest* request,
                                    v1::Search* response) {
  absl::StatusOr<Principal> caller = AdmitForSearch(*context, *request, "GetSearch", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Search> search = manager_.Get(request->id());
  if (!search.ok()) return ToGrpcStatus(search.status());
  *response = *std::move(search);
  return Status::OK;
}

Status SearchServiceImpl::ListSearches(ServerContext* context,
                                       const v1::ListSearchesRequest* request,
                                       v1::ListSearchesResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kPeople, "ListSearches");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // Users list their own searches; admins everyone's.
  for (v1::Search& search : manager_.List(caller->admin() ? "" : caller->name)) {
    *response->add_searches() = std::move(search);
  }
  return Status::OK;
}

Status SearchServiceImpl::CancelSearch(ServerContext* context,
                                       const v1::CancelSearchRequest* request,
                                       v1::Search* response) {
  absl::StatusOr<Principal> caller =
      AdmitForSearch(*context, *request, "CancelSearch", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Search> search =
      manager_.Cancel(request->id(), request->reason(), caller->name);
  if (!search.ok()) return ToGrpcStatus(search.status());
  *response = *std::move(search);
  return Status::OK;
}

Status SearchServiceImpl::ExtendSearch(ServerContext* context,
                                       const v1::ExtendSearchRequest* request,
                                       v1::Search* response) {
  absl::StatusOr<Principal> caller =
      AdmitForSearch(*context, *request, "ExtendSearch", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Search> search = manager_.Extend(request->id(), request->max_trials());
  if (!search.ok()) return ToGrpcStatus(search.status());
  *response = *std::move(search);
  return Status::OK;
}

}  // namespace trainyard
