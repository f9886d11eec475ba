// An S3 endpoint's XML answer (listings, errors, multipart uploads), as any endpoint an operator
// configures may send it: every element the client reads, and their text unescaped.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/storage/s3_client_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view xml(reinterpret_cast<const char*>(data), size);
  using trainyard::s3_internal::XmlElements;
  using trainyard::s3_internal::XmlText;
  for (const char* tag : {"Contents", "CommonPrefixes", "Error", "Upload", "Part"}) {
    for (absl::string_view element : XmlElements(xml, tag)) {
      for (const char* field : {"Key", "Size", "ETag", "Prefix", "Code", "Message", "UploadId",
                                "PartNumber", "LastModified"}) {
        (void)XmlText(element, field);
      }
    }
  }
  for (const char* field : {"IsTruncated", "NextContinuationToken", "UploadId", "Code"}) {
    (void)XmlText(xml, field);
  }
  return 0;
}
