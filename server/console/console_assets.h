#ifndef TRAINYARD_SERVER_CONSOLE_CONSOLE_ASSETS_H_
#define TRAINYARD_SERVER_CONSOLE_CONSOLE_ASSETS_H_

// The console's pages, scripts, styles and chart library, compiled into the coordinator at build
// time from server/console/web/ and third_party/uplot/ (cmake/embed_files.cmake): nothing is
// fetched at run time.

#include <string>

#include "absl/strings/string_view.h"

namespace trainyard {

struct ConsoleAsset {
  absl::string_view content_type;
  absl::string_view body;
  std::string etag;  // a hash of the body, quoted
};

// The asset served at `path` ("/", "/static/console.js", ...); null when there is none.
const ConsoleAsset* FindConsoleAsset(absl::string_view path);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CONSOLE_CONSOLE_ASSETS_H_
