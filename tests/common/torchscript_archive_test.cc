#include "common/formats/torchscript_archive.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/storage/file_object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/run_shell.h"

#ifndef TRAINYARD_SOURCE_DIR_FALLBACK
#define TRAINYARD_SOURCE_DIR_FALLBACK "."
#endif

namespace trainyard {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

std::set<std::string> Ops(absl::string_view code) {
  std::set<std::string> ops;
  CollectTorchScriptOps(code, ops);
  return ops;
}

TEST(CollectTorchScriptOpsTest, CallsAsLibTorchPrintsThem) {
  EXPECT_EQ(Ops("x = torch.linear(a, w, b)\n"
                "y = torch.scaled_dot_product_attention (q, k, v, None, 0., True)\n"
                "ops.prim.RaiseException(\"boom\")\n"
                "g = torch.autograd.grad([y], [x])\n"),
            (std::set<std::string>{"aten::linear", "aten::scaled_dot_product_attention",
                                   "prim::RaiseException", "aten::grad"}));
}

TEST(CollectTorchScriptOpsTest, SkipsStringsCommentsMethodsAndFunctions) {
  EXPECT_THAT(Ops("ops.prim.RaiseException(\"torch.fake(x) 'torch.no(1)'\")\n"
                  "s = 'it\\'s torch.escaped(1)'\n"
                  "t = \"\"\"torch.triple(\n torch.lines(\"\"\"\n"
                  "# torch.commented(x)\n"
                  "h = (emb).forward(x, )\n"
                  "r = __torch__.torch.nn.functional.relu(x, False, )\n"
                  "v = x.torch.attribute(1)\n"
                  "w : torch.Tensor = torch.device\n"),
              (std::set<std::string>{"prim::RaiseException"}));
}

class ArchiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/ts_archive_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const char* source = getenv("TRAINYARD_SOURCE_DIR");
    const std::string script =
        absl::StrCat(source != nullptr ? source : TRAINYARD_SOURCE_DIR_FALLBACK,
                     "/tests/common/torchscript_archives.py");
    const auto [rc, out] = testing::RunShell(absl::StrCat("/usr/bin/python3 ", script, " ", dir_));
    ASSERT_EQ(rc, 0) << out;
  }
  static void TearDownTestSuite() { testing::RunShell("rm -rf " + dir_); }

  static std::vector<std::string> Lines(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream s;
    s << in.rdbuf();
    return absl::StrSplit(s.str(), '\n', absl::SkipEmpty());
  }
  static absl::StatusOr<TorchScriptNeeds> Read(const std::string& name) {
    FileObjectStore files;
    return ReadTorchScriptNeeds(files, "file://" + dir_ + "/" + name);
  }
  static void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  static std::string Bytes(const std::string& name) {
    std::ifstream in(dir_ + "/" + name, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  static std::string dir_;
};
std::string ArchiveTest::dir_;

// Zip archives built here, byte by byte, for what a writer would never write: sizes and offsets
// near 2^63 in zip64 extra fields, in files of up to 2^63 - 1 bytes that are never materialized.
std::string Le(uint64_t v, int width) {
  std::string out;
  for (int i = 0; i < width; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// An entry of the central directory, with its size, compressed size and offset all in a zip64
// extra field.
struct CdEntry {
  std::string name;
  int method = 0;  // 0 stored, 8 deflated
  uint64_t size = 0;
  uint64_t compressed = 0;
  uint64_t offset = 0;
};

// A local header and the stored bytes of `name`.
std::string Local(const std::string& name, const std::string& bytes) {
  return Le(0x04034b50, 4) + Le(45, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0, 4) +
         Le(bytes.size(), 4) + Le(bytes.size(), 4) + Le(name.size(), 2) + Le(0, 2) + name + bytes;
}

// A file of `size` bytes: `pieces` at their offsets, zeros elsewhere. Its reader refuses what
// the archive reader must never ask: a negative range, or more than a MiB at once.
class SparseFile {
 public:
  SparseFile(int64_t size, std::map<int64_t, std::string> pieces)
      : size_(size), pieces_(std::move(pieces)) {}
  int64_t size() const { return size_; }
  ArchiveReader Reader() const {
    return [this](int64_t offset, int64_t length) -> absl::StatusOr<std::string> {
      if (offset < 0 || length < 0) {
        return absl::OutOfRangeError(absl::StrCat("test: read of ", length, " at ", offset));
      }
      if (length > (1 << 20)) {
        return absl::FailedPreconditionError(absl::StrCat("test: read of ", length, " bytes"));
      }
      std::string out(static_cast<size_t>(
                          std::max<int64_t>(0, std::min(length, size_ - std::min(offset, size_)))),
                      '\0');
      const int64_t end = offset + static_cast<int64_t>(out.size());
      for (const auto& [at, bytes] : pieces_) {
        const int64_t from = std::max(at, offset);
        const int64_t to = std::min(at + static_cast<int64_t>(bytes.size()), end);
        if (from < to) out.replace(from - offset, to - from, bytes, from - at, to - from);
      }
      return out;
    };
  }

 private:
  int64_t size_;
  std::map<int64_t, std::string> pieces_;
};

// An archive of `size` bytes (0: just large enough) with `pieces` at their offsets, whose central
// directory lists `entries` and ends, with its zip64 end records, at `tail_end` (0: the end).
SparseFile Zip(int64_t size, const std::vector<CdEntry>& entries,
               std::map<int64_t, std::string> pieces, int64_t tail_end = 0) {
  std::string cd;
  for (const CdEntry& e : entries) {
    const std::string extra =
        Le(0x0001, 2) + Le(24, 2) + Le(e.size, 8) + Le(e.compressed, 8) + Le(e.offset, 8);
    cd += Le(0x02014b50, 4) + Le(45, 2) + Le(45, 2) + Le(0, 2) + Le(e.method, 2) + Le(0, 4) +
          Le(0, 4) + Le(0xffffffff, 4) + Le(0xffffffff, 4) + Le(e.name.size(), 2) +
          Le(extra.size(), 2) + Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0xffffffff, 4) +
          e.name + extra;
  }
  constexpr int64_t kRecords = 56 + 20 + 22;
  if (size == 0) {
    for (const auto& [at, bytes] : pieces) {
      size = std::max(size, at + static_cast<int64_t>(bytes.size()));
    }
    size += static_cast<int64_t>(cd.size()) + kRecords;
  }
  if (tail_end == 0) tail_end = size;
  const int64_t cd_at = tail_end - kRecords - static_cast<int64_t>(cd.size());
  const int64_t zip64_end_at = cd_at + static_cast<int64_t>(cd.size());
  pieces[cd_at] = cd + Le(0x06064b50, 4) + Le(44, 8) + Le(45, 2) + Le(45, 2) + Le(0, 4) + Le(0, 4) +
                  Le(entries.size(), 8) + Le(entries.size(), 8) + Le(cd.size(), 8) + Le(cd_at, 8) +
                  Le(0x07064b50, 4) + Le(0, 4) + Le(zip64_end_at, 8) + Le(1, 4) +
                  Le(0x06054b50, 4) + Le(0, 2) + Le(0, 2) + Le(0xffff, 2) + Le(0xffff, 2) +
                  Le(0xffffffff, 4) + Le(0xffffffff, 4) + Le(0, 2);
  return SparseFile(size, std::move(pieces));
}

constexpr int64_t kMaxSize = std::numeric_limits<int64_t>::max();
const std::string kCodeName = "m/code/m.py";
const std::string kCode = "y = torch.relu(x)\n";

absl::StatusOr<TorchScriptNeeds> Read(const SparseFile& file) {
  return ReadTorchScriptNeeds(file.size(), file.Reader());
}

// The archives below differ from this one only in what the tests are about.
TEST(ArchiveLimitsTest, ReadsAnArchiveBuiltHere) {
  const std::string code = Local(kCodeName, kCode);
  const std::string tensor = Local("m/data/0", std::string(40, '\1'));
  const int64_t tensor_at = static_cast<int64_t>(code.size());
  absl::StatusOr<TorchScriptNeeds> needs =
      Read(Zip(0,
               {{kCodeName, 0, kCode.size(), kCode.size(), 0},
                {"m/data/0", 0, 40, 40, static_cast<uint64_t>(tensor_at)}},
               {{0, code}, {tensor_at, tensor}}));
  ASSERT_TRUE(needs.ok()) << needs.status();
  EXPECT_EQ(needs->ops, std::vector<std::string>{"aten::relu"});
  EXPECT_EQ(needs->tensor_bytes, 40);
}

// A stored entry is as large as its bytes, a deflated one at most 1032 times them: two tensors
// of 2^63 - 1 bytes each in a file of a few hundred would add up to -2.
TEST(ArchiveLimitsTest, RefusesSizesTheirBytesCannotHold) {
  const uint64_t huge = static_cast<uint64_t>(kMaxSize);
  const CdEntry code{kCodeName, 0, kCode.size(), kCode.size(), 0};
  for (const std::vector<CdEntry>& entries :
       {std::vector<CdEntry>{code, {"m/data/0", 0, huge, 0, 0}, {"m/data/1", 0, huge, 0, 0}},
        std::vector<CdEntry>{code, {"m/data/0", 8, uint64_t{1} << 40, 4, 0}}}) {
    absl::StatusOr<TorchScriptNeeds> needs = Read(Zip(0, entries, {{0, Local(kCodeName, kCode)}}));
    EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument) << needs.status();
    EXPECT_THAT(needs.status().message(),
                HasSubstr(absl::StrCat("'m/data/0' claims a size of ", entries[1].size)));
  }
}

// Tensors may share their bytes, so their sizes add up past the file's: in a file of 2^63 - 1
// bytes, two of 3 * 2^61 each add up past 2^63.
TEST(ArchiveLimitsTest, RefusesTensorSizesThatAddUpPast2To63) {
  const uint64_t big = uint64_t{3} << 61;
  absl::StatusOr<TorchScriptNeeds> needs = Read(Zip(kMaxSize,
                                                    {{kCodeName, 0, kCode.size(), kCode.size(), 0},
                                                     {"m/data/0", 0, big, big, 0},
                                                     {"m/data/1", 0, big, big, 0}},
                                                    {{0, Local(kCodeName, kCode)}}));
  EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument) << needs.status();
  EXPECT_THAT(needs.status().message(), HasSubstr("tensors' sizes add up past"));
  EXPECT_THAT(needs.status().message(), HasSubstr("'m/data/1'"));
}

// The cap on code holds against a size near 2^63 (which would wrap the running sum below the
// cap) and against compressed bytes that inflate to little: neither is read.
TEST(ArchiveLimitsTest, RefusesCodePastTheCapWithoutReadingIt) {
  const uint64_t near_max = static_cast<uint64_t>(kMaxSize) - 8;
  const CdEntry first{kCodeName, 0, kCode.size(), kCode.size(), 0};
  for (const CdEntry& second : {CdEntry{"m/code/big.py", 8, near_max, near_max / 1032 + 1, 0},
                                CdEntry{"m/code/big.py", 8, 10, uint64_t{1} << 30, 0}}) {
    absl::StatusOr<TorchScriptNeeds> needs =
        Read(Zip(kMaxSize, {first, second}, {{0, Local(kCodeName, kCode)}}));
    EXPECT_EQ(needs.status().code(), absl::StatusCode::kResourceExhausted) << needs.status();
    EXPECT_THAT(needs.status().message(), HasSubstr("MiB of code (at 'm/code/big.py'"));
  }
}

// A local header in the last 30 bytes of a 2^63 - 1-byte file, whose name and extra lengths
// (2 * 0xffff) would carry the offset of its data past 2^63.
TEST(ArchiveLimitsTest, RefusesALocalHeaderWhoseDataOffsetWouldOverflow) {
  const int64_t header_at = kMaxSize - 30;
  const std::string header =
      Le(0x04034b50, 4) + std::string(22, '\0') + Le(0xffff, 2) + Le(0xffff, 2);
  absl::StatusOr<TorchScriptNeeds> needs =
      Read(Zip(kMaxSize, {{kCodeName, 0, 0, 0, static_cast<uint64_t>(header_at)}},
               {{header_at, header}}, header_at));
  EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument) << needs.status();
  EXPECT_THAT(needs.status().message(), HasSubstr("'m/code/m.py' past the end"));
}

// PyTorch is the reference: every operator of the model's graph that its code names is found,
// and every one found is an operator PyTorch has (nothing made up from a string or a type).
TEST_F(ArchiveTest, FindsTheOperatorsPyTorchSees) {
  absl::StatusOr<TorchScriptNeeds> needs = Read("model.pt");
  ASSERT_TRUE(needs.ok()) << needs.status();
  const std::set<std::string> found(needs->ops.begin(), needs->ops.end());
  const std::vector<std::string> all = Lines("all_ops.txt");
  const std::set<std::string> known(all.begin(), all.end());
  for (const std::string& op : Lines("graph_ops.txt")) EXPECT_THAT(found, Contains(op));
  for (const std::string& op : found) EXPECT_THAT(known, Contains(op));
  EXPECT_THAT(found, Contains("aten::layer_norm"));
  EXPECT_THAT(found, Not(Contains("aten::not_an_op")));
  EXPECT_GT(needs->format_version, 0);
}

// The bytes of its tensors, as PyTorch counts its state_dict: what the coordinator's memory
// estimate takes for a TorchScript model's parameters.
TEST_F(ArchiveTest, TensorBytesAreWhatPyTorchHolds) {
  absl::StatusOr<TorchScriptNeeds> needs = Read("model.pt");
  ASSERT_TRUE(needs.ok()) << needs.status();
  const std::vector<std::string> lines = Lines("tensor_bytes.txt");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(needs->tensor_bytes, std::stoll(lines[0]));
  EXPECT_GT(needs->tensor_bytes, 4000);
}

TEST_F(ArchiveTest, StoredAndZip64ArchivesReadTheSame) {
  absl::StatusOr<TorchScriptNeeds> deflated = Read("model.pt");
  absl::StatusOr<TorchScriptNeeds> stored = Read("stored.pt");
  absl::StatusOr<TorchScriptNeeds> many = Read("many.pt");
  ASSERT_TRUE(deflated.ok()) << deflated.status();
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(stored->ops, deflated->ops);
  EXPECT_EQ(many->ops, deflated->ops);
  EXPECT_EQ(many->format_version, deflated->format_version);
  EXPECT_EQ(stored->tensor_bytes, deflated->tensor_bytes);
  EXPECT_EQ(many->tensor_bytes, deflated->tensor_bytes);
}

TEST_F(ArchiveTest, RefusesWhatIsNotAnArchive) {
  const std::string model = Bytes("model.pt");
  Write("text.pt", "not a zip at all, and long enough to hold an end record");
  Write("cut.pt", model.substr(0, model.size() / 2));
  Write("empty.pt", "");
  for (const char* name : {"text.pt", "cut.pt", "empty.pt"}) {
    absl::StatusOr<TorchScriptNeeds> needs = Read(name);
    EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(needs.status().message(), HasSubstr(name));
    EXPECT_THAT(needs.status().message(), HasSubstr("not a TorchScript archive"));
  }
  EXPECT_EQ(Read("missing.pt").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ArchiveTest, RefusesAZipWithoutCode) {
  const auto [rc, out] = testing::RunShell(
      absl::StrCat("cd ", dir_, " && /usr/bin/python3 -c \"import zipfile; ",
                   "z = zipfile.ZipFile('weights.pt', 'w'); z.writestr('w/data.pkl', b'x'); ",
                   "z.writestr('w/version', b'3')\""));
  ASSERT_EQ(rc, 0) << out;
  absl::StatusOr<TorchScriptNeeds> needs = Read("weights.pt");
  EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(needs.status().message(), HasSubstr("no code/ folder"));
}

// A damaged entry is refused, not read past: the deflated bytes of the model's code overwritten
// (where they lie, from its local header, as Python's zipfile finds it).
TEST_F(ArchiveTest, RefusesDamagedCode) {
  const auto [rc, out] = testing::RunShell(absl::StrCat(
      "/usr/bin/python3 -c \"import zipfile, sys; p = sys.argv[1]; z = zipfile.ZipFile(p); ",
      "i = next(i for i in z.infolist() if i.filename.endswith('/code/__torch__.py')); ",
      "h = open(p, 'rb').read()[i.header_offset:i.header_offset + 30]; ",
      "print(i.header_offset + 30 + int.from_bytes(h[26:28], 'little') + ",
      "int.from_bytes(h[28:30], 'little'), i.compress_size)\" ", dir_, "/model.pt"));
  ASSERT_EQ(rc, 0) << out;
  const std::vector<std::string> where =
      absl::StrSplit(out, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  ASSERT_EQ(where.size(), 2u) << out;
  std::string model = Bytes("model.pt");
  const size_t data = std::stoul(where[0]);
  const size_t length = std::stoul(where[1]);
  ASSERT_LE(data + length, model.size());
  for (size_t i = data; i < data + length; ++i) model[i] = '\xff';
  Write("garbled.pt", model);
  absl::StatusOr<TorchScriptNeeds> needs = Read("garbled.pt");
  EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument) << needs.status();
  EXPECT_THAT(needs.status().message(), HasSubstr("does not inflate"));
}

}  // namespace
}  // namespace trainyard
