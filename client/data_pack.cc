#include "client/data_pack.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/formats/safetensors.h"

namespace trainyard::cli {
namespace {

struct Dtype {
  const char* name;  // safetensors
  const char* npy;   // NumPy descr
  int size;
  bool integer;
  bool is_unsigned;  // unsigned values (U8, U16, BOOL)
};
constexpr Dtype kDtypes[] = {
    {"F64", "<f8", 8, false, false}, {"F32", "<f4", 4, false, false},
    {"F16", "<f2", 2, false, false}, {"BF16", "", 2, false, false},
    {"I64", "<i8", 8, true, false},  {"I32", "<i4", 4, true, false},
    {"I16", "<i2", 2, true, false},  {"I8", "|i1", 1, true, false},
    {"U16", "<u2", 2, true, true},   {"U8", "|u1", 1, true, true},
    {"BOOL", "|b1", 1, false, true},
};

const Dtype* FindDtype(absl::string_view name) {
  static const std::map<std::string, std::string> kAliases = {
      {"float64", "F64"}, {"float32", "F32"}, {"float16", "F16"}, {"bfloat16", "BF16"},
      {"int64", "I64"},   {"int32", "I32"},   {"int16", "I16"},   {"int8", "I8"},
      {"uint16", "U16"},  {"uint8", "U8"}};
  std::string upper = absl::AsciiStrToUpper(name);
  if (auto it = kAliases.find(absl::AsciiStrToLower(name)); it != kAliases.end()) {
    upper = it->second;
  }
  for (const Dtype& d : kDtypes) {
    if (upper == d.name) return &d;
  }
  return nullptr;
}

const Dtype* FindNpyDtype(absl::string_view descr) {
  for (const Dtype& d : kDtypes) {
    if (*d.npy != '\0' && descr == d.npy) return &d;
  }
  // One-byte types may be written with '<' or '=' as well as '|'.
  if (descr.size() == 3 && (descr[0] == '<' || descr[0] == '=') && descr[2] == '1') {
    return FindNpyDtype(absl::StrCat("|", descr.substr(1)));
  }
  return nullptr;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// A whole input file mapped read-only.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      close(fd);
      return Errno("cannot stat", path);
    }
    void* base = nullptr;
    if (st.st_size > 0) {
      base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (base == MAP_FAILED) {
        close(fd);
        return Errno("cannot map", path);
      }
      madvise(base, static_cast<size_t>(st.st_size), MADV_SEQUENTIAL);
    }
    close(fd);
    return std::unique_ptr<MappedFile>(
        new MappedFile(static_cast<const char*>(base), static_cast<size_t>(st.st_size)));
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
  }
  absl::string_view bytes() const { return absl::string_view(data_, size_); }

 private:
  MappedFile(const char* data, size_t size) : data_(data), size_(size) {}
  const char* data_;
  size_t size_;
};

// An .npy array: its dtype, shape and where its data starts in the file.
struct NpyArray {
  std::string tensor;
  std::string path;
  const Dtype* dtype = nullptr;
  std::vector<int64_t> shape;
  std::unique_ptr<MappedFile> file;
  size_t data_offset = 0;
  int64_t row_bytes = 0;
};

// The value of `key` in the header dict of an .npy file ("{'descr': '<f4', ...}").
absl::StatusOr<std::string> DictValue(absl::string_view dict, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "':");
  const size_t at = dict.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("no '", key, "' in its header"));
  }
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(dict.substr(at + quoted.size()));
  size_t end;
  if (absl::StartsWith(rest, "'")) {
    end = rest.find('\'', 1);
    if (end == absl::string_view::npos) return absl::InvalidArgumentError("unterminated string");
    return std::string(rest.substr(1, end - 1));
  }
  if (absl::StartsWith(rest, "(")) {
    end = rest.find(')');
    if (end == absl::string_view::npos) return absl::InvalidArgumentError("unterminated tuple");
    return std::string(rest.substr(1, end - 1));
  }
  end = rest.find_first_of(",}");
  return std::string(absl::StripAsciiWhitespace(rest.substr(0, end)));
}

absl::StatusOr<NpyArray> OpenNpy(const PackColumn& column) {
  NpyArray array;
  array.tensor = column.tensor;
  array.path = column.npy_path;
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(column.npy_path);
  if (!file.ok()) return file.status();
  array.file = *std::move(file);
  const absl::string_view bytes = array.file->bytes();
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(column.npy_path, ": ", why));
  };
  if (bytes.size() < 10 || bytes.substr(0, 6) != "\x93NUMPY") return bad("not an .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) |
                 (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) {
      header_len = (header_len << 8) | static_cast<unsigned char>(bytes[8 + i]);
    }
    header_start = 12;
  } else {
    return bad(absl::StrCat("unsupported .npy version ", major));
  }
  if (header_start + header_len > bytes.size()) return bad("truncated header");
  const absl::string_view dict = bytes.substr(header_start, header_len);
  absl::StatusOr<std::string> descr = DictValue(dict, "descr");
  absl::StatusOr<std::string> fortran = DictValue(dict, "fortran_order");
  absl::StatusOr<std::string> shape = DictValue(dict, "shape");
  for (const auto* v : {&descr, &fortran, &shape}) {
    if (!v->ok()) return bad(v->status().message());
  }
  if (*fortran != "False")
    return bad("Fortran-order arrays are not supported (np.ascontiguousarray)");
  array.dtype = FindNpyDtype(*descr);
  if (array.dtype == nullptr) {
    return bad(absl::StrCat("dtype '", *descr,
                            "' is not one of float64/32/16, int64/32/16/8, uint8, bool "
                            "(little-endian)"));
  }
  // Unchecked, (2^61, 8) of <f8 wraps to 0 bytes: a file with no data would be read past its end.
  int64_t expected = array.dtype->size;  // the bytes of a sample, then of them all
  bool wraps = false;
  for (absl::string_view dim : absl::StrSplit(*shape, ',', absl::SkipWhitespace())) {
    int64_t d;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &d) || d < 0) {
      return bad(absl::StrCat("bad shape (", *shape, ")"));
    }
    if (!array.shape.empty()) wraps |= __builtin_mul_overflow(expected, d, &expected);
    array.shape.push_back(d);
  }
  if (array.shape.empty()) return bad("a scalar has no samples");
  array.row_bytes = expected;
  wraps |= __builtin_mul_overflow(expected, array.shape[0], &expected);
  if (wraps) return bad(absl::StrCat("shape (", *shape, ") of ", *descr, " is over 2^63 bytes"));
  array.data_offset = header_start + header_len;
  const size_t held = bytes.size() - array.data_offset;
  if (held != static_cast<uint64_t>(expected)) {
    return bad(absl::StrCat("holds ", held, " bytes of data, its shape (", *shape, ") says ",
                            expected, " (truncated?)"));
  }
  return array;
}

// Per-field extremes of an integer tensor of `rows` samples, or nothing for other tensors.
void AddExtremes(const std::string& name, const Dtype& dtype, const std::vector<int64_t>& shape,
                 absl::string_view data, int64_t rows, std::map<std::string, std::string>& meta) {
  if (!dtype.integer || rows == 0 || shape.size() > 2) return;
  const int64_t fields = shape.size() == 2 ? shape[1] : 1;
  if (fields == 0) return;
  std::vector<int64_t> lo(static_cast<size_t>(fields), std::numeric_limits<int64_t>::max());
  std::vector<int64_t> hi(static_cast<size_t>(fields), std::numeric_limits<int64_t>::min());
  const char* p = data.data();
  for (int64_t i = 0; i < rows * fields; ++i, p += dtype.size) {
    int64_t v = 0;
    switch (dtype.size) {
      case 8: {
        int64_t x;
        std::memcpy(&x, p, 8);
        v = x;
        break;
      }
      case 4: {
        int32_t x;
        std::memcpy(&x, p, 4);
        v = x;
        break;
      }
      case 2: {
        if (dtype.is_unsigned) {
          uint16_t x;
          std::memcpy(&x, p, 2);
          v = x;
        } else {
          int16_t x;
          std::memcpy(&x, p, 2);
          v = x;
        }
        break;
      }
      default:
        v = dtype.is_unsigned ? static_cast<unsigned char>(*p) : static_cast<signed char>(*p);
    }
    const size_t f = static_cast<size_t>(i % fields);
    lo[f] = std::min(lo[f], v);
    hi[f] = std::max(hi[f], v);
  }
  meta["trainyard.min." + name] = absl::StrJoin(lo, ",");
  meta["trainyard.max." + name] = absl::StrJoin(hi, ",");
}

// Writes shards under temporary names, renaming them all at the end (Finish); the destructor
// removes what was not finished.
class ShardWriter {
 public:
  explicit ShardWriter(const PackOptions& options) : options_(options) {}
  ~ShardWriter() {
    for (const std::string& part : parts_) std::remove(part.c_str());
  }

  struct Tensor {
    std::string name;
    const Dtype* dtype;
    std::vector<int64_t> sample_shape;
    absl::string_view data;  // rows * row bytes
  };

  absl::Status Write(const std::vector<Tensor>& tensors, int64_t rows,
                     std::map<std::string, std::string> meta = {}) {
    std::vector<TensorView> views;
    meta["format"] = "trainyard-data/1";
    for (const Tensor& t : tensors) {
      std::vector<int64_t> shape = {rows};
      shape.insert(shape.end(), t.sample_shape.begin(), t.sample_shape.end());
      views.push_back(TensorView{t.name, t.dtype->name, shape, t.data});
      AddExtremes(t.name, *t.dtype, shape, t.data, rows, meta);
    }
    absl::StatusOr<std::string> header = EncodeSafetensorsHeader(views, meta);
    if (!header.ok()) return header.status();
    const std::string path = ShardPath(static_cast<int64_t>(parts_.size()));
    const std::string part = path + ".part";
    parts_.push_back(part);
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    out.write(header->data(), static_cast<std::streamsize>(header->size()));
    int64_t bytes = static_cast<int64_t>(header->size());
    for (const TensorView& v : views) {
      out.write(v.data.data(), static_cast<std::streamsize>(v.data.size()));
      bytes += static_cast<int64_t>(v.data.size());
    }
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", part));
    result_.samples += rows;
    result_.bytes += bytes;
    if (options_.progress) options_.progress(static_cast<int64_t>(parts_.size()), result_.samples);
    return absl::OkStatus();
  }

  absl::StatusOr<PackResult> Finish() {
    if (parts_.empty()) return absl::InvalidArgumentError("the input holds no samples");
    for (size_t i = 0; i < parts_.size(); ++i) {
      const std::string path = ShardPath(static_cast<int64_t>(i));
      if (std::rename(parts_[i].c_str(), path.c_str()) != 0) return Errno("cannot rename", path);
      result_.shards.push_back(path);
    }
    parts_.clear();
    return result_;
  }

  std::string ShardPath(int64_t i) const {
    return absl::StrFormat("%s-%05d.safetensors", options_.prefix, i);
  }

 private:
  const PackOptions& options_;
  std::vector<std::string> parts_;
  PackResult result_;
};

absl::Status CheckNoShards(const std::string& prefix) {
  glob_t matches;
  const std::string pattern = prefix + "-[0-9]*.safetensors";
  const int rc = glob(pattern.c_str(), 0, nullptr, &matches);
  const std::string first = rc == 0 && matches.gl_pathc > 0 ? matches.gl_pathv[0] : "";
  globfree(&matches);
  if (!first.empty()) {
    return absl::AlreadyExistsError(
        absl::StrCat(first, " exists: remove the old shards or pick another prefix"));
  }
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    return absl::NotFoundError(absl::StrCat("no folder ", parent.string()));
  }
  return absl::OkStatus();
}

int64_t RowsPerShard(int64_t shard_bytes, int64_t row_bytes) {
  return std::max<int64_t>(1, shard_bytes / std::max<int64_t>(1, row_bytes));
}

absl::StatusOr<PackResult> PackNpy(const PackOptions& options) {
  std::vector<NpyArray> arrays;
  int64_t row_bytes = 0;
  for (const PackColumn& column : options.tensors) {
    absl::StatusOr<NpyArray> array = OpenNpy(column);
    if (!array.ok()) return array.status();
    if (!arrays.empty() && array->shape[0] != arrays.front().shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(array->path, " has ", array->shape[0],
                                                     " samples, ", arrays.front().path, " has ",
                                                     arrays.front().shape[0]));
    }
    // With samples, each row lies in its mapped file: no overflow. Without, a row's size is moot.
    row_bytes += array->shape[0] > 0 ? array->row_bytes : 0;
    arrays.push_back(*std::move(array));
  }
  const int64_t samples = arrays.front().shape[0];
  // Rows of no bytes are bounded by nothing: (2^62, 0) would make 2^34 empty shards.
  if (row_bytes == 0) return absl::InvalidArgumentError(arrays.front().path + ": no bytes to pack");
  const int64_t per_shard = RowsPerShard(options.shard_bytes, row_bytes);
  ShardWriter writer(options);
  for (int64_t first = 0; first < samples; first += per_shard) {
    const int64_t rows = std::min(per_shard, samples - first);
    std::vector<ShardWriter::Tensor> tensors;
    for (const NpyArray& a : arrays) {
      tensors.push_back(ShardWriter::Tensor{
          a.tensor, a.dtype, std::vector<int64_t>(a.shape.begin() + 1, a.shape.end()),
          a.file->bytes().substr(a.data_offset + static_cast<size_t>(first * a.row_bytes),
                                 static_cast<size_t>(rows * a.row_bytes))});
    }
    if (absl::Status s = writer.Write(tensors, rows); !s.ok()) return s;
  }
  return writer.Finish();
}

// One CSV record's fields (RFC 4180 quoting: "a,b" and "" inside quotes).
absl::StatusOr<std::vector<std::string>> SplitCsvLine(absl::string_view line) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
    } else if (c != '\r') {
      field += c;
    }
  }
  if (quoted) return absl::InvalidArgumentError("unterminated quote");
  fields.push_back(std::move(field));
  return fields;
}

uint16_t ToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exponent = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00);  // overflow: infinity
  if (exponent <= 0) {                                              // subnormal or zero
    if (exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000;
    const int shift = 14 - exponent;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(sign | half);
}

uint16_t ToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

// Appends `text` as one value of `dtype` to `out`; INVALID_ARGUMENT saying why not.
absl::Status AppendValue(absl::string_view text, const Dtype& dtype, std::string& out) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return absl::InvalidArgumentError("empty value");
  char buf[8];
  if (!dtype.integer && std::string(dtype.name) != "BOOL") {
    double v;
    if (!absl::SimpleAtod(text, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a number"));
    }
    const std::string name = dtype.name;
    if (name == "F64") {
      std::memcpy(buf, &v, 8);
    } else if (name == "F32") {
      const float x = static_cast<float>(v);
      std::memcpy(buf, &x, 4);
    } else {
      const uint16_t x =
          name == "F16" ? ToHalf(static_cast<float>(v)) : ToBfloat16(static_cast<float>(v));
      std::memcpy(buf, &x, 2);
    }
    out.append(buf, static_cast<size_t>(dtype.size));
    return absl::OkStatus();
  }
  int64_t v;
  if (std::string(dtype.name) == "BOOL") {
    const std::string lower = absl::AsciiStrToLower(text);
    if (lower == "true" || lower == "1") {
      v = 1;
    } else if (lower == "false" || lower == "0") {
      v = 0;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a boolean"));
    }
  } else if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an integer"));
  }
  const int bits = dtype.size * 8;
  const bool is_unsigned = dtype.is_unsigned;
  const int64_t lo = is_unsigned ? 0 : (bits == 64 ? INT64_MIN : -(int64_t{1} << (bits - 1)));
  const int64_t hi =
      bits == 64 ? INT64_MAX
                 : (is_unsigned ? (int64_t{1} << bits) - 1 : (int64_t{1} << (bits - 1)) - 1);
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(v, " does not fit ", dtype.name));
  }
  std::memcpy(buf, &v, 8);  // little-endian: the low bytes first
  out.append(buf, static_cast<size_t>(dtype.size));
  return absl::OkStatus();
}

absl::StatusOr<PackResult> PackCsv(const PackOptions& options) {
  std::ifstream in(options.csv_path);
  if (!in) {
    errno = errno == 0 ? ENOENT : errno;
    return Errno("cannot open", options.csv_path);
  }
  std::string line;
  if (!std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat(options.csv_path, ": empty, no header line"));
  }
  absl::StatusOr<std::vector<std::string>> header = SplitCsvLine(line);
  if (!header.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.csv_path, " line 1: ", header.status().message()));
  }
  std::map<std::string, size_t> position;
  for (size_t i = 0; i < header->size(); ++i) {
    position[std::string(absl::StripAsciiWhitespace((*header)[i]))] = i;
  }
  struct Source {
    const PackColumn* column;
    const Dtype* dtype;
    std::vector<size_t> fields;
    std::string buffer;
  };
  std::vector<Source> sources;
  int64_t row_bytes = 0;
  for (const PackColumn& column : options.tensors) {
    Source s{&column, FindDtype(column.dtype), {}, {}};
    if (s.dtype == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--columns: tensor '", column.tensor, "': unknown dtype '", column.dtype,
                       "' (F64 F32 F16 BF16 I64 I32 I16 I8 U16 U8 BOOL)"));
    }
    for (const std::string& name : column.columns) {
      auto it = position.find(name);
      if (it == position.end()) {
        return absl::InvalidArgumentError(absl::StrCat(options.csv_path, ": no column '", name,
                                                       "' (it has ", absl::StrJoin(*header, ", "),
                                                       ")"));
      }
      s.fields.push_back(it->second);
    }
    row_bytes += s.dtype->size * static_cast<int64_t>(s.fields.size());
    sources.push_back(std::move(s));
  }
  const int64_t per_shard = RowsPerShard(options.shard_bytes, row_bytes);
  ShardWriter writer(options);
  int64_t rows = 0;
  auto flush = [&]() -> absl::Status {
    if (rows == 0) return absl::OkStatus();
    std::vector<ShardWriter::Tensor> tensors;
    for (const Source& s : sources) {
      std::vector<int64_t> sample;
      if (s.fields.size() > 1) sample.push_back(static_cast<int64_t>(s.fields.size()));
      tensors.push_back(
          ShardWriter::Tensor{s.column->tensor, s.dtype, std::move(sample), s.buffer});
    }
    absl::Status status = writer.Write(tensors, rows);
    for (Source& s : sources) s.buffer.clear();
    rows = 0;
    return status;
  };
  for (int64_t number = 2; std::getline(in, line); ++number) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<std::vector<std::string>> fields = SplitCsvLine(line);
    if (!fields.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.csv_path, " line ", number, ": ", fields.status().message()));
    }
    if (fields->size() != header->size()) {
      return absl::InvalidArgumentError(absl::StrCat(options.csv_path, " line ", number, ": ",
                                                     fields->size(), " fields, the header has ",
                                                     header->size()));
    }
    for (Source& s : sources) {
      for (size_t f : s.fields) {
        if (absl::Status v = AppendValue((*fields)[f], *s.dtype, s.buffer); !v.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              options.csv_path, " line ", number, ", column '", (*header)[f], "': ", v.message()));
        }
      }
    }
    if (++rows == per_shard) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
  }
  if (in.bad()) return absl::UnavailableError(absl::StrCat("error reading ", options.csv_path));
  if (absl::Status s = flush(); !s.ok()) return s;
  return writer.Finish();
}

}  // namespace

absl::StatusOr<std::vector<PackColumn>> ParseCsvColumns(const std::string& spec) {
  std::vector<PackColumn> out;
  for (absl::string_view part : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    const std::pair<absl::string_view, absl::string_view> named = absl::StrSplit(part, '=');
    const size_t colon = named.second.rfind(':');
    if (named.first.empty() || named.second.empty() || colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--columns: '", part, "' is not TENSOR=COLUMN[,COLUMN...]:DTYPE"));
    }
    PackColumn column;
    column.tensor = std::string(absl::StripAsciiWhitespace(named.first));
    column.dtype = std::string(absl::StripAsciiWhitespace(named.second.substr(colon + 1)));
    for (absl::string_view c : absl::StrSplit(named.second.substr(0, colon), ',')) {
      c = absl::StripAsciiWhitespace(c);
      if (c.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--columns: empty column name in '", part, "'"));
      }
      column.columns.emplace_back(c);
    }
    if (FindDtype(column.dtype) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--columns: unknown dtype '", column.dtype,
                       "' (F64 F32 F16 BF16 I64 I32 I16 I8 U16 U8 BOOL)"));
    }
    out.push_back(std::move(column));
  }
  if (out.empty()) return absl::InvalidArgumentError("--columns: name at least one tensor");
  return out;
}

// Text as byte tokens: the files are checked readable first, then streamed into shards of
// shard_bytes tokens each, never whole in memory.
absl::StatusOr<PackResult> PackText(const PackOptions& options) {
  if (options.tokenizer != "bytes") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer: unknown tokenizer '", options.tokenizer, "' (bytes)"));
  }
  for (const std::string& path : options.text_paths) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return absl::NotFoundError(absl::StrCat("no text file ", path));
    }
    std::ifstream probe(path, std::ios::binary);
    if (!probe) return Errno("cannot open", path);
  }
  const Dtype* u8 = FindDtype("U8");
  ShardWriter writer(options);
  std::string shard;
  shard.reserve(static_cast<size_t>(std::min<int64_t>(options.shard_bytes, int64_t{64} << 20)));
  auto flush = [&]() -> absl::Status {
    if (shard.empty()) return absl::OkStatus();
    absl::Status s = writer.Write({ShardWriter::Tensor{"tokens", u8, {}, shard}},
                                  static_cast<int64_t>(shard.size()), {{"tokenizer", "bytes"}});
    shard.clear();
    return s;
  };
  std::vector<char> buffer(1 << 20);
  for (const std::string& path : options.text_paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Errno("cannot open", path);
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const int64_t got = in.gcount();
      for (int64_t done = 0; done < got;) {
        const int64_t room = options.shard_bytes - static_cast<int64_t>(shard.size());
        const int64_t take = std::min(room, got - done);
        shard.append(buffer.data() + done, static_cast<size_t>(take));
        done += take;
        if (static_cast<int64_t>(shard.size()) == options.shard_bytes) {
          if (absl::Status s = flush(); !s.ok()) return s;
        }
      }
    }
    if (in.bad()) return Errno("cannot read", path);
  }
  if (absl::Status s = flush(); !s.ok()) return s;
  return writer.Finish();
}

absl::StatusOr<PackResult> PackShards(const PackOptions& options) {
  if (options.shard_bytes < 1) return absl::InvalidArgumentError("--shard-size must be > 0");
  if (!options.text_paths.empty()) {
    if (!options.tensors.empty() || !options.csv_path.empty()) {
      return absl::InvalidArgumentError("text input takes no tensors or CSV columns");
    }
    if (absl::Status s = CheckNoShards(options.prefix); !s.ok()) return s;
    return PackText(options);
  }
  if (options.tensors.empty()) return absl::InvalidArgumentError("no tensors to pack");
  std::map<std::string, int> names;
  for (const PackColumn& c : options.tensors) {
    if (++names[c.tensor] > 1) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", c.tensor, "' named twice"));
    }
    if (options.csv_path.empty() == c.npy_path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", c.tensor, "': give either an .npy file or CSV columns"));
    }
  }
  if (absl::Status s = CheckNoShards(options.prefix); !s.ok()) return s;
  return options.csv_path.empty() ? PackNpy(options) : PackCsv(options);
}

}  // namespace trainyard::cli
