#include "common/sha256.h"

#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, BinaryDataWithNuls) {
  const std::string data("\0\x01\xff\0", 4);
  EXPECT_EQ(Sha256Hex(data).size(), 64u);
  EXPECT_NE(Sha256Hex(data), Sha256Hex(std::string("\0\x01\xff", 3)));
}

TEST(Sha256Test, IncrementalEqualsOneShotAndStartsOverAfterADigest) {
  const std::string data = std::string(1000000, 'a') + "tail";
  Sha256 hash;
  for (size_t at = 0; at < data.size(); at += 77777) hash.Update(data.substr(at, 77777));
  EXPECT_EQ(hash.HexDigest(), Sha256Hex(data));
  hash.Update("abc");
  EXPECT_EQ(hash.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hash.HexDigest(), Sha256Hex(""));
}

}  // namespace
}  // namespace trainyard
