#ifndef TRAINYARD_SERVER_API_SEARCH_SERVICE_H_
#define TRAINYARD_SERVER_API_SEARCH_SERVICE_H_

#include "server/api/call_gate.h"
#include "server/searches/search_manager.h"
#include "trainyard/v1/search_service.grpc.pb.h"

namespace trainyard {

// gRPC SearchService over SearchManager: admits the call (people only; users reach only their
// own searches), calls the manager, maps its status. `manager` and `gate` must outlive the
// service. Thread-safe.
class SearchServiceImpl final : public trainyard::v1::SearchService::Service {
 public:
  SearchServiceImpl(SearchManager& manager, CallGate& gate) : manager_(manager), gate_(gate) {}

  grpc::Status SubmitSearch(grpc::ServerContext* context,
                            const trainyard::v1::SubmitSearchRequest* request,
                            trainyard::v1::Search* response) override;
  grpc::Status GetSearch(grpc::ServerContext* context,
                         const trainyard::v1::GetSearchRequest* request,
                         trainyard::v1::Search* response) override;
  grpc::Status ListSearches(grpc::ServerContext* context,
                            const trainyard::v1::ListSearchesRequest* request,
                            trainyard::v1::ListSearchesResponse* response) override;
  grpc::Status CancelSearch(grpc::ServerContext* context,
                            const trainyard::v1::CancelSearchRequest* request,
                            trainyard::v1::Search* response) override;
  grpc::Status ExtendSearch(grpc::ServerContext* context,
                            const trainyard::v1::ExtendSearchRequest* request,
                            trainyard::v1::Search* response) override;

 private:
  // Admit for people, then PERMISSION_DENIED unless the caller may see search `id`.
  absl::StatusOr<Principal> AdmitForSearch(const grpc::ServerContext& context,
                                           const google::protobuf::Message& request,
                                           absl::string_view rpc, absl::string_view id);

  SearchManager& manager_;
  CallGate& gate_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_SEARCH_SERVICE_H_
