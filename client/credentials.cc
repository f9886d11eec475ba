#include "client/credentials.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace trainyard::cli {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

bool Readable(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

}  // namespace

std::string LocalCredentialsDir(absl::string_view address) {
  std::string base = Env("XDG_CONFIG_HOME");
  if (base.empty()) base = absl::StrCat(Env("HOME"), "/.config");
  return absl::StrCat(base, "/trainyard/clusters/",
                      absl::StrReplaceAll(address, {{":", "_"}, {"/", "_"}, {"[", ""}, {"]", ""}}));
}

absl::StatusOr<ClientCredentials> ResolveCredentials(absl::string_view address,
                                                     const ParsedArgs& args) {
  ClientCredentials c;
  const std::string local = LocalCredentialsDir(address);
  std::string token_file = args.Get("token-file");
  c.token = token_file.empty() ? Env("TRAINYARD_TOKEN") : "";
  if (token_file.empty() && c.token.empty()) {
    token_file = Env("TRAINYARD_TOKEN_FILE");
    if (token_file.empty() && Readable(local + "/token")) token_file = local + "/token";
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadCredentialFile(token_file);
    if (!token.ok()) return token.status();
    c.token = *std::move(token);
  }
  c.ca_file = args.Get("ca", Env("TRAINYARD_CA_FILE"));
  if (c.ca_file.empty() && Readable(local + "/ca.pem")) c.ca_file = local + "/ca.pem";
  c.cert_file = args.Get("cert", Env("TRAINYARD_CERT_FILE"));
  c.key_file = args.Get("key", Env("TRAINYARD_KEY_FILE"));
  c.server_name = args.Get("tls-server-name", Env("TRAINYARD_TLS_SERVER_NAME"));
  c.insecure = args.Has("insecure") || Env("TRAINYARD_INSECURE") == "1";
  return c;
}

}  // namespace trainyard::cli
