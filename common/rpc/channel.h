#ifndef TRAINYARD_COMMON_RPC_CHANNEL_H_
#define TRAINYARD_COMMON_RPC_CHANNEL_H_

// Client channels to the coordinator: TLS verified against a CA, an optional client certificate,
// and a bearer credential sent with every call. Used by the CLI, the worker agent and trainers.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainyard {

struct ClientCredentials {
  // PEM file of the CA(s) that signed the coordinator's certificate. Set: the channel uses TLS.
  std::string ca_file;
  // The name the coordinator's certificate must carry when it differs from the address's host.
  std::string server_name;
  // PEM client certificate and key (both or neither; needs ca_file).
  std::string cert_file;
  std::string key_file;
  // A bearer token or task credential, sent as "authorization: Bearer ..." on every call.
  std::string token;
  // Allow plaintext to an address that is not loopback (the token then travels in clear).
  bool insecure = false;
};

// True for "127.0.0.1:P", "[::1]:P", "localhost:P" and other 127/8 addresses; for a list, when
// every address in it is.
bool IsLoopbackAddress(absl::string_view address);

// Splits "HOST:PORT" or "[IPV6]:PORT" into its host (without brackets) and port.
// INVALID_ARGUMENT naming the address when either is missing.
absl::Status SplitHostPort(absl::string_view address, std::string* host, std::string* port);

// The addresses of a comma-separated list of coordinators ("a:7070,b:7070"), trimmed.
std::vector<std::string> CoordinatorAddresses(absl::string_view list);

// The gRPC target for a coordinator address or list: one address as it is; several resolved now
// (host names to all their addresses) into one "ipv4:A:P,B:P" (or ipv6:) target. INVALID_ARGUMENT
// for an address that is not HOST:PORT, UNAVAILABLE when none resolves (those that do not are
// left out).
absl::StatusOr<std::string> CoordinatorTarget(absl::string_view list);

// A channel to `address` ("host:port", or a comma-separated list of the coordinators of one
// cluster, see CoordinatorTarget; with TLS each must then present a certificate for the first
// one's host name, or for `credentials.server_name`) with `credentials` and `args`. A list's
// channel connects to every coordinator and sends calls only to one whose health service says
// SERVING (gRPC's round_robin with client-side health checks): the leader, since standbys answer
// NOT_SERVING; calls wait for one or fail UNAVAILABLE while none leads. Unless `own_poller` is
// false, such a channel has a thread of its own that keeps its connection attempts moving
// (channel.cc, ChannelPoller); a client whose calls all wait for the channel to be ready (the
// CLI's, given several coordinators) needs none. INVALID_ARGUMENT naming the file when a PEM
// file cannot be read, or when the address is not loopback and neither TLS nor `insecure` is set
// (nothing is sent then). Does not connect; thread-safe.
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewClientChannel(
    const std::string& address, const ClientCredentials& credentials,
    const grpc::ChannelArguments& args = grpc::ChannelArguments(), bool own_poller = true);

// What the coordinator's long-lived clients (agents, trainers) need of a channel: a reconnect
// backoff of at most 1 s (gRPC's default grows to two minutes: a coordinator back after a restart
// or a cut would not be reached again for that long), and keepalive pings on a connection silent
// for `ping_interval` (5 s by default; anything received puts the next ping off), answered within
// 5 s, so that a connection that died unheard (the coordinator's host cut off, then back) is
// found and replaced rather than waited on by calls until their deadlines. The agent pings less
// often (kAgentPingInterval). The coordinator accepts pings every kCoordinatorClientPingMs
// (coordinator_server.cc).
grpc::ChannelArguments CoordinatorClientArguments(
    absl::Duration ping_interval = absl::Milliseconds(5000));
// The agent's ping interval: an idle agent's connection carries nothing else for a long poll's
// wait, and its pings are what finds that connection dead while the coordinator is cut off (so
// that the agent reconnects as soon as the link is back, rather than when the coordinator's
// retransmissions, backing off, get through). 1,000 idle agents: about 67 pings a second.
inline constexpr absl::Duration kAgentPingInterval = absl::Seconds(15);
// What gRPC gives one connection attempt (TCP and TLS handshakes) at least: its
// GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is that minimum, not a backoff. At 100 ms, TLS handshakes on
// a busy machine failed ("Handshake read failed") and a CLI call with them; 2 s fits a busy
// handshake and still moves on from a frozen coordinator quickly.
inline constexpr int kMinConnectTimeoutMs = 2000;
// The shortest ping interval of a client of one coordinator.
inline constexpr int kCoordinatorClientPingMs = 5000;
// Given several coordinators (a leader and standbys), a client pings each connection silent for
// 2 s and gives it up when the ping is not answered within 1 s, whatever the args say: a frozen
// leader (its lease is 3 s by default) is left within 3 s of its last word, about when a standby
// takes over, instead of up to 20 s (docs/operations.md, "More than one coordinator"). The cost is
// an idle agent's ping every 2 s to each coordinator: 1,000 idle agents make 500 pings a second on
// each, at the 135 us a ping measured (docs/benchmarks.md) about 7 % of a core. The coordinators
// accept pings this often (kCoordinatorClientMinPingMs).
inline constexpr int kSeveralCoordinatorsPingMs = 2000;
inline constexpr int kSeveralCoordinatorsPingTimeoutMs = 1000;
// The shortest interval at which a coordinator accepts pings from a client.
inline constexpr int kCoordinatorClientMinPingMs = kSeveralCoordinatorsPingMs * 4 / 5;

// The coordinator's side: TLS with its certificate, and client certificates verified against
// client_ca_file when a client presents one (optional: tokens are the other way in).
struct ServerTls {
  std::string cert_file;       // PEM; empty: plaintext
  std::string key_file;        // PEM
  std::string client_ca_file;  // PEM; empty: client certificates are not asked for
};

// INVALID_ARGUMENT naming the file when one cannot be read, or the key without the certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NewServerCredentials(const ServerTls& tls);

// Reads a credential file: its first line, trimmed. INVALID_ARGUMENT naming the file when it
// cannot be read or is empty.
absl::StatusOr<std::string> ReadCredentialFile(const std::string& path);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RPC_CHANNEL_H_
