#ifndef TRAINYARD_WORKER_AGENT_LOCAL_ADDRESS_H_
#define TRAINYARD_WORKER_AGENT_LOCAL_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace trainyard {

// The address of this machine's interface that traffic to `host_port` (the coordinator,
// "HOST:PORT" or "[IPv6]:PORT") leaves from: what other machines of the same network reach this
// one at. Found as the kernel routes a connected UDP socket, without sending anything.
// INVALID_ARGUMENT for a malformed `host_port`, UNAVAILABLE when the host does not resolve or no
// route leads there.
absl::StatusOr<std::string> LocalAddressToward(const std::string& host_port);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_LOCAL_ADDRESS_H_
