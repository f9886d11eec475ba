// Inputs built to hurt, each answered with a clear error and nothing else: no crash, no hang, no
// allocation of what the input claims (issue list in docs/testing.md). The fuzz targets run the
// same bytes (tests/fuzz/corpus/), under the sanitizers.

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/formats/safetensors.h"
#include "common/formats/torchscript_archive.h"
#include "common/json_fields.h"
#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

std::string Le(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return out;
}

// What nlohmann's value() throws on (a field of another type, a value that is no object) gives
// the fallback instead: a JSON file or message from outside cannot end the process.
TEST(HostileInputsTest, JsonFieldsOfAnotherTypeGiveTheFallback) {
  const nlohmann::json object = nlohmann::json::parse(
      R"({"format": {"name": "x"}, "size": "12", "big": 18446744073709551615, "ok": 5,
          "name": "n"})");
  EXPECT_EQ(JsonString(object, "format", "none"), "none");
  EXPECT_EQ(JsonString(object, "name"), "n");
  EXPECT_EQ(JsonInt(object, "size", -1), -1);
  EXPECT_EQ(JsonInt(object, "big", -1), -1);
  EXPECT_EQ(JsonInt(object, "ok", -1), 5);
  EXPECT_EQ(JsonInt(nlohmann::json::array({1}), "ok", -1), -1);
  EXPECT_EQ(JsonString(nlohmann::json("text"), "ok"), "");
  EXPECT_EQ(JsonField(object, "missing", nlohmann::json::array()), nlohmann::json::array());
}

// A typed field takes only a value of its kind that fits: never a cast of 3e72 to int, of -1 to
// an unsigned, of 300 to a byte.
TEST(HostileInputsTest, TypedFieldsTakeOnlyValuesOfTheirKindThatFit) {
  nlohmann::json object = nlohmann::json::parse(
      R"({"huge": 3.3e72, "minus": -1, "wide": 300, "flag": 1, "ratio": 2, "big": 4294967296})");
  object["signed"] = static_cast<int64_t>(7);  // stored signed, as a program builds it
  int i = 5;
  EXPECT_FALSE(ReadField(object, "huge", i));
  EXPECT_FALSE(ReadField(object, "big", i));
  EXPECT_EQ(i, 5);
  uint32_t u = 5;
  EXPECT_FALSE(ReadField(object, "minus", u));
  EXPECT_TRUE(ReadField(object, "signed", u));
  EXPECT_EQ(u, 7u);
  uint64_t wide = 0;
  EXPECT_TRUE(ReadField(object, "signed", wide));
  EXPECT_EQ(wide, 7u);
  uint8_t byte = 0;
  EXPECT_FALSE(ReadField(object, "wide", byte));
  bool flag = false;
  EXPECT_FALSE(ReadField(object, "flag", flag));
  double ratio = 0;
  EXPECT_TRUE(ReadField(object, "ratio", ratio));
  EXPECT_EQ(ratio, 2.0);
  std::string text;
  EXPECT_FALSE(ReadField(object, "ratio", text));
  EXPECT_FALSE(ReadField(nlohmann::json::array({1}), "ratio", ratio));
}
TEST(HostileInputsTest, ASpecNestedAHundredThousandDeepIsRefused) {
  const std::string yaml =
      absl::StrCat("name: deep\nmodel: ", std::string(100000, '['), std::string(100000, ']'), "\n");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("line 2"));
}

TEST(HostileInputsTest, AYamlAliasBombIsRefusedWithoutExpanding) {
  // model.args.hidden: nine lists of nine of ... twelve levels deep, each level defined once and
  // aliased eight times: 9^12 numbers, were the aliases walked; 654 bytes of YAML.
  std::string list = "&a [1, 1, 1, 1, 1, 1, 1, 1, 1]";
  std::string previous = "a";
  for (int i = 1; i <= 11; ++i) {
    const std::string name = absl::StrCat("b", i);
    std::string next = absl::StrCat("&", name, " [", list);
    for (int j = 0; j < 8; ++j) absl::StrAppend(&next, ", *", previous);
    list = next + "]";
    previous = name;
  }
  const std::string yaml =
      absl::StrCat("name: bomb\nmodel:\n  builtin: mlp\n  args:\n    inputs: 4\n    hidden: ", list,
                   "\n    classes: 2\ndata: {synthetic: {samples: 64}}\n");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("model.args.hidden"));
}

TEST(HostileInputsTest, ASafetensorsHeaderClaimingATerabyteIsRefusedUnread) {
  const std::string file = Le(uint64_t{1} << 40, 8) + "{}";
  absl::StatusOr<uint64_t> size = SafetensorsHeaderSize(file);
  EXPECT_FALSE(size.ok() && *size == (uint64_t{1} << 40) &&
               DecodeSafetensorsHeader(file, static_cast<int64_t>(file.size())).ok());
  absl::StatusOr<SafetensorsFile> decoded = DecodeSafetensors(file);
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("header size"));
}

TEST(HostileInputsTest, ATensorShapeThatOverflowsIsRefused) {
  const std::string header =
      R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})";
  const std::string file = Le(header.size(), 8) + header + std::string(4, '\0');
  absl::StatusOr<SafetensorsFile> decoded = DecodeSafetensors(file);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("tensor 'x'"));
}

TEST(HostileInputsTest, AZipWhoseCentralDirectoryLiesIsRefused) {
  // The end record claims 65,535 entries in a directory that starts past the end of the file.
  const std::string eocd = Le(0x06054b50, 4) + Le(0, 2) + Le(0, 2) + Le(65535, 2) + Le(65535, 2) +
                           Le(0xffffff00, 4) + Le(0x7ffffff0, 4) + Le(0, 2);
  const std::string archive = Le(0x04034b50, 4) + std::string(26, '\0') + eocd;
  auto read = [&archive](int64_t offset, int64_t length) -> absl::StatusOr<std::string> {
    if (offset < 0 || offset > static_cast<int64_t>(archive.size())) {
      return absl::OutOfRangeError("past the end");
    }
    return archive.substr(offset, length);
  };
  absl::StatusOr<TorchScriptNeeds> needs =
      ReadTorchScriptNeeds(static_cast<int64_t>(archive.size()), read);
  ASSERT_FALSE(needs.ok());
  EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument) << needs.status();
  EXPECT_THAT(std::string(needs.status().message()), HasSubstr("not a TorchScript archive"));
}

}  // namespace
}  // namespace trainyard
