#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/storage/s3_client_internal.h"

namespace trainyard::s3_internal {

namespace {

std::string XmlUnescape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == absl::string_view::npos) {
      out.push_back(s[i]);
      continue;
    }
    absl::string_view entity = s.substr(i + 1, semi - i - 1);
    uint32_t cp = 0;
    bool numeric = false;
    if (entity == "amp") {
      out.push_back('&');
    } else if (entity == "lt") {
      out.push_back('<');
    } else if (entity == "gt") {
      out.push_back('>');
    } else if (entity == "quot") {
      out.push_back('"');
    } else if (entity == "apos") {
      out.push_back('\'');
    } else if (absl::StartsWith(entity, "#x") || absl::StartsWith(entity, "#X")) {
      numeric = absl::SimpleHexAtoi(entity.substr(2), &cp);
    } else if (absl::StartsWith(entity, "#")) {
      numeric = absl::SimpleAtoi(entity.substr(1), &cp);
    } else {
      out.append(s.data() + i, semi - i + 1);
    }
    if (numeric) {  // UTF-8 encode
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
    i = semi;
  }
  return out;
}

}  // namespace

// The raw contents of every <tag>...</tag> in `xml`, in order (tags we read never nest in
// themselves).
std::vector<absl::string_view> XmlElements(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> out;
  const std::string open = absl::StrCat("<", tag, ">");
  const std::string close = absl::StrCat("</", tag, ">");
  size_t pos = 0;
  while (true) {
    const size_t start = xml.find(open, pos);
    if (start == absl::string_view::npos) break;
    const size_t end = xml.find(close, start + open.size());
    if (end == absl::string_view::npos) break;
    out.push_back(xml.substr(start + open.size(), end - start - open.size()));
    pos = end + close.size();
  }
  return out;
}

std::string XmlText(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> e = XmlElements(xml, tag);
  return e.empty() ? std::string() : XmlUnescape(e.front());
}

std::string XmlEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

std::string StripQuotes(absl::string_view etag) {
  absl::string_view e = absl::StripAsciiWhitespace(etag);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return std::string(e);
}

}  // namespace trainyard::s3_internal
