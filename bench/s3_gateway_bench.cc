// The cost of the agent's S3 gateway: a file put and got with the S3 client straight to the
// endpoint in the environment, then through a gateway started here with a task's key for the
// prefix. Prints "direct PUT_S GET_S" and "gateway PUT_S GET_S"; checks every download.
//
//   s3_gateway_bench FILE s3://BUCKET/PREFIX

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "common/storage/s3_client.h"
#include "common/storage/s3_object_store.h"
#include "common/storage/uri.h"
#include "worker/agent/s3_gateway.h"

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Puts and gets `file` at `uri` with `options`; false when the copy back differs.
bool Round(const char* name, const trainyard::S3ClientOptions& options, const std::string& file,
           const std::string& uri) {
  trainyard::S3ObjectStore store(std::make_unique<trainyard::S3Client>(options));
  const Clock::time_point t0 = Clock::now();
  absl::Status put = store.PutFile(uri, file);
  const double put_s = Since(t0);
  const std::string back = file + ".back";
  const Clock::time_point t1 = Clock::now();
  absl::StatusOr<trainyard::ObjectInfo> got = store.GetToFile(uri, back);
  const double get_s = Since(t1);
  if (!put.ok() || !got.ok()) {
    std::fprintf(stderr, "%s: %s %s\n", name, put.ToString().c_str(),
                 got.status().ToString().c_str());
    return false;
  }
  const bool same = Read(back) == Read(file);
  std::remove(back.c_str());
  std::printf("%s %.3f %.3f\n", name, put_s, get_s);
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: s3_gateway_bench FILE s3://BUCKET/PREFIX\n");
    return 2;
  }
  const std::string file = argv[1];
  absl::StatusOr<trainyard::Uri> prefix = trainyard::ParseUri(argv[2]);
  absl::StatusOr<trainyard::S3ClientOptions> upstream =
      trainyard::S3ClientOptionsFromEnv([](const char* name) { return std::getenv(name); });
  if (!prefix.ok() || prefix->scheme != "s3" || !upstream.ok()) {
    std::fprintf(stderr, "need an s3:// prefix and S3 settings in the environment\n");
    return 2;
  }
  trainyard::S3GatewayOptions gateway_options;
  gateway_options.upstream = *upstream;
  absl::StatusOr<std::unique_ptr<trainyard::S3Gateway>> gateway =
      trainyard::S3Gateway::Start(gateway_options);
  if (!gateway.ok()) return 1;
  trainyard::ObjectScope scope;
  scope.write.push_back({prefix->authority, prefix->path});
  const std::map<std::string, std::string> env = (*gateway)->Grant("bench", scope);
  absl::StatusOr<trainyard::S3ClientOptions> through =
      trainyard::S3ClientOptionsFromEnv([&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      });
  if (!through.ok()) return 1;
  const std::string base = prefix->ToString();
  const bool ok = Round("direct", *upstream, file, base + "/direct.bin") &&
                  Round("gateway", *through, file, base + "/gateway.bin");
  return ok ? 0 : 1;
}
