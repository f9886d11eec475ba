#include "common/spec/job_paths.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/storage/file_object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

TEST(CheckLocalFilesTest, LocalFilesAreCheckedWhereTheirFolderIsVisible) {
  char tmpl[] = "/tmp/job_spec_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  v1::JobSpec spec;
  // A folder here without a match: refused, the field named.
  spec.mutable_data()->set_train(dir + "/train-*.safetensors");
  absl::StatusOr<std::vector<std::string>> checked = CheckLocalFiles(spec);
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(checked.status().message(),
            "data.train: no files match '" + dir + "/train-*.safetensors'");
  std::ofstream(dir + "/train-0.safetensors") << "x";
  checked = CheckLocalFiles(spec);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_TRUE(checked->empty());
  spec.mutable_model()->set_torchscript("file://" + dir + "/model.pt");
  EXPECT_EQ(CheckLocalFiles(spec).status().message(),
            "model.torchscript: no file 'file://" + dir + "/model.pt'");
  std::ofstream(dir + "/model.pt") << "x";
  EXPECT_TRUE(CheckLocalFiles(spec).ok());
  // A folder this machine does not have: not checked, and said so.
  spec.mutable_distill()->set_teacher("/nonexistent-folder/teacher.pt");
  checked = CheckLocalFiles(spec);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_THAT(*checked, ::testing::ElementsAre(
                            "distill.teacher (/nonexistent-folder/ is not on the coordinator's "
                            "machine)"));
  // Object storage is not this machine's to check.
  spec.mutable_data()->set_train("s3://bucket/none-*.safetensors");
  EXPECT_TRUE(CheckLocalFiles(spec).ok());
  std::filesystem::remove_all(dir);
}

TEST(CheckLocalPathsTest, LocalPathsMustLieUnderAnAllowedFolder) {
  v1::JobSpec spec;
  spec.mutable_data()->set_train("/data/run-*/train-*.safetensors");
  spec.mutable_model()->set_torchscript("file:///models/net.pt");
  spec.mutable_checkpoint()->set_uri("s3://bucket/ckpt");
  EXPECT_TRUE(CheckLocalPaths(spec, {"/data", "/models/"}).ok());

  absl::Status s = CheckLocalPaths(spec, {"/data"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "model.torchscript: 'file:///models/net.pt' is outside the folders this coordinator "
            "allows; local paths must be under /data");
  // Climbing out, a folder that only starts like an allowed one, a relative path.
  spec.mutable_model()->clear_torchscript();
  spec.mutable_data()->set_train("/data/../etc/passwd");
  EXPECT_EQ(CheckLocalPaths(spec, {"/data"}).code(), absl::StatusCode::kInvalidArgument);
  spec.mutable_data()->set_train("/database/x.safetensors");
  EXPECT_EQ(CheckLocalPaths(spec, {"/data"}).code(), absl::StatusCode::kInvalidArgument);
  spec.mutable_data()->set_train("data/x.safetensors");
  EXPECT_THAT(std::string(CheckLocalPaths(spec, {"/data"}).message()),
              HasSubstr("data.train: 'data/x.safetensors' is not a URI"));
  // Nothing allowed: object storage only.
  spec.mutable_data()->set_train("/data/x.safetensors");
  EXPECT_THAT(std::string(CheckLocalPaths(spec, {}).message()),
              HasSubstr("no local paths are allowed here"));
  spec.mutable_data()->set_train("s3://bucket/x-*.safetensors");
  EXPECT_TRUE(CheckLocalPaths(spec, {}).ok());
  // A distillation teacher is a local path like any other.
  spec.mutable_distill()->set_teacher("/models/teacher.pt");
  EXPECT_EQ(CheckLocalPaths(spec, {"/data"}).message(),
            "distill.teacher: '/models/teacher.pt' is outside the folders this coordinator "
            "allows; local paths must be under /data");
  EXPECT_TRUE(CheckLocalPaths(spec, {"/models"}).ok());
  spec.mutable_distill()->set_teacher("s3://bucket/teacher.pt");
  EXPECT_TRUE(CheckLocalPaths(spec, {}).ok());
  // So is each file of model.stages.
  spec.mutable_model()->add_stages("s3://bucket/a.pt");
  spec.mutable_model()->add_stages("/models/b.pt");
  EXPECT_EQ(CheckLocalPaths(spec, {"/data"}).message(),
            "model.stages[1]: '/models/b.pt' is outside the folders this coordinator allows; "
            "local paths must be under /data");
  EXPECT_TRUE(CheckLocalPaths(spec, {"/models"}).ok());
  spec.mutable_model()->clear_stages();
}

// The escape that was reproduced on a cluster ("A/x://../../B" was taken for a URI and never
// checked, then written as a local path) and its relatives, through every field that names a
// place: each refused naming the field.
TEST(CheckLocalPathsTest, NoSpellingLeadsOutOfTheAllowedFolders) {
  const std::string a = "/srv/allowed/x/y";
  const std::string b = "/srv/other";
  const std::vector<std::string> escapes = {
      a + "/x://../../../../" + b.substr(1),
      a + "/../../../other",
      "file://" + a + "/../../../other",
      "file://localhost" + a + "/../../../other",
      a + "/%2e%2e/%2E%2e/%2e%2e/other",
      a + "/./../../../other",
      a + "/..",
      a + "/...",
      a + "/x/../../../../other",
      "/" + b,
      "//" + b.substr(1),
      "file:///" + b,
      a + std::string("/x\0/../../../../other", 21),
      a + "\\..\\..\\other",
      "/srv/allowed/x/yz",
  };
  const std::vector<std::string> fields = {"data.train",        "data.tokens",
                                           "model.torchscript", "model.stages[0]",
                                           "distill.teacher",   "checkpoint.uri"};
  for (const std::string& field : fields) {
    for (const std::string& escape : escapes) {
      v1::JobSpec spec;
      if (field == "data.train") spec.mutable_data()->set_train(escape);
      if (field == "data.tokens") spec.mutable_data()->set_tokens(escape);
      if (field == "model.torchscript") spec.mutable_model()->set_torchscript(escape);
      if (field == "model.stages[0]") spec.mutable_model()->add_stages(escape);
      if (field == "distill.teacher") spec.mutable_distill()->set_teacher(escape);
      if (field == "checkpoint.uri") spec.mutable_checkpoint()->set_uri(escape);
      const absl::Status s = CheckLocalPaths(spec, {a});
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << " = " << escape;
      EXPECT_THAT(std::string(s.message()), ::testing::StartsWith(field + ": "))
          << field << " = " << escape;
    }
    // What is inside stays allowed, however the slashes fall.
    v1::JobSpec spec;
    spec.mutable_checkpoint()->set_uri("file://" + a + "//deeper///z/");
    spec.mutable_data()->set_train(a + "/train-*.safetensors");
    EXPECT_TRUE(CheckLocalPaths(spec, {a}).ok());
    EXPECT_TRUE(CheckLocalPaths(spec, {a + "/"}).ok());
  }
}

// Links the coordinator can see are followed to where they lead: out is refused, and an allowed
// folder that is itself a link is where its target is.
TEST(CheckLocalPathsTest, SymbolicLinksOutAreRefusedWhereVisible) {
  char tmpl[] = "/tmp/job_paths_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::filesystem::create_directories(dir + "/allowed/data");
  std::filesystem::create_directories(dir + "/outside");
  std::ofstream(dir + "/outside/secret.pt") << "x";
  std::filesystem::create_directory_symlink(dir + "/outside", dir + "/allowed/link");
  std::filesystem::create_symlink(dir + "/outside/secret.pt", dir + "/allowed/data/model.pt");
  std::filesystem::create_directory_symlink(dir + "/allowed", dir + "/allowed-link");
  const std::vector<std::string> allowed = {dir + "/allowed"};

  v1::JobSpec spec;
  spec.mutable_model()->set_torchscript(dir + "/allowed/data/model.pt");
  absl::Status s = CheckLocalPaths(spec, allowed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.torchscript: '" + dir +
                                                  "/allowed/data/model.pt' leads through a "
                                                  "symbolic link to '" +
                                                  dir + "/outside/secret.pt'"));
  spec.mutable_model()->clear_torchscript();
  // A folder link, with a pattern below it and with a file not written yet.
  spec.mutable_data()->set_train(dir + "/allowed/link/train-*.safetensors");
  EXPECT_THAT(std::string(CheckLocalPaths(spec, allowed).message()), HasSubstr("data.train: "));
  spec.mutable_data()->clear_train();
  spec.mutable_checkpoint()->set_uri(dir + "/allowed/link/not-yet/ckpt");
  EXPECT_THAT(std::string(CheckLocalPaths(spec, allowed).message()), HasSubstr("checkpoint.uri: "));
  // Inside, through an allowed folder that is a link itself, and a file yet to come.
  spec.mutable_checkpoint()->set_uri(dir + "/allowed/ckpt/new");
  EXPECT_TRUE(CheckLocalPaths(spec, allowed).ok());
  spec.mutable_checkpoint()->set_uri(dir + "/allowed-link/ckpt/new");
  EXPECT_TRUE(CheckLocalPaths(spec, {dir + "/allowed-link"}).ok());
  std::filesystem::remove_all(dir);
}

TEST(RealPathOfExistingTest, ResolvesTheExistingPartAndKeepsTheRest) {
  char tmpl[] = "/tmp/job_paths_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::filesystem::create_directories(dir + "/real");
  std::filesystem::create_directory_symlink(dir + "/real", dir + "/link");
  const std::string real_dir = std::filesystem::canonical(dir).string();
  EXPECT_EQ(*RealPathOfExisting(dir + "/link/a/b"), real_dir + "/real/a/b");
  EXPECT_EQ(*RealPathOfExisting(dir + "/link"), real_dir + "/real");
  EXPECT_EQ(*RealPathOfExisting("/"), "/");
  std::filesystem::remove_all(dir);
}

// Any owner name makes one safe folder of its own.
TEST(OwnerFolderTest, PlainNamesStayAndOthersAreHashed) {
  EXPECT_EQ(OwnerFolder("alice"), "alice");
  EXPECT_EQ(OwnerFolder("ml-team.a_1"), "ml-team.a_1");
  for (const std::string& odd :
       {std::string(".."), std::string("."), std::string("a/b"), std::string("Alice Smith"),
        std::string(""), std::string(200, 'a'), std::string("u-0123456789abcdef")}) {
    const std::string folder = OwnerFolder(odd);
    EXPECT_TRUE(absl::StartsWith(folder, "u-")) << odd << " -> " << folder;
    EXPECT_EQ(folder.size(), 18u) << odd;
    EXPECT_TRUE(ParseUri("/ckpt/" + folder + "/x").ok()) << odd;
  }
  EXPECT_NE(OwnerFolder("a/b"), OwnerFolder("a/c"));
}

}  // namespace
}  // namespace trainyard
