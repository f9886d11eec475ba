#include "common/object_store.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file_object_store.h"
#include "common/uri.h"

namespace trainyard {

absl::StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(absl::string_view uri) {
  absl::StatusOr<Uri> parsed = ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme == "file") return std::unique_ptr<ObjectStore>(new FileObjectStore());
  if (parsed->scheme == "s3") {
    return absl::UnimplementedError(
        absl::StrCat("s3:// object store is not built yet (", uri, ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", uri, "': no object store for scheme '", parsed->scheme, "'"));
}

}  // namespace trainyard
