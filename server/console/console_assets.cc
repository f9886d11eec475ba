#include "server/console/console_assets.h"

#include <cstddef>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace trainyard {
namespace embedded {
struct File {
  const char* name;
  const unsigned char* data;
  std::size_t size;
};
extern const File kFiles[];
extern const std::size_t kFileCount;
}  // namespace embedded

namespace {

absl::string_view ContentTypeOf(absl::string_view name) {
  if (absl::EndsWith(name, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(name, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(name, ".css")) return "text/css; charset=utf-8";
  if (absl::EndsWith(name, ".svg")) return "image/svg+xml";
  return "text/plain; charset=utf-8";
}

const std::map<std::string, ConsoleAsset>& Assets() {
  static const auto* assets = [] {
    auto* out = new std::map<std::string, ConsoleAsset>();
    for (std::size_t i = 0; i < embedded::kFileCount; ++i) {
      const embedded::File& f = embedded::kFiles[i];
      const absl::string_view body(reinterpret_cast<const char*>(f.data), f.size);
      ConsoleAsset asset{ContentTypeOf(f.name), body,
                         absl::StrCat("\"", Sha256Hex(body).substr(0, 16), "\"")};
      const std::string name(f.name);
      // The page is the same at every path of the console's own; the rest under /static/.
      if (name == "index.html") (*out)["/"] = asset;
      (*out)[absl::StrCat("/static/", name)] = asset;
    }
    return out;
  }();
  return *assets;
}

}  // namespace

const ConsoleAsset* FindConsoleAsset(absl::string_view path) {
  const auto& assets = Assets();
  auto it = assets.find(std::string(path));
  return it == assets.end() ? nullptr : &it->second;
}

}  // namespace trainyard
