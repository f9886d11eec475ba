// `trainyard submit` and `trainyard search submit` with a program whose workdir is a local
// folder: packed, sent to the coordinator once per content, and named in the spec by where it
// was kept.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/format.h"
#include "common/clock.h"
#include "common/formats/workdir_archive.h"
#include "yaml-cpp/yaml.h"

namespace trainyard::cli {
namespace {

namespace fs = std::filesystem;

// The size of each message of the upload (the coordinator takes at most 1 MiB).
constexpr size_t kChunkBytes = 1 << 20;

// The program mapping of a job spec (`program`) or of a search's template.
YAML::Node ProgramOf(YAML::Node& root) {
  if (!root.IsMap()) return YAML::Node();
  if (root["program"].IsMap()) return root["program"];
  if (root["template"].IsMap() && root["template"]["program"].IsMap()) {
    return root["template"]["program"];
  }
  return YAML::Node();
}

}  // namespace

absl::StatusOr<std::string> Client::UploadWorkdir(const std::string& yaml,
                                                  const std::string& spec_file) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const std::exception&) {
    return yaml;  // the coordinator names what is wrong with it
  }
  YAML::Node program = ProgramOf(root);
  if (!program || !program["workdir"].IsScalar()) return yaml;
  const std::string workdir = program["workdir"].Scalar();
  if (workdir.empty() || absl::StrContains(workdir, "://")) return yaml;
  const fs::path base =
      spec_file == "-" ? fs::current_path() : fs::absolute(spec_file).parent_path();
  fs::path folder = (base / workdir).lexically_normal();
  if (!folder.has_filename()) folder = folder.parent_path();  // "proj/." is "proj"
  const char* tmp = std::getenv("TMPDIR");
  std::string archive =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/trainyard-workdir-XXXXXX");
  const int fd = ::mkstemp(archive.data());
  if (fd < 0) return absl::UnavailableError("cannot make a temporary file for the workdir");
  ::close(fd);
  struct Remove {
    ~Remove() { std::remove(path.c_str()); }
    std::string path;
  } remove{archive};
  const bool tty = IsTerminal();
  absl::StatusOr<PackedWorkdir> packed =
      PackWorkdir(folder.string(), archive, kDefaultMaxWorkdirBytes, [&](int64_t bytes, int files) {
        if (tty)
          std::cerr << "\rpacking " << folder.string() << ": " << files << " files, "
                    << HumanBytes(bytes) << "\x1b[K" << std::flush;
      });
  if (tty) std::cerr << "\r\x1b[K";
  if (!packed.ok()) return packed.status();
  for (const std::string& link : packed->left_out) {
    std::cerr << "warning: left out of the workdir: " << link
              << " (a link leading outside it, a link to a folder, or not a file)\n";
  }
  absl::StatusOr<v1::UploadWorkdirResponse> sent =
      SendWorkdirArchive(archive, packed->sha256, packed->archive_bytes);
  if (!sent.ok()) return sent.status();
  std::cerr << "workdir " << folder.string() << ": " << packed->files << " files, "
            << HumanBytes(packed->file_bytes) << " -> " << sent->uri()
            << (sent->already_stored() ? " (already kept: nothing sent)" : "") << "\n";
  program["workdir"] = sent->uri();
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str());
}

absl::StatusOr<v1::UploadWorkdirResponse> Client::SendWorkdirArchive(const std::string& path,
                                                                     const std::string& sha256,
                                                                     int64_t size) {
  grpc::ClientContext context;
  // A large archive over a slow link takes a while: a minute, and a minute more per 64 MiB.
  context.set_deadline(absl::ToChronoTime(RealClock::Get().Now() + absl::Seconds(60) +
                                          absl::Seconds(60 * (size >> 26))));
  FollowLeader(context);
  v1::UploadWorkdirResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadWorkdirRequest>> writer =
      stub_->UploadWorkdir(&context, &response);
  v1::UploadWorkdirRequest first;
  first.set_sha256(sha256);
  first.set_size_bytes(size);
  bool open = writer->Write(first);
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(kChunkBytes);
  int64_t sent = 0;
  const bool tty = IsTerminal();
  while (open && in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.gcount() <= 0) break;
    v1::UploadWorkdirRequest chunk;
    chunk.set_data(buffer.data(), static_cast<size_t>(in.gcount()));
    // The coordinator may answer before the end (it already has the archive): writes then fail.
    open = writer->Write(chunk);
    sent += in.gcount();
    if (tty && size > 0) {
      std::cerr << "\ruploading the workdir: " << (100 * sent / size) << "% of " << HumanBytes(size)
                << "\x1b[K" << std::flush;
    }
  }
  if (tty) std::cerr << "\r\x1b[K";
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("uploading the workdir: ", status.error_message()));
  }
  return response;
}

}  // namespace trainyard::cli
