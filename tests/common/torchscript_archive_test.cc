#include "common/torchscript_archive.h"

#include <stdlib.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_object_store.h"
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
