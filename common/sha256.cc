#include "common/sha256.h"

#include <openssl/evp.h>

#include <string>

namespace trainyard {

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  // EVP_Digest only fails on allocation failure, which we treat like any other OOM.
  EVP_Digest(data.data(), data.size(), digest, &digest_len, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(digest_len * 2);
  for (unsigned int i = 0; i < digest_len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

}  // namespace trainyard
