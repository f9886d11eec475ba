#include "common/formats/safetensors.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string Le64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// A file from a literal header and data section, as another writer might produce it.
std::string RawFile(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

template <typename T>
std::vector<T> Values(const TensorView& view) {
  std::vector<T> out(view.data.size() / sizeof(T));
  std::memcpy(out.data(), view.data.data(), view.data.size());
  return out;
}

// Every dtype, a scalar, an empty tensor, tensors not in name order.
struct Fixture {
  std::vector<float> w = {0, 0.5, 1, 1.5, 2, 2.5};
  std::vector<int64_t> labels = {-1, 0, 7, int64_t{1} << 40};
  std::vector<double> scalar = {3.25};
  std::vector<int32_t> i32 = {-5, 5};
  std::vector<int16_t> i16 = {-300, 300};
  std::vector<int8_t> i8 = {-7, 7};
  std::vector<uint8_t> u8 = {0, 128, 255};
  std::vector<uint8_t> flags = {1, 0};
  std::vector<uint16_t> f16 = {0x3e00, 0xc000};   // 1.5, -2.0
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000};  // 1.0, -2.0
  std::string w_bytes = Bytes(w), labels_bytes = Bytes(labels), scalar_bytes = Bytes(scalar),
              i32_bytes = Bytes(i32), i16_bytes = Bytes(i16), i8_bytes = Bytes(i8),
              u8_bytes = Bytes(u8), flags_bytes = Bytes(flags), f16_bytes = Bytes(f16),
              bf16_bytes = Bytes(bf16);

  std::vector<TensorView> Tensors() const {
    return {
        {"w", "F32", {2, 3}, w_bytes},         {"labels", "I64", {4}, labels_bytes},
        {"scalar", "F64", {}, scalar_bytes},   {"empty", "F32", {0, 5}, absl::string_view()},
        {"i32", "I32", {2}, i32_bytes},        {"i16", "I16", {2}, i16_bytes},
        {"i8", "I8", {2}, i8_bytes},           {"u8", "U8", {3}, u8_bytes},
        {"flags", "BOOL", {2}, flags_bytes},   {"half", "F16", {2}, f16_bytes},
        {"brain", "BF16", {1, 2}, bf16_bytes},
    };
  }
  std::map<std::string, std::string> Metadata() const { return {{"format", "pt"}, {"step", "42"}}; }
};

TEST(SafetensorsTest, DtypeSizes) {
  EXPECT_EQ(SafetensorsDtypeSize("F64"), 8);
  EXPECT_EQ(SafetensorsDtypeSize("F32"), 4);
  EXPECT_EQ(SafetensorsDtypeSize("F16"), 2);
  EXPECT_EQ(SafetensorsDtypeSize("BF16"), 2);
  EXPECT_EQ(SafetensorsDtypeSize("I64"), 8);
  EXPECT_EQ(SafetensorsDtypeSize("I32"), 4);
  EXPECT_EQ(SafetensorsDtypeSize("I16"), 2);
  EXPECT_EQ(SafetensorsDtypeSize("I8"), 1);
  EXPECT_EQ(SafetensorsDtypeSize("U8"), 1);
  EXPECT_EQ(SafetensorsDtypeSize("BOOL"), 1);
  EXPECT_EQ(SafetensorsDtypeSize("f32"), 0);
  EXPECT_EQ(SafetensorsDtypeSize("C64"), 0);
}

TEST(SafetensorsTest, RoundTripAllDtypes) {
  Fixture f;
  absl::StatusOr<std::string> encoded = EncodeSafetensors(f.Tensors(), f.Metadata());
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  // The data section starts 8-byte aligned.
  uint64_t header_size = 0;
  std::memcpy(&header_size, encoded->data(), 8);
  EXPECT_EQ(header_size % 8, 0u);

  absl::StatusOr<SafetensorsFile> decoded = DecodeSafetensors(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->metadata, f.Metadata());
  // Data order is the order given to the encoder.
  const std::vector<TensorView> given = f.Tensors();
  ASSERT_EQ(decoded->tensors.size(), given.size());
  for (size_t i = 0; i < given.size(); ++i) {
    EXPECT_EQ(decoded->tensors[i].name, given[i].name);
    EXPECT_EQ(decoded->tensors[i].dtype, given[i].dtype);
    EXPECT_EQ(decoded->tensors[i].shape, given[i].shape);
    EXPECT_EQ(decoded->tensors[i].data, given[i].data) << given[i].name;
  }
  // Views stay valid after the file is moved.
  SafetensorsFile moved = std::move(*decoded);
  const TensorView* w = moved.Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(Values<float>(*w), f.w);
  EXPECT_EQ(Values<int64_t>(*moved.Find("labels")), f.labels);
  EXPECT_EQ(moved.Find("empty")->data.size(), 0u);
  EXPECT_EQ(moved.Find("empty")->shape, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(moved.Find("scalar")->shape, std::vector<int64_t>{});
  EXPECT_EQ(moved.Find("missing"), nullptr);
}

TEST(SafetensorsTest, HeaderFollowedByTheTensorsIsTheEncodedFile) {
  Fixture f;
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(f.Tensors(), f.Metadata());
  ASSERT_TRUE(header.ok()) << header.status();
  std::string file = *header;
  for (const TensorView& t : f.Tensors()) file.append(t.data.data(), t.data.size());
  absl::StatusOr<std::string> encoded = EncodeSafetensors(f.Tensors(), f.Metadata());
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_TRUE(file == *encoded);
  EXPECT_EQ(header->size() % 8, 0u);
  EXPECT_EQ(EncodeSafetensorsHeader({{"a", "F32", {2}, std::string(4, 'x')}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, NoTensorsNoMetadata) {
  absl::StatusOr<std::string> encoded = EncodeSafetensors({}, {});
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  absl::StatusOr<SafetensorsFile> decoded = DecodeSafetensors(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->tensors.empty());
  EXPECT_TRUE(decoded->metadata.empty());
  // Metadata is left out of the header when empty.
  EXPECT_EQ(encoded->find("__metadata__"), std::string::npos);
}

TEST(SafetensorsTest, EncodeRejects) {
  const std::string four(4, 'x');
  EXPECT_EQ(
      EncodeSafetensors({{"a", "F32", {1}, four}, {"a", "F32", {1}, four}}, {}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors({{"a", "F128", {1}, four}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors({{"a", "F32", {2}, four}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors({{"a", "F32", {-1}, four}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors({{"__metadata__", "F32", {1}, four}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// JSON holds UTF-8 alone: a name or metadata in another encoding is refused, naming it, where it
// used to end the writer with an exception (found by fuzz_data_pack: a CSV tensor named "g\xe4").
TEST(SafetensorsTest, EncodeRejectsTextThatIsNotUtf8) {
  const std::string four(4, 'x');
  absl::StatusOr<std::string> named = EncodeSafetensors({{"g\xe4", "F32", {1}, four}}, {});
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(named.status().message(), "safetensors: tensor name 'g\\xe4' is not UTF-8");
  EXPECT_EQ(EncodeSafetensors({{"a", "F32", {1}, four}}, {{"k", "\xff"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors({{"a", "F32", {1}, four}}, {{"\xc3", "v"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(EncodeSafetensors({{"g\xc3\xa4", "F32", {1}, four}}, {{"k", "\xc3\xa4"}}).ok());
}

TEST(SafetensorsTest, AcceptsUnpaddedHeaderFromOtherWriters) {
  const std::string data = Bytes(std::vector<float>{1, 2});
  absl::StatusOr<SafetensorsFile> file =
      DecodeSafetensors(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(Values<float>(file->tensors[0]), (std::vector<float>{1, 2}));
}

struct BadCase {
  const char* what;
  std::string file;
  absl::StatusCode code;
};

TEST(SafetensorsTest, RejectsCorruptInput) {
  Fixture f;
  const std::string good = *EncodeSafetensors(f.Tensors(), f.Metadata());
  const std::string eight(8, 'd');
  const std::vector<BadCase> cases = {
      {"empty", "", absl::StatusCode::kDataLoss},
      {"shorter than the length", "\x10\0\0", absl::StatusCode::kDataLoss},
      {"header past the end", Le64(1000) + "{}", absl::StatusCode::kDataLoss},
      {"header size absurd", Le64(uint64_t{1} << 62) + "{}", absl::StatusCode::kInvalidArgument},
      {"truncated data", good.substr(0, good.size() - 1), absl::StatusCode::kDataLoss},
      {"truncated header", good.substr(0, 20), absl::StatusCode::kDataLoss},
      {"not json", RawFile("{not json", ""), absl::StatusCode::kInvalidArgument},
      {"not an object", RawFile("[1,2]", ""), absl::StatusCode::kInvalidArgument},
      {"tensor not an object", RawFile(R"({"a":1})", ""), absl::StatusCode::kInvalidArgument},
      {"no dtype", RawFile(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"unknown dtype", RawFile(R"({"a":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"no shape", RawFile(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"bad offsets", RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"negative offset",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"end before begin",
       RawFile(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"size does not match shape",
       RawFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"negative dimension",
       RawFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"fractional dimension",
       RawFile(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument},
      {"overlap",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               eight),
       absl::StatusCode::kInvalidArgument},
      {"data past the end",
       RawFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight),
       absl::StatusCode::kDataLoss},
      {"metadata not an object", RawFile(R"({"__metadata__":[1]})", ""),
       absl::StatusCode::kInvalidArgument},
      {"metadata value not a string", RawFile(R"({"__metadata__":{"step":42}})", ""),
       absl::StatusCode::kInvalidArgument},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<SafetensorsFile> file = DecodeSafetensors(c.file);
    EXPECT_EQ(file.status().code(), c.code) << c.what << ": " << file.status();
  }
}

// Interop with the format as Python writes and reads it, without the safetensors package:
// struct + json + numpy following the format description byte for byte.
class SafetensorsPythonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "/usr/bin/python3 with numpy is not available";
    }
    char tmpl[] = "/tmp/safetensors_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }

  // Runs `script` with the given arguments; returns its exit status and output.
  int RunPython(const std::string& script, const std::string& args, std::string* output) {
    const std::string script_path = dir_ + "/script.py";
    std::ofstream(script_path) << script;
    const std::string command =
        absl::StrCat("/usr/bin/python3 '", script_path, "' ", args, " 2>&1");
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return -1;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
    return pclose(pipe);
  }

  std::string dir_;
};

constexpr char kPythonWriter[] = R"PY(
import json, struct, sys
import numpy as np

tensors = [  # data order differs from name order on purpose
    ("weight", "F32", np.arange(6, dtype="<f4").reshape(2, 3) * 0.25),
    ("bias", "F64", np.array([-1.5, 2.5], dtype="<f8")),
    ("ids", "I64", np.array([1 << 40, -3], dtype="<i8")),
    ("small", "I16", np.array([-2, 3, 4], dtype="<i2")),
    ("mask", "BOOL", np.array([True, False, True])),
    ("half", "F16", np.array([0.5, -4.0], dtype="<f2")),
    ("nothing", "I32", np.zeros((0,), dtype="<i4")),
    ("bytes", "U8", np.array([[1, 2], [3, 255]], dtype="u1")),
]
header, blobs, offset = {}, [], 0
for name, dtype, array in tensors:
    raw = array.tobytes()
    header[name] = {"dtype": dtype, "shape": list(array.shape),
                    "data_offsets": [offset, offset + len(raw)]}
    blobs.append(raw)
    offset += len(raw)
header["__metadata__"] = {"format": "pt", "producer": "numpy"}
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
)PY";

TEST_F(SafetensorsPythonTest, ReadsWhatPythonWrites) {
  const std::string path = dir_ + "/py.safetensors";
  std::string output;
  ASSERT_EQ(RunPython(kPythonWriter, "'" + path + "'", &output), 0) << output;
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<SafetensorsFile> file = DecodeSafetensors(buffer.str());
  ASSERT_TRUE(file.ok()) << file.status();

  EXPECT_EQ(file->metadata,
            (std::map<std::string, std::string>{{"format", "pt"}, {"producer", "numpy"}}));
  std::vector<std::string> order;
  for (const TensorView& t : file->tensors) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"weight", "bias", "ids", "small", "mask", "half",
                                             "nothing", "bytes"}));
  const TensorView* weight = file->Find("weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->dtype, "F32");
  EXPECT_EQ(weight->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values<float>(*weight), (std::vector<float>{0, 0.25, 0.5, 0.75, 1, 1.25}));
  EXPECT_EQ(Values<double>(*file->Find("bias")), (std::vector<double>{-1.5, 2.5}));
  EXPECT_EQ(Values<int64_t>(*file->Find("ids")), (std::vector<int64_t>{int64_t{1} << 40, -3}));
  EXPECT_EQ(Values<int16_t>(*file->Find("small")), (std::vector<int16_t>{-2, 3, 4}));
  EXPECT_EQ(Values<uint8_t>(*file->Find("mask")), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(Values<uint16_t>(*file->Find("half")), (std::vector<uint16_t>{0x3800, 0xc400}));
  EXPECT_EQ(file->Find("nothing")->shape, (std::vector<int64_t>{0}));
  EXPECT_EQ(file->Find("nothing")->data.size(), 0u);
  EXPECT_EQ(file->Find("bytes")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values<uint8_t>(*file->Find("bytes")), (std::vector<uint8_t>{1, 2, 3, 255}));
}

constexpr char kPythonReader[] = R"PY(
import json, struct, sys
import numpy as np

blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
assert n % 8 == 0, "header not padded to 8"
header = json.loads(blob[8:8 + n].decode("utf-8"))
data = blob[8 + n:]
meta = header.pop("__metadata__")
assert meta == {"format": "pt", "step": "42"}, meta
# The checks the safetensors package makes: offsets contiguous from 0 to the end.
spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
pos = 0
for begin, end, name in spans:
    assert begin == pos, (name, begin, pos)
    pos = end
assert pos == len(data), (pos, len(data))
types = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
         "I8": "i1", "U8": "u1", "BOOL": "?", "BF16": "<u2"}
def get(name):
    e = header[name]
    begin, end = e["data_offsets"]
    return np.frombuffer(data[begin:end], dtype=types[e["dtype"]]).reshape(e["shape"])
assert (get("w") == np.array([[0, 0.5, 1], [1.5, 2, 2.5]], dtype="<f4")).all()
assert get("labels").tolist() == [-1, 0, 7, 1 << 40]
assert get("scalar").shape == () and float(get("scalar")) == 3.25
assert get("empty").shape == (0, 5)
assert get("i32").tolist() == [-5, 5]
assert get("i16").tolist() == [-300, 300]
assert get("i8").tolist() == [-7, 7]
assert get("u8").tolist() == [0, 128, 255]
assert get("flags").tolist() == [True, False]
assert get("half").tolist() == [1.5, -2.0]
bf = get("brain").astype("<u4") << 16
assert bf.view("<f4").tolist() == [[1.0, -2.0]]
print("ok")
)PY";

TEST_F(SafetensorsPythonTest, PythonReadsWhatWeWrite) {
  Fixture f;
  absl::StatusOr<std::string> encoded = EncodeSafetensors(f.Tensors(), f.Metadata());
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::string path = dir_ + "/ours.safetensors";
  std::ofstream(path, std::ios::binary) << *encoded;
  std::string output;
  EXPECT_EQ(RunPython(kPythonReader, "'" + path + "'", &output), 0) << output;
  EXPECT_NE(output.find("ok"), std::string::npos) << output;
}

}  // namespace
}  // namespace trainyard
