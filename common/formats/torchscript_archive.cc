#include "common/formats/torchscript_archive.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainyard {
namespace {

constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64EndLocator = 0x07064b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kCentralEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr int64_t kEndRecordSize = 22;
constexpr int64_t kMaxCommentSize = 0xffff;
constexpr int64_t kZip64LocatorSize = 20;
constexpr int64_t kZip64EndSize = 56;
constexpr int64_t kCentralEntrySize = 46;
constexpr int64_t kLocalHeaderSize = 30;
// A central directory larger than this is not a model's (a million entries of 64 bytes).
constexpr int64_t kMaxCentralDirectoryBytes = 64 << 20;
// Deflate cannot do better than 258 bytes from one length and one distance code of a bit each,
// so no entry inflates to more than this many times its compressed size.
constexpr int64_t kMaxDeflateRatio = 1032;

absl::Status Damaged(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("not a TorchScript archive: ", what));
}

// Little-endian fields of a zip record; reads past the end yield 0 and set `short_read`.
class Fields {
 public:
  explicit Fields(absl::string_view bytes) : bytes_(bytes) {}
  uint64_t At(size_t offset, size_t width) {
    if (offset + width > bytes_.size()) {
      short_read = true;
      return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[offset + i])) << (8 * i);
    }
    return v;
  }
  bool short_read = false;

 private:
  absl::string_view bytes_;
};

struct Entry {
  std::string name;
  int method = 0;
  int64_t compressed = 0;
  int64_t size = 0;
  int64_t offset = 0;  // of its local header
};

// The offset and size of the central directory, from the end record (or the zip64 one).
absl::StatusOr<std::pair<int64_t, int64_t>> FindCentralDirectory(int64_t size,
                                                                 const ArchiveReader& read) {
  if (size < kEndRecordSize) return Damaged("shorter than a zip end record");
  const int64_t tail_size =
      std::min(size, kEndRecordSize + kMaxCommentSize + kZip64LocatorSize + kZip64EndSize);
  auto tail_or = read(size - tail_size, tail_size);
  if (!tail_or.ok()) return tail_or.status();
  std::string tail = *std::move(tail_or);
  if (static_cast<int64_t>(tail.size()) != tail_size) return Damaged("short read of its end");
  Fields f(tail);
  int64_t end = -1;  // offset of the end record in `tail`
  for (int64_t i = tail_size - kEndRecordSize; i >= 0; --i) {
    if (f.At(i, 4) == kEndOfCentralDirectory) {
      end = i;
      break;
    }
  }
  if (end < 0) return Damaged("no zip end record");
  int64_t entries = f.At(end + 10, 2);
  int64_t cd_size = f.At(end + 12, 4);
  int64_t cd_offset = f.At(end + 16, 4);
  const bool zip64 = entries == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff;
  if (zip64) {
    const int64_t locator = end - kZip64LocatorSize;
    if (locator < 0 || f.At(locator, 4) != kZip64EndLocator) return Damaged("no zip64 locator");
    const int64_t record = static_cast<int64_t>(f.At(locator + 8, 8));
    if (record < 0 || record > size - kZip64EndSize) return Damaged("zip64 record out of range");
    auto bytes_or = read(record, kZip64EndSize);
    if (!bytes_or.ok()) return bytes_or.status();
    std::string bytes = *std::move(bytes_or);
    Fields z(bytes);
    if (z.At(0, 4) != kZip64End) return Damaged("bad zip64 end record");
    entries = static_cast<int64_t>(z.At(32, 8));
    cd_size = static_cast<int64_t>(z.At(40, 8));
    cd_offset = static_cast<int64_t>(z.At(48, 8));
    if (z.short_read) return Damaged("short zip64 end record");
  }
  if (entries < 0 || entries > kMaxArchiveEntries) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "TorchScript archive: ", entries, " entries (at most ", kMaxArchiveEntries, ")"));
  }
  if (cd_size < 0 || cd_size > kMaxCentralDirectoryBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("TorchScript archive: a central directory of ", cd_size, " bytes"));
  }
  if (cd_offset < 0 || cd_offset > size - cd_size) {
    return Damaged("central directory out of range");
  }
  return std::make_pair(cd_offset, cd_size);
}

// Refuses an entry whose offset, compressed size or size its archive of `size` bytes cannot hold.
// The values are unsigned 64-bit numbers from the file (negative here past 2^63): bounding the
// offset and compressed size by the file first is what lets the readers add header lengths to
// them without overflow; a size is bounded only by what its bytes can hold, so sums of sizes
// are checked where they are made.
absl::Status CheckEntryRange(const Entry& e, int64_t size) {
  if (e.offset < 0 || e.offset > size) {
    return Damaged(absl::StrCat("entry '", e.name, "' at offset ", static_cast<uint64_t>(e.offset),
                                ", past the end of its ", size, " bytes"));
  }
  if (e.compressed < 0 || e.compressed > size - e.offset) {
    return Damaged(absl::StrCat("entry '", e.name, "' of ", static_cast<uint64_t>(e.compressed),
                                " compressed bytes at offset ", e.offset, ", past the end of its ",
                                size, " bytes"));
  }
  // A stored entry is its bytes; a deflated one inflates to at most kMaxDeflateRatio times
  // them. Other methods are refused when read, and their sizes only add up (checked).
  const bool stored_differs = e.method == 0 && e.size != e.compressed;
  const bool inflates_past = e.method == 8 && e.size / kMaxDeflateRatio > e.compressed;
  if (e.size < 0 || stored_differs || inflates_past) {
    return Damaged(absl::StrCat("entry '", e.name, "' claims a size of ",
                                static_cast<uint64_t>(e.size), " bytes from ", e.compressed,
                                e.method == 0 ? " stored" : " compressed", " bytes"));
  }
  return absl::OkStatus();
}

// The entries of the central directory; sizes and offsets in the zip64 extra field where the
// 32-bit fields say 0xffffffff.
absl::StatusOr<std::vector<Entry>> ParseCentralDirectory(absl::string_view cd, int64_t size) {
  std::vector<Entry> entries;
  Fields f(cd);
  size_t at = 0;
  while (at + kCentralEntrySize <= cd.size()) {
    if (f.At(at, 4) != kCentralEntry) return Damaged("bad central directory entry");
    Entry e;
    e.method = static_cast<int>(f.At(at + 10, 2));
    e.compressed = static_cast<int64_t>(f.At(at + 20, 4));
    e.size = static_cast<int64_t>(f.At(at + 24, 4));
    const size_t name_len = f.At(at + 28, 2);
    const size_t extra_len = f.At(at + 30, 2);
    const size_t comment_len = f.At(at + 32, 2);
    e.offset = static_cast<int64_t>(f.At(at + 42, 4));
    const size_t name_at = at + kCentralEntrySize;
    if (name_at + name_len + extra_len + comment_len > cd.size()) {
      return Damaged("central directory entry past its end");
    }
    e.name = std::string(cd.substr(name_at, name_len));
    // The zip64 extra field holds, in this order, those of size, compressed size and offset
    // whose 32-bit field is saturated.
    absl::string_view extra = cd.substr(name_at + name_len, extra_len);
    Fields x(extra);
    for (size_t e_at = 0; e_at + 4 <= extra.size();) {
      const uint64_t id = x.At(e_at, 2);
      const size_t len = x.At(e_at + 2, 2);
      if (id == 0x0001) {
        // Only its own bytes: a short field must not borrow the next field's.
        Fields z(extra.substr(e_at + 4, len));
        size_t v = 0;
        if (e.size == 0xffffffff) e.size = static_cast<int64_t>(z.At(v, 8)), v += 8;
        if (e.compressed == 0xffffffff) e.compressed = static_cast<int64_t>(z.At(v, 8)), v += 8;
        if (e.offset == 0xffffffff) e.offset = static_cast<int64_t>(z.At(v, 8));
        if (z.short_read) return Damaged(absl::StrCat("short zip64 extra field of '", e.name, "'"));
      }
      e_at += 4 + len;
    }
    if (absl::Status s = CheckEntryRange(e, size); !s.ok()) return s;
    entries.push_back(std::move(e));
    at = name_at + name_len + extra_len + comment_len;
  }
  return entries;
}

absl::StatusOr<std::string> Inflate(absl::string_view in, int64_t size, absl::string_view name) {
  std::string out(static_cast<size_t>(size), '\0');
  z_stream z;
  std::memset(&z, 0, sizeof(z));
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return absl::InternalError("inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&z, Z_FINISH);
  const uLong produced = z.total_out;
  inflateEnd(&z);
  if (rc != Z_STREAM_END || static_cast<int64_t>(produced) != size) {
    return Damaged(absl::StrCat("'", name, "' does not inflate to its size"));
  }
  return out;
}

// The bytes of one entry: its local header gives where its data start.
absl::StatusOr<std::string> ReadEntry(const Entry& e, int64_t size, const ArchiveReader& read) {
  if (e.offset > size - kLocalHeaderSize) {
    return Damaged(absl::StrCat("local header of '", e.name, "' past the end"));
  }
  auto header_or = read(e.offset, kLocalHeaderSize);
  if (!header_or.ok()) return header_or.status();
  std::string header = *std::move(header_or);
  Fields h(header);
  if (h.At(0, 4) != kLocalHeader || h.short_read) {
    return Damaged(absl::StrCat("bad local header of '", e.name, "'"));
  }
  // At most 30 + 2 * 0xffff bytes; `e` is within `size` (CheckEntryRange), so the differences
  // below are never negative and nothing is added to an offset that could overflow.
  const int64_t header_bytes =
      kLocalHeaderSize + static_cast<int64_t>(h.At(26, 2)) + static_cast<int64_t>(h.At(28, 2));
  if (e.offset > size - header_bytes || e.compressed > size - header_bytes - e.offset) {
    return Damaged(absl::StrCat("'", e.name, "' past the end"));
  }
  const int64_t data = e.offset + header_bytes;
  auto bytes_or = read(data, e.compressed);
  if (!bytes_or.ok()) return bytes_or.status();
  std::string bytes = *std::move(bytes_or);
  if (static_cast<int64_t>(bytes.size()) != e.compressed) {
    return Damaged(absl::StrCat("short read of '", e.name, "'"));
  }
  if (e.method == 0) return bytes;
  if (e.method == 8) return Inflate(bytes, e.size, e.name);
  return Damaged(absl::StrCat("'", e.name, "' uses zip compression method ", e.method));
}

bool IsIdentifierChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Skips a string literal starting at `i` (a quote) and returns the index after it.
size_t SkipString(absl::string_view code, size_t i) {
  const char q = code[i];
  const bool triple = code.substr(i, 3) == std::string(3, q);
  size_t j = i + (triple ? 3 : 1);
  while (j < code.size()) {
    if (code[j] == '\\') {
      j += 2;
      continue;
    }
    if (triple ? code.substr(j, 3) == std::string(3, q) : code[j] == q) {
      return j + (triple ? 3 : 1);
    }
    if (!triple && code[j] == '\n') return j;  // unterminated: the line ends it
    ++j;
  }
  return code.size();
}

}  // namespace

void CollectTorchScriptOps(absl::string_view code, std::set<std::string>& ops) {
  size_t i = 0;
  while (i < code.size()) {
    const char c = code[i];
    if (c == '#') {
      const size_t eol = code.find('\n', i);
      i = eol == absl::string_view::npos ? code.size() : eol;
      continue;
    }
    if (c == '"' || c == '\'') {
      i = SkipString(code, i);
      continue;
    }
    const bool starts = (absl::ascii_isalpha(c) || c == '_') &&
                        (i == 0 || (!IsIdentifierChar(code[i - 1]) && code[i - 1] != '.'));
    if (!starts) {
      ++i;
      continue;
    }
    // A dotted name: a.b.c
    size_t j = i;
    while (j < code.size() && (IsIdentifierChar(code[j]) ||
                               (code[j] == '.' && j + 1 < code.size() &&
                                (absl::ascii_isalpha(code[j + 1]) || code[j + 1] == '_')))) {
      ++j;
    }
    const absl::string_view name = code.substr(i, j - i);
    size_t k = j;
    while (k < code.size() && (code[k] == ' ' || code[k] == '\t')) ++k;
    i = j;
    if (k >= code.size() || code[k] != '(') continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
    if (parts[0] == "torch" && parts.size() == 2) {
      ops.insert(absl::StrCat("aten::", parts[1]));
    } else if (name == "torch.autograd.grad" || name == "torch.autograd.backward") {
      ops.insert(absl::StrCat("aten::", parts[2]));
    } else if (parts[0] == "ops" && parts.size() == 3) {
      ops.insert(absl::StrCat(parts[1], "::", parts[2]));
    }
  }
}

absl::StatusOr<TorchScriptNeeds> ReadTorchScriptNeeds(int64_t size, const ArchiveReader& read) {
  auto where_or = FindCentralDirectory(size, read);
  if (!where_or.ok()) return where_or.status();
  auto where = *std::move(where_or);
  auto cd_or = read(where.first, where.second);
  if (!cd_or.ok()) return cd_or.status();
  std::string cd = *std::move(cd_or);
  if (static_cast<int64_t>(cd.size()) != where.second) {
    return Damaged("short read of its central directory");
  }
  auto entries_or = ParseCentralDirectory(cd, size);
  if (!entries_or.ok()) return entries_or.status();
  std::vector<Entry> entries = *std::move(entries_or);
  // torch.jit.save writes every record under one folder: ROOT/code/..., ROOT/version.
  TorchScriptNeeds needs;
  std::set<std::string> ops;
  int64_t code_bytes = 0;
  bool has_code = false;
  for (const Entry& e : entries) {
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos) continue;
    const absl::string_view inner = absl::string_view(e.name).substr(slash + 1);
    const bool version = inner == "version" || inner == ".data/version";
    const bool code = absl::StartsWith(inner, "code/") && absl::EndsWith(inner, ".py");
    // Entries may share bytes, so their sizes can add up past the file's, and past 2^63.
    if (absl::StartsWith(inner, "data/") &&
        __builtin_add_overflow(needs.tensor_bytes, e.size, &needs.tensor_bytes)) {
      return Damaged(absl::StrCat("its tensors' sizes add up past ",
                                  std::numeric_limits<int64_t>::max(), " bytes (at '", e.name,
                                  "')"));
    }
    if (!version && !code) continue;
    // Both what is read and what it inflates to are held in memory: the cap bounds both, and is
    // checked before adding so that a size near 2^63 cannot wrap the sum below it.
    const int64_t held = std::max(e.size, e.compressed);
    if (held > kMaxArchiveCodeBytes - code_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("TorchScript archive: more than ", kMaxArchiveCodeBytes >> 20,
                       " MiB of code (at '", e.name, "', of ", held, " bytes)"));
    }
    code_bytes += held;
    auto bytes_or = ReadEntry(e, size, read);
    if (!bytes_or.ok()) return bytes_or.status();
    std::string bytes = *std::move(bytes_or);
    if (version) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(bytes), &v) || v < 0) {
        return Damaged(absl::StrCat("version record '", absl::CHexEscape(bytes.substr(0, 16)),
                                    "' is not a number"));
      }
      needs.format_version = std::max(needs.format_version, v);
      continue;
    }
    has_code = true;
    CollectTorchScriptOps(bytes, ops);
  }
  if (!has_code) return Damaged("no code/ folder (a state dict or a pickled module?)");
  needs.ops.assign(ops.begin(), ops.end());
  return needs;
}

std::string MissingFromRuntime(const TorchScriptNeeds& needs,
                               const std::vector<std::string>& sorted_ops,
                               int64_t max_format_version) {
  std::vector<std::string> missing;
  for (const std::string& op : needs.ops) {
    if (!std::binary_search(sorted_ops.begin(), sorted_ops.end(), op)) missing.push_back(op);
  }
  std::string out = absl::StrJoin(missing, ", ");
  if (max_format_version > 0 && needs.format_version > max_format_version) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "archive format ", needs.format_version,
                    " (it loads up to ", max_format_version, ")");
  }
  return out;
}

absl::StatusOr<TorchScriptNeeds> ReadTorchScriptNeeds(ObjectStore& store, absl::string_view uri) {
  auto info_or = store.Head(uri);
  if (!info_or.ok()) return info_or.status();
  ObjectInfo info = *std::move(info_or);
  absl::StatusOr<TorchScriptNeeds> needs = ReadTorchScriptNeeds(
      info.size_bytes,
      [&](int64_t offset, int64_t length) { return store.GetRange(uri, offset, length); });
  if (!needs.ok() && !absl::StrContains(needs.status().message(), uri)) {
    return absl::Status(needs.status().code(), absl::StrCat(uri, ": ", needs.status().message()));
  }
  return needs;
}

}  // namespace trainyard
