#include "common/formats/workdir_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/sha256.h"
#include "common/storage/uri.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

// Whether path segments [p, end) match pattern segments [r, end): "**" takes any number of
// folders, other segments match one name each (fnmatch(3), without crossing '/').
bool MatchSegments(const std::vector<std::string>& rule, size_t r,
                   const std::vector<absl::string_view>& path, size_t p) {
  if (r == rule.size()) return p == path.size();
  if (rule[r] == "**") {
    for (size_t skip = p; skip <= path.size(); ++skip) {
      if (MatchSegments(rule, r + 1, path, skip)) return true;
    }
    return false;
  }
  if (p == path.size()) return false;
  const std::string name(path[p]);
  if (::fnmatch(rule[r].c_str(), name.c_str(), 0) != 0) return false;
  return MatchSegments(rule, r + 1, path, p + 1);
}

// Where the archive goes: a file, each block hashed and counted as it is written. Closed by
// PackWorkdir; on an early return the destructor closes it.
struct HashedFile {
  ~HashedFile() {
    if (file != nullptr) std::fclose(file);
  }
  static la_ssize_t Write(archive*, void* self, const void* data, size_t length) {
    auto* out = static_cast<HashedFile*>(self);
    if (std::fwrite(data, 1, length, out->file) != length) {
      out->failed = true;
      return -1;
    }
    out->hash.Update(absl::string_view(static_cast<const char*>(data), length));
    out->bytes += static_cast<int64_t>(length);
    return static_cast<la_ssize_t>(length);
  }
  std::FILE* file = nullptr;
  Sha256 hash;
  int64_t bytes = 0;
  bool failed = false;
};

struct ArchiveWriter {
  ~ArchiveWriter() {
    if (a != nullptr) archive_write_free(a);
  }
  archive* a = nullptr;
};
struct ArchiveReader {
  ~ArchiveReader() {
    if (a != nullptr) archive_read_free(a);
  }
  archive* a = nullptr;
};

// The files to pack, relative to the root, in path order; links left out in `left_out`.
absl::Status Walk(const std::string& root, const IgnoreRules& rules,
                  std::vector<std::string>& files, std::vector<std::string>& left_out) {
  std::error_code ec;
  const fs::path real_root = fs::canonical(root, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("program.workdir: ", root, ": ", ec.message()));
  if (!fs::is_directory(real_root)) {
    return absl::InvalidArgumentError(absl::StrCat("program.workdir: ", root, " is not a folder"));
  }
  fs::recursive_directory_iterator it(real_root, fs::directory_options::none, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot read ", root, ": ", ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return absl::UnavailableError(absl::StrCat("cannot read ", root, ": ", ec.message()));
    const std::string relative = it->path().lexically_relative(real_root).string();
    const fs::file_status own = it->symlink_status(ec);
    if (fs::is_directory(own)) {
      if (relative == ".git" || rules.Ignored(relative, /*is_folder=*/true)) {
        it.disable_recursion_pending();
      }
      continue;
    }
    if (rules.Ignored(relative, /*is_folder=*/false)) continue;
    if (fs::is_symlink(own)) {
      // Followed only to a file inside the folder.
      const fs::path target = fs::canonical(it->path(), ec);
      const std::string inside = ec ? "" : target.lexically_relative(real_root).string();
      if (ec || inside.empty() || absl::StartsWith(inside, "..") || !fs::is_regular_file(target)) {
        left_out.push_back(relative);
        ec.clear();
        continue;
      }
    } else if (!fs::is_regular_file(own)) {
      left_out.push_back(relative);  // sockets, devices, fifos
      continue;
    }
    files.push_back(relative);
  }
  std::sort(files.begin(), files.end());
  return absl::OkStatus();
}

absl::Status ArchiveError(archive* a, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(
      what, ": ",
      archive_error_string(a) != nullptr ? archive_error_string(a) : "libarchive error"));
}

}  // namespace

void IgnoreRules::Add(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    Rule rule;
    if (absl::ConsumePrefix(&line, "!")) rule.negate = true;
    if (absl::ConsumeSuffix(&line, "/")) rule.folders_only = true;
    if (absl::ConsumePrefix(&line, "/")) rule.anchored = true;
    if (line.empty()) continue;
    rule.anchored = rule.anchored || absl::StrContains(line, '/');
    rule.segments = absl::StrSplit(line, '/', absl::SkipEmpty());
    rules_.push_back(std::move(rule));
  }
}

bool IgnoreRules::Ignored(absl::string_view path, bool is_folder) const {
  const std::vector<absl::string_view> segments = absl::StrSplit(path, '/', absl::SkipEmpty());
  bool ignored = false;
  for (const Rule& rule : rules_) {
    if (rule.folders_only && !is_folder) continue;
    bool match;
    if (rule.anchored) {
      match = MatchSegments(rule.segments, 0, segments, 0);
    } else {
      match = !segments.empty() && MatchSegments(rule.segments, 0, {segments.back()}, 0);
    }
    if (match) ignored = !rule.negate;
  }
  return ignored;
}

absl::StatusOr<PackedWorkdir> PackWorkdir(const std::string& dir, const std::string& archive_path,
                                          int64_t max_bytes,
                                          const std::function<void(int64_t, int)>& progress) {
  IgnoreRules rules;
  for (const char* name : {kGitignoreFile, kTrainyardignoreFile}) {
    std::ifstream in(absl::StrCat(dir, "/", name), std::ios::binary);
    if (in) rules.Add(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  PackedWorkdir packed;
  std::vector<std::string> files;
  if (absl::Status s = Walk(dir, rules, files, packed.left_out); !s.ok()) return s;
  std::error_code ec;
  for (const std::string& f : files) {
    packed.file_bytes += static_cast<int64_t>(fs::file_size(fs::path(dir) / f, ec));
  }
  if (packed.file_bytes > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "program.workdir: ", dir, " holds ", HumanBytes(packed.file_bytes), " in ", files.size(),
        " files, over the limit of ", HumanBytes(max_bytes), ": leave out data and outputs with ",
        kTrainyardignoreFile, " or ", kGitignoreFile,
        " patterns (read your data from object storage instead), or ask for a larger "
        "--max_workdir_size on the coordinator"));
  }
  // The archive is hashed in the pass that writes it. Declared before the writer, which may
  // still flush into it when it is freed.
  HashedFile out;
  ArchiveWriter w;
  w.a = archive_write_new();
  archive_write_set_format_pax_restricted(w.a);
  out.file = std::fopen(archive_path.c_str(), "wb");
  if (out.file == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot write ", archive_path, ": ", std::strerror(errno)));
  }
  if (archive_write_open2(w.a, &out, nullptr, &HashedFile::Write, nullptr, nullptr) != ARCHIVE_OK) {
    return ArchiveError(w.a, absl::StrCat("cannot write ", archive_path));
  }
  std::unique_ptr<archive_entry, void (*)(archive_entry*)> entry(archive_entry_new(),
                                                                 archive_entry_free);
  std::vector<char> buffer(1 << 20);
  for (const std::string& relative : files) {
    const std::string path = (fs::path(dir) / relative).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      if (fd >= 0) ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    archive_entry_clear(entry.get());
    archive_entry_set_pathname(entry.get(), relative.c_str());
    archive_entry_set_filetype(entry.get(), AE_IFREG);
    archive_entry_set_perm(entry.get(), (st.st_mode & 0111) != 0 ? 0755 : 0644);
    archive_entry_set_size(entry.get(), st.st_size);
    if (archive_write_header(w.a, entry.get()) != ARCHIVE_OK) {
      ::close(fd);
      return ArchiveError(w.a, absl::StrCat("cannot pack ", relative));
    }
    ssize_t n;
    while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) {
      if (archive_write_data(w.a, buffer.data(), static_cast<size_t>(n)) < 0) {
        ::close(fd);
        return ArchiveError(w.a, absl::StrCat("cannot pack ", relative));
      }
    }
    ::close(fd);
    packed.files++;
    if (progress) progress(static_cast<int64_t>(archive_filter_bytes(w.a, -1)), packed.files);
  }
  if (archive_write_close(w.a) != ARCHIVE_OK) {
    return ArchiveError(w.a, absl::StrCat("cannot write ", archive_path));
  }
  if (std::fclose(out.file) != 0 || out.failed) {
    out.file = nullptr;
    return absl::UnavailableError(absl::StrCat("cannot write ", archive_path));
  }
  out.file = nullptr;
  packed.archive_bytes = out.bytes;
  packed.sha256 = out.hash.HexDigest();
  return packed;
}

absl::Status UnpackWorkdir(const std::string& archive_path, const std::string& dir) {
  ArchiveReader r;
  r.a = archive_read_new();
  archive_read_support_format_tar(r.a);
  if (archive_read_open_filename(r.a, archive_path.c_str(), 1 << 20) != ARCHIVE_OK) {
    return ArchiveError(r.a, absl::StrCat("cannot read ", archive_path));
  }
  archive_entry* entry = nullptr;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const int got = archive_read_next_header(r.a, &entry);
    if (got == ARCHIVE_EOF) break;
    if (got != ARCHIVE_OK) return ArchiveError(r.a, absl::StrCat("cannot read ", archive_path));
    std::string name =
        archive_entry_pathname(entry) != nullptr ? archive_entry_pathname(entry) : "";
    absl::string_view relative = name;
    absl::ConsumePrefix(&relative, "./");
    absl::ConsumeSuffix(&relative, "/");
    const mode_t type = archive_entry_filetype(entry);
    if (!IsSafeRelativePath(relative) || (type != AE_IFREG && type != AE_IFDIR)) {
      return absl::InvalidArgumentError(absl::StrCat("program.workdir: the archive's entry '", name,
                                                     "' is not a file or folder that stays "
                                                     "inside the workdir"));
    }
    const fs::path target = fs::path(dir) / std::string(relative);
    std::error_code ec;
    if (type == AE_IFDIR) {
      fs::create_directories(target, ec);
      continue;
    }
    fs::create_directories(target.parent_path(), ec);
    // O_NOFOLLOW and O_EXCL: a path the archive already made a file cannot be written twice,
    // and nothing is written through a link.
    const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                          (archive_entry_perm(entry) & 0111) != 0 ? 0755 : 0644);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("program.workdir: cannot unpack '", name, "': ", std::strerror(errno)));
    }
    la_ssize_t n;
    while ((n = archive_read_data(r.a, buffer.data(), buffer.size())) > 0) {
      if (::write(fd, buffer.data(), static_cast<size_t>(n)) != n) {
        ::close(fd);
        return absl::UnavailableError(
            absl::StrCat("cannot write ", target.string(), ": ", std::strerror(errno)));
      }
    }
    ::close(fd);
    if (n < 0) return ArchiveError(r.a, absl::StrCat("cannot read ", archive_path));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
