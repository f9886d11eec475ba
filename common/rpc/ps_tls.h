#ifndef TRAINYARD_COMMON_RPC_PS_TLS_H_
#define TRAINYARD_COMMON_RPC_PS_TLS_H_

// The TLS material of parameter servers, as the worker agent hands it to its trainers
// (worker/agent/main.cc: --ps_tls_cert, --ps_tls_key, --ps_tls_server_name, --ca_file): a shard
// serves TLS with the certificate and key; a rank verifies a shard that serves TLS against the
// cluster's CA. The agent sets these variables and the trainer reads them: their one home.

#include <cstdlib>
#include <string>

namespace trainyard {

// The shard's PEM certificate and key (file paths; set for shard tasks only).
inline constexpr char kPsTlsCertEnv[] = "TRAINYARD_PS_TLS_CERT";
inline constexpr char kPsTlsKeyEnv[] = "TRAINYARD_PS_TLS_KEY";
// The name the shards' certificates carry, when not the host a shard is reached at.
inline constexpr char kPsTlsServerNameEnv[] = "TRAINYARD_PS_TLS_SERVER_NAME";
// The cluster's CA, the coordinator's too.
inline constexpr char kCaFileEnv[] = "TRAINYARD_CA_FILE";

struct PsTls {
  std::string cert_file;    // a shard's: serve TLS with it (with key_file)
  std::string key_file;     //
  std::string ca_file;      // a rank's: the CA that signed the shards' certificates
  std::string server_name;  // a rank's: the name they carry, when not the shard's host

  // From the variables above; unset ones are empty.
  static PsTls FromEnvironment() {
    auto env = [](const char* name) {
      const char* value = std::getenv(name);
      return std::string(value != nullptr ? value : "");
    };
    PsTls tls;
    tls.cert_file = env(kPsTlsCertEnv);
    tls.key_file = env(kPsTlsKeyEnv);
    tls.ca_file = env(kCaFileEnv);
    tls.server_name = env(kPsTlsServerNameEnv);
    return tls;
  }
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RPC_PS_TLS_H_
