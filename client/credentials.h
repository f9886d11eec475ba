#ifndef TRAINYARD_CLIENT_CREDENTIALS_H_
#define TRAINYARD_CLIENT_CREDENTIALS_H_

// How the CLI finds what to present to a coordinator.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/args.h"
#include "common/rpc/channel.h"

namespace trainyard::cli {

// Where `trainyard up` leaves the credentials of the local cluster at `address`, and where the
// CLI looks for them: $XDG_CONFIG_HOME (else ~/.config)/trainyard/clusters/HOST_PORT/, holding
// `token` and, with TLS, `ca.pem`.
std::string LocalCredentialsDir(absl::string_view address);

// The credentials for `address`, each from the first place that has it:
//   token:  --token-file, $TRAINYARD_TOKEN, $TRAINYARD_TOKEN_FILE, LocalCredentialsDir/token
//   CA:     --ca, $TRAINYARD_CA_FILE, LocalCredentialsDir/ca.pem
//   client certificate: --cert/--key, $TRAINYARD_CERT_FILE/$TRAINYARD_KEY_FILE
//   TLS name: --tls-server-name, $TRAINYARD_TLS_SERVER_NAME; plaintext beyond loopback:
//   --insecure, $TRAINYARD_INSECURE=1.
// INVALID_ARGUMENT naming a file that cannot be read.
absl::StatusOr<ClientCredentials> ResolveCredentials(absl::string_view address,
                                                     const ParsedArgs& args);

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_CREDENTIALS_H_
