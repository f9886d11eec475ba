// A program's workdir as an archive (common/formats/workdir_archive.h): what is left out, the
// same bytes for the same files, the size limit, links, and archives that try to leave the
// folder they are unpacked into.

#include "common/formats/workdir_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scratch_files.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::ReadText;
using testing::WriteText;
using Folder = testing::ScratchFolder;

std::vector<std::string> FilesBelow(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), dir).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(IgnoreRulesTest, TheRulesOfGitignore) {
  IgnoreRules rules;
  rules.Add("# outputs\n*.pt\n!keep.pt\ndata/\n/build\nlogs/**/*.txt\n\n");
  EXPECT_TRUE(rules.Ignored("model.pt", false));
  EXPECT_TRUE(rules.Ignored("runs/a/model.pt", false));  // a name pattern, at any depth
  EXPECT_FALSE(rules.Ignored("keep.pt", false));         // taken back with !
  EXPECT_TRUE(rules.Ignored("data", true));
  EXPECT_FALSE(rules.Ignored("data", false));  // data/ is for folders only
  EXPECT_TRUE(rules.Ignored("src/data", true));
  EXPECT_TRUE(rules.Ignored("build", true));  // anchored at the root
  EXPECT_FALSE(rules.Ignored("src/build", true));
  EXPECT_TRUE(rules.Ignored("logs/x.txt", false));  // ** takes any folders, none included
  EXPECT_TRUE(rules.Ignored("logs/a/b/x.txt", false));
  EXPECT_FALSE(rules.Ignored("train.py", false));
}

TEST(WorkdirArchiveTest, TheSameFilesMakeTheSameBytesAndComeBackWithTheirModes) {
  Folder src;
  WriteText(src / "train.py", "print('hi')\n");
  WriteText(src / "lib/util.py", "x = 1\n");
  WriteText(src / "run.sh", "#!/bin/sh\n");
  ::chmod((src / "run.sh").c_str(), 0755);
  WriteText(src / ".git/HEAD", "ref: refs/heads/main\n");
  WriteText(src / "out/model.pt", std::string(1000, 'w'));
  WriteText(src / ".gitignore", "out/\n");
  WriteText(src / ".trainyardignore", "*.log\n");
  WriteText(src / "train.log", "noise");
  Folder tmp;
  absl::StatusOr<PackedWorkdir> a = PackWorkdir(src.path(), tmp / "a.tar", 1 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->files, 5);  // train.py, lib/util.py, run.sh, .gitignore, .trainyardignore
  // Touched, the files pack into the same bytes: the hash names the content alone.
  fs::last_write_time(src / "train.py", fs::file_time_type::clock::now() - std::chrono::hours(5));
  absl::StatusOr<PackedWorkdir> b = PackWorkdir(src.path(), tmp / "b.tar", 1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->sha256, b->sha256);
  EXPECT_EQ(ReadText(tmp / "a.tar"), ReadText(tmp / "b.tar"));

  const std::string out = tmp / "unpacked";
  ASSERT_TRUE(UnpackWorkdir(tmp / "a.tar", out).ok());
  EXPECT_THAT(FilesBelow(out),
              ElementsAre(".gitignore", ".trainyardignore", "lib/util.py", "run.sh", "train.py"));
  EXPECT_EQ(ReadText(out + "/lib/util.py"), "x = 1\n");
  EXPECT_EQ(fs::status(out + "/run.sh").permissions() & fs::perms::owner_exec,
            fs::perms::owner_exec);
  EXPECT_EQ(fs::status(out + "/train.py").permissions() & fs::perms::owner_exec, fs::perms::none);
}

TEST(WorkdirArchiveTest, LinksOutsideAreLeftOutAndLinksInsideArePackedAsFiles) {
  Folder src;
  WriteText(src / "train.py", "print(1)\n");
  fs::create_symlink("train.py", src / "alias.py");
  fs::create_symlink("/etc/hostname", src / "host");
  fs::create_directories(src / "sub");
  fs::create_directory_symlink(src / "sub", src / "loop");
  Folder tmp;
  absl::StatusOr<PackedWorkdir> packed = PackWorkdir(src.path(), tmp / "a.tar", 1 << 20);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->left_out, ::testing::UnorderedElementsAre("host", "loop"));
  ASSERT_TRUE(UnpackWorkdir(tmp / "a.tar", tmp / "out").ok());
  EXPECT_EQ(ReadText(tmp / "out/alias.py"), "print(1)\n");
  EXPECT_FALSE(fs::is_symlink(tmp / "out/alias.py"));
}

TEST(WorkdirArchiveTest, OverTheLimitSaysTheSizeAndWhatToDo) {
  Folder src;
  WriteText(src / "data.bin", std::string(3000, 'd'));
  Folder tmp;
  absl::StatusOr<PackedWorkdir> packed = PackWorkdir(src.path(), tmp / "a.tar", 2048);
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(packed.status().message(), HasSubstr("over the limit of 2.0 KiB"));
  EXPECT_THAT(packed.status().message(), HasSubstr(".trainyardignore"));
  EXPECT_THAT(packed.status().message(), HasSubstr("--max_workdir_size"));
  EXPECT_EQ(PackWorkdir(src / "missing", tmp / "b.tar", 2048).status().code(),
            absl::StatusCode::kNotFound);
}

// A tar with one entry of `name` and `type` (and a link target), made with libarchive.
void WriteTar(const std::string& path, const std::string& name, mode_t type,
              const std::string& target = "") {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open_filename(a, path.c_str());
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_filetype(e, type);
  archive_entry_set_perm(e, 0644);
  if (!target.empty()) archive_entry_set_symlink(e, target.c_str());
  archive_entry_set_size(e, type == AE_IFREG ? 4 : 0);
  archive_write_header(a, e);
  if (type == AE_IFREG) archive_write_data(a, "evil", 4);
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
}

TEST(WorkdirArchiveTest, AnArchiveCannotWriteOutsideTheFolder) {
  Folder tmp;
  const std::string out = tmp / "work";
  struct Case {
    std::string name;
    mode_t type;
    std::string target;
  };
  for (const Case& c : std::vector<Case>{{"../escape.py", AE_IFREG, ""},
                                         {"a/../../escape.py", AE_IFREG, ""},
                                         {"/tmp/absolute.py", AE_IFREG, ""},
                                         {"link", AE_IFLNK, "/etc"},
                                         {"dev", AE_IFCHR, ""}}) {
    SCOPED_TRACE(c.name);
    WriteTar(tmp / "evil.tar", c.name, c.type, c.target);
    const absl::Status s = UnpackWorkdir(tmp / "evil.tar", out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.name));
  }
  EXPECT_FALSE(fs::exists(tmp / "escape.py"));
  EXPECT_FALSE(fs::exists("/tmp/absolute.py"));
}

}  // namespace
}  // namespace trainyard
