#ifndef TRAINYARD_COMMON_EXIT_CODES_H_
#define TRAINYARD_COMMON_EXIT_CODES_H_

namespace trainyard {

// How a trainer process ends. The agent reports the code; the coordinator classifies it
// (user error vs infrastructure) for its restart policy. A trainer that fails also writes a
// one-line cause to the file kTerminationMessageFile in its working directory.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;        // a bug or an unexpected error
inline constexpr int kExitUserError = 2;       // bad spec, data, model: retrying will not help
inline constexpr int kExitInfrastructure = 3;  // object store, coordinator, peers: may succeed
inline constexpr int kExitPreempted = 4;       // stopped on request after saving

inline constexpr char kTerminationMessageFile[] = "termination-message";

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_EXIT_CODES_H_
