#ifndef TRAINYARD_COMMON_SHA256_H_
#define TRAINYARD_COMMON_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

struct evp_md_ctx_st;

namespace trainyard {

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

// Raw (32-byte) HMAC-SHA256 of `data` under `key`.
std::string HmacSha256(absl::string_view key, absl::string_view data);

// SHA-256 of data given in pieces. Not thread-safe, not copyable.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view data);
  // Lower-case hex digest of everything given to Update since construction or the last call;
  // the hash then starts over.
  std::string HexDigest();

 private:
  evp_md_ctx_st* ctx_;
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SHA256_H_
