// `trainyard data pack` against NumPy: arrays written by NumPy (python3-numpy) are packed, and
// the shards are read back by a reader written in Python from the safetensors format alone.

#include "client/data_pack.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/formats/shard_index.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/run_shell.h"
#include "tests/common/test_stores.h"

namespace trainyard::cli {
namespace {

using ::testing::HasSubstr;

using ::trainyard::testing::RunShell;

// Reads every shard of PREFIX with json + numpy, concatenates each tensor and compares it with
// the .npy file of the same name in DIR; prints the shards' metadata extremes of "y".
constexpr char kChecker[] = R"PY(
import glob, json, struct, sys
import numpy as np
prefix, folder = sys.argv[1], sys.argv[2]
dtypes = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}
parts, extremes = {}, []
for path in sorted(glob.glob(prefix + "-*.safetensors")):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    extremes.append((meta.get("trainyard.min.y"), meta.get("trainyard.max.y")))
    for name, info in header.items():
        b, e = info["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dtypes[info["dtype"]])
        parts.setdefault(name, []).append(a.reshape(info["shape"]))
for name, chunks in parts.items():
    want = np.load(folder + "/" + name + ".npy")
    got = np.concatenate(chunks)
    assert got.dtype == want.dtype.newbyteorder("<") or got.dtype == want.dtype, (name, got.dtype)
    assert np.array_equal(got, want), name
print("shards", len(extremes), "tensors", sorted(parts), "extremes", extremes)
)PY";

class DataPackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "data_pack.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ + "/check.py") << kChecker;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// The command line: a prefix relative to the current folder becomes an absolute one, so that the
// pattern it prints goes into a spec as it is, and `data inspect` reads a relative pattern too.
TEST_F(DataPackTest, TheCommandMakesARelativePrefixAbsolute) {
  auto [code, out] = RunShell(
      absl::StrCat("cd ", dir_, " && mkdir -p out && /usr/bin/python3 -c \"import numpy as np; ",
                   "np.save('x.npy', np.ones((10, 2), dtype=np.float32)); ",
                   "np.save('y.npy', np.arange(10))\" && ", TRAINYARD_CLI,
                   " data pack out/train x=x.npy y=y.npy"));
  ASSERT_EQ(code, 0) << out;
  const std::string absolute = std::filesystem::canonical(dir_).string() + "/out/train";
  EXPECT_THAT(out, HasSubstr(": " + absolute + "-*.safetensors"));
  std::tie(code, out) =
      RunShell(absl::StrCat("cd ", dir_, " && ", TRAINYARD_CLI, " data inspect 'out/train-*'"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr(absolute + "-00000.safetensors"));
}

// An unquoted pattern reaches the command as several files: it says to quote it.
TEST_F(DataPackTest, InspectOfSeveralFilesSaysToQuoteThePattern) {
  auto [code, out] = RunShell(
      absl::StrCat(TRAINYARD_CLI, " data inspect /d/train-0.safetensors /d/train-1.safetensors"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("takes one pattern or URI, got 2: put a pattern in quotes"));
}

TEST_F(DataPackTest, NumpyArraysBecomeShardsThatReadBackIdentically) {
  auto [code, out] = RunShell(absl::StrCat(
      "cd ", dir_, " && /usr/bin/python3 -c \"import numpy as np; r = np.random.default_rng(1); ",
      "np.save('x.npy', r.random((1000, 3, 2), dtype=np.float32)); ",
      "np.save('y.npy', r.integers(-2, 7, 1000)); ",
      "np.save('ids.npy', r.integers(0, 250, (1000, 4)).astype(np.uint8)); ",
      "np.save('h.npy', r.random(1000).astype(np.float16))\""));
  ASSERT_EQ(code, 0) << out;
  PackOptions options;
  options.prefix = dir_ + "/out/train";
  std::filesystem::create_directories(dir_ + "/out");
  for (const char* name : {"x", "y", "ids", "h"}) {
    options.tensors.push_back({name, absl::StrCat(dir_, "/", name, ".npy"), {}, ""});
  }
  options.shard_bytes = 16 * 1024;  // 24 + 8 + 4 + 2 bytes a sample: 431 samples a shard
  int64_t reported = 0;
  options.progress = [&](int64_t shards, int64_t) { reported = shards; };
  absl::StatusOr<PackResult> result = PackShards(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->shards.size(), 3u);
  EXPECT_EQ(reported, 3);
  EXPECT_EQ(result->samples, 1000);
  EXPECT_EQ(result->shards[0], dir_ + "/out/train-00000.safetensors");
  std::tie(code, out) =
      RunShell(absl::StrCat("/usr/bin/python3 ", dir_, "/check.py ", options.prefix, " ", dir_));
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("shards 3 tensors ['h', 'ids', 'x', 'y']"));
  // The index agrees: every shard has its samples, the extremes of y are per shard.
  auto index = IndexShards(EnvironmentStores(), options.prefix + "-*.safetensors");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->samples, 1000);
  EXPECT_EQ(index->shards[2].samples, 1000 - 2 * 431);
  EXPECT_EQ(index->shards[0].header.metadata.count("trainyard.max.ids"), 1u);
  EXPECT_EQ(index->shards[0].header.metadata.count("trainyard.max.x"), 0u);  // floats: none
  EXPECT_THAT(out, HasSubstr("('-2', '6')"));

  // Packing again over the shards is refused before anything is written.
  absl::StatusOr<PackResult> again = PackShards(options);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  // Arrays that disagree on the sample count are refused, and nothing is left behind.
  std::tie(code, out) =
      RunShell(absl::StrCat("cd ", dir_, " && /usr/bin/python3 -c \"import numpy as np; ",
                            "np.save('short.npy', np.zeros(999, dtype=np.int32)); ",
                            "np.save('f.npy', np.asfortranarray(np.zeros((1000, 2))))\""));
  ASSERT_EQ(code, 0) << out;
  options.prefix = dir_ + "/out/bad";
  options.tensors[1].npy_path = dir_ + "/short.npy";
  absl::Status status = PackShards(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("short.npy has 999 samples"));
  options.tensors[1].npy_path = dir_ + "/f.npy";
  EXPECT_THAT(std::string(PackShards(options).status().message()), HasSubstr("Fortran"));
  options.tensors[1].npy_path = dir_ + "/missing.npy";
  EXPECT_EQ(PackShards(options).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IndexShards(EnvironmentStores(), dir_ + "/out/bad-*").status().code() ==
              absl::StatusCode::kNotFound);
}

TEST_F(DataPackTest, CsvColumnsBecomeTensorsOfTheirDtypes) {
  std::ofstream(dir_ + "/in.csv") << "id,age,\"income\",label,note\n"
                                  << "1,31,1000.5,2,\"a, b\"\n"
                                  << "2,45,-20.25,0,x\n"
                                  << "3,28,7,1,\"say \"\"hi\"\"\"\n";
  absl::StatusOr<std::vector<PackColumn>> columns =
      ParseCsvColumns("x=age, income:F32; y=label:I64; n=age:F16");
  ASSERT_TRUE(columns.ok()) << columns.status();
  PackOptions options;
  options.prefix = dir_ + "/csv";
  options.csv_path = dir_ + "/in.csv";
  options.tensors = *columns;
  absl::StatusOr<PackResult> result = PackShards(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->samples, 3);
  // NumPy's view of the same numbers, for the checker.
  auto [code, out] = RunShell(absl::StrCat(
      "cd ", dir_, " && /usr/bin/python3 -c \"import numpy as np; ",
      "np.save('x.npy', np.array([[31, 1000.5], [45, -20.25], [28, 7]], dtype=np.float32)); ",
      "np.save('y.npy', np.array([2, 0, 1], dtype=np.int64)); ",
      "np.save('n.npy', np.array([31, 45, 28], dtype=np.float16))\" && /usr/bin/python3 check.py "
      "csv ."));
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("extremes [('0', '2')]"));

  // A bad value is named by line and column; a missing column lists the ones there are.
  std::ofstream(dir_ + "/bad.csv") << "age,label\n1,2\n3,x\n";
  options.prefix = dir_ + "/bad";
  options.csv_path = dir_ + "/bad.csv";
  options.tensors = *ParseCsvColumns("y=label:I64");
  absl::Status status = PackShards(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("bad.csv line 3, column 'label': 'x' is not an integer"));
  options.tensors = *ParseCsvColumns("y=labels:U8");
  EXPECT_THAT(std::string(PackShards(options).status().message()),
              HasSubstr("no column 'labels' (it has age, label)"));
  std::ofstream(dir_ + "/big.csv") << "label\n300\n";
  options.csv_path = dir_ + "/big.csv";
  options.tensors = *ParseCsvColumns("y=label:U8");
  EXPECT_THAT(std::string(PackShards(options).status().message()),
              HasSubstr("300 does not fit U8"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/bad-00000.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/bad-00000.safetensors.part"));
  EXPECT_EQ(ParseCsvColumns("x=a:F99").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCsvColumns("x").status().code(), absl::StatusCode::kInvalidArgument);
}

// Found by fuzz_data_pack (tests/fuzz/corpus/fuzz_data_pack/latin1-tensor-name): a tensor named
// in Latin-1 ended the CLI with an uncaught exception. Now an error naming it, and no shard.
TEST_F(DataPackTest, ATensorNameThatIsNotUtf8IsRefused) {
  std::ofstream(dir_ + "/t.csv") << "a,b\n1,2\n";
  PackOptions options;
  options.prefix = dir_ + "/latin1";
  options.csv_path = dir_ + "/t.csv";
  options.tensors = *ParseCsvColumns("g\xe4=a,b:F32");
  absl::Status status = PackShards(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tensor name 'g\\xe4' is not UTF-8"));
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_FALSE(absl::StartsWith(entry.path().filename().string(), "latin1")) << entry.path();
  }
}

// An .npy file as NumPy writes one (version 1.0, header padded to 64 bytes), with `data` after
// its header whatever the header says.
void WriteNpy(const std::string& path, const std::string& descr, const std::string& shape,
              const std::string& data) {
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream(path, std::ios::binary)
      << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size() & 0xff)
      << static_cast<char>(header.size() >> 8) << header << data;
}

// Shapes whose byte counts wrap to 0 past 2^64 would match files with no data, which would then
// be read past their end: they are refused by name, before anything is read or written.
TEST_F(DataPackTest, RefusesShapesWhoseSizeWraps) {
  struct Case {
    const char* file;
    const char* descr;
    const char* shape;
  };
  for (const Case& c : {Case{"wide.npy", "<f8", "2305843009213693952, 8"},
                        Case{"cube.npy", "|u1", "4294967296, 4294967296, 16"},
                        Case{"long.npy", "<f4", "4611686018427387904,"}}) {
    const std::string path = absl::StrCat(dir_, "/", c.file);
    WriteNpy(path, c.descr, c.shape, "");
    PackOptions options;
    options.prefix = dir_ + "/wraps";
    options.tensors.push_back({"x", path, {}, ""});
    absl::Status status = PackShards(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat(path, ": shape (", c.shape, ") of ", c.descr,
                                       " is over 2^63 bytes")));
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/wraps-00000.safetensors.part"));
  }
}

// A shape that does not wrap is held to the file's size, and the message says which shape.
TEST_F(DataPackTest, RefusesDataShorterThanItsShape) {
  WriteNpy(dir_ + "/short.npy", "<f8", "3, 2", std::string(8, '\0'));
  PackOptions options;
  options.prefix = dir_ + "/short";
  options.tensors.push_back({"x", dir_ + "/short.npy", {}, ""});
  absl::Status status = PackShards(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("short.npy: holds 8 bytes of data, its shape (3, 2) says 48"));
}

// Samples of no bytes are bounded by no file: 2^62 of them would be 2^34 empty shards. (The
// progress callback throws to stop a pack that has started writing them.)
TEST_F(DataPackTest, RefusesSamplesOfNoBytes) {
  WriteNpy(dir_ + "/empty.npy", "<f8", "4611686018427387904, 0", "");
  PackOptions options;
  options.prefix = dir_ + "/empty";
  options.tensors.push_back({"x", dir_ + "/empty.npy", {}, ""});
  options.progress = [](int64_t shards, int64_t) {
    if (shards > 1) throw std::runtime_error("writing empty shards");
  };
  absl::Status status;
  EXPECT_NO_THROW(status = PackShards(options).status());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("empty.npy: no bytes to pack"));
}

}  // namespace
// Text as byte tokens through the command line: two files become one stream of U8 ids, cut into
// shards of --shard-size tokens that Python reads back as the files' bytes, in order; the shards
// record the tokenizer and the extremes. A missing file or an unknown tokenizer writes nothing.
TEST_F(DataPackTest, TextBecomesShardsOfByteTokens) {
  std::ofstream(dir_ + "/a.txt") << "In the beginning God created the heaven and the earth.\n";
  std::ofstream(dir_ + "/b.txt") << "And the earth was without form, and void; \xc3\xa9\n";
  auto [code, out] =
      RunShell(absl::StrCat("cd ", dir_, " && mkdir -p out && ", TRAINYARD_CLI,
                            " data pack --text a.txt b.txt --shard-size 40 out/kjv"));
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("wrote 3 shards, 100 tokens"));
  std::tie(code, out) = RunShell(absl::StrCat(
      "cd ", dir_, " && /usr/bin/python3 -c \"import glob, json, struct; ",
      "data = b''; meta = []\nfor p in sorted(glob.glob('out/kjv-*.safetensors')):\n",
      "  raw = open(p, 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]; ",
      "h = json.loads(raw[8:8 + n]); m = h.pop('__metadata__'); ",
      "assert list(h) == ['tokens'] and h['tokens']['dtype'] == 'U8', h; ",
      "b, e = h['tokens']['data_offsets']; data += raw[8 + n + b:8 + n + e]; ",
      "meta.append((m['tokenizer'], m['trainyard.min.tokens'], m['trainyard.max.tokens']))\n",
      "assert data == open('a.txt', 'rb').read() + open('b.txt', 'rb').read(), data\n",
      "print(len(data), meta)\""));
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("100 [('bytes', '32', '118'), ('bytes', '10', '119'), "
                             "('bytes', '10', '195')]"));

  std::tie(code, out) = RunShell(absl::StrCat("cd ", dir_, " && ", TRAINYARD_CLI,
                                              " data pack --text a.txt missing.txt out/bad"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("no text file missing.txt"));
  std::tie(code, out) = RunShell(absl::StrCat("cd ", dir_, " && ", TRAINYARD_CLI,
                                              " data pack --text --tokenizer bpe a.txt out/bad"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("--tokenizer: unknown tokenizer 'bpe' (bytes)"));
  EXPECT_TRUE(IndexShards(EnvironmentStores(), dir_ + "/out/bad-*").status().code() ==
              absl::StatusCode::kNotFound);
}

}  // namespace trainyard::cli
