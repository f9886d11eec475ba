#include "common/formats/shard_reader.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/parallel.h"
#include "common/sha256.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kFilePrefix = "file://";

std::string LocalPath(const std::string& uri) {
  return absl::StartsWith(uri, kFilePrefix) ? uri.substr(kFilePrefix.size()) : uri;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// A file descriptor closed when it goes out of scope unless released.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

MappedShard::MappedShard(int fd, void* base, size_t length, std::vector<absl::string_view> columns)
    : fd_(fd), base_(base), length_(length), columns_(std::move(columns)) {}

MappedShard::~MappedShard() {
  munmap(base_, length_);
  close(fd_);  // also releases the shared lock that keeps a cached file from eviction
}

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(std::shared_ptr<ObjectStore> store,
                                                               ShardIndex index,
                                                               std::vector<std::string> columns,
                                                               ShardReaderOptions options) {
  bool remote = false;
  std::vector<std::vector<Range>> ranges;
  for (const ShardInfo& shard : index.shards) {
    if (!absl::StartsWith(shard.uri, kFilePrefix)) remote = true;
    std::vector<Range>& mine = ranges.emplace_back();
    for (const std::string& name : columns) {
      auto slot = std::find_if(shard.header.tensors.begin(), shard.header.tensors.end(),
                               [&](const SafetensorsSlot& t) { return t.name == name; });
      if (slot == shard.header.tensors.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "' not in ", LocalPath(shard.uri)));
      }
      mine.push_back(Range{static_cast<int64_t>(shard.header.data_start + slot->begin),
                           static_cast<int64_t>(slot->end - slot->begin)});
    }
  }
  if (remote && options.cache_bytes < 1) {
    return absl::InvalidArgumentError("remote shards need a cache of at least one byte");
  }
  options.fetch_threads = std::max(1, options.fetch_threads);
  options.part_bytes = std::max<int64_t>(options.part_bytes, 1 << 16);
  auto reader = std::unique_ptr<ShardReader>(
      new ShardReader(std::move(store), std::move(index), std::move(ranges), options, remote));
  reader->columns_key_ = absl::StrJoin(columns, "\n");
  return reader;
}

ShardReader::ShardReader(std::shared_ptr<ObjectStore> store, ShardIndex index,
                         std::vector<std::vector<Range>> ranges, ShardReaderOptions options,
                         bool remote)
    : store_(std::move(store)),
      index_(std::move(index)),
      ranges_(std::move(ranges)),
      options_(std::move(options)),
      remote_(remote),
      shards_(index_.shards.size()) {
  thread_ = std::thread([this] { Loop(); });
}

ShardReader::~ShardReader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int64_t ShardReader::ColumnBytes(int shard) const {
  int64_t total = 0;
  for (const Range& r : ranges_[static_cast<size_t>(shard)]) total += r.length;
  return total;
}

int64_t ShardReader::bytes_fetched() const {
  absl::MutexLock lock(&mu_);
  return bytes_fetched_;
}

absl::StatusOr<std::shared_ptr<const MappedShard>> ShardReader::Get(int shard) {
  if (shard < 0 || static_cast<size_t>(shard) >= shards_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no shard ", shard));
  }
  absl::MutexLock lock(&mu_);
  Shard& s = shards_[static_cast<size_t>(shard)];
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || s.state == State::kReady || s.state == State::kFailed ||
           s.state == State::kIdle;
  };
  while (true) {
    if (s.state == State::kReady) return s.mapped;
    if (s.state == State::kFailed) return s.error;
    if (stop_) return absl::CancelledError("the shard reader is closing");
    if (s.state == State::kIdle) {
      s.state = State::kQueued;
      queue_.push_front(shard);
    } else if (s.state == State::kQueued) {
      // Wanted now: ahead of the shards being read ahead.
      queue_.erase(std::find(queue_.begin(), queue_.end(), shard));
      queue_.push_front(shard);
    }
    mu_.Await(absl::Condition(&settled));
    if (s.state == State::kIdle) continue;  // let go by Hold before it was read: ask again
  }
}

void ShardReader::Hold(const std::vector<int>& shards) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (std::find(shards.begin(), shards.end(), static_cast<int>(i)) != shards.end()) continue;
    Shard& s = shards_[i];
    if (s.state == State::kReady || s.state == State::kQueued) {
      s.state = State::kIdle;
      s.mapped.reset();
    }
  }
  queue_.clear();
  for (int i : shards) {
    if (i < 0 || static_cast<size_t>(i) >= shards_.size()) continue;
    Shard& s = shards_[static_cast<size_t>(i)];
    if (s.state == State::kIdle || s.state == State::kQueued) {
      s.state = State::kQueued;
      queue_.push_back(i);
    }
  }
  held_ = shards;
}

void ShardReader::Loop() {
  while (true) {
    int i;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (stop_) return;
      i = queue_.front();
      queue_.pop_front();
      shards_[static_cast<size_t>(i)].state = State::kLoading;
    }
    absl::StatusOr<std::shared_ptr<const MappedShard>> mapped = Load(i);
    {
      absl::MutexLock lock(&mu_);
      Shard& s = shards_[static_cast<size_t>(i)];
      if (mapped.ok()) {
        s.state = State::kReady;
        s.mapped = *mapped;
      } else {
        s.state = State::kFailed;
        s.error = mapped.status();
      }
    }
    if (mapped.ok()) Populate(**mapped);
  }
}

void ShardReader::Populate(const MappedShard& shard) {
  // Batches read a window's rows in random order: page faults one page at a time from disk. Read
  // the columns into memory in file order first, a slice at a time (batches may use the shard
  // meanwhile), so that batches find them there.
  constexpr size_t kSlice = size_t{8} << 20;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t c = 0; c < ranges_.front().size(); ++c) {
    const absl::string_view column = shard.column(c);
    const uintptr_t first = reinterpret_cast<uintptr_t>(column.data()) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(column.data()) + column.size();
    for (uintptr_t at = first; at < end; at += kSlice) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
      }
      const size_t length = std::min<size_t>(kSlice, end - at);
      if (madvise(reinterpret_cast<void*>(at), length, MADV_POPULATE_READ) != 0) {
        // Kernels before 5.14: touch a byte of every page instead.
        volatile char sink = 0;
        for (uintptr_t p = at; p < at + length; p += page) sink += *reinterpret_cast<char*>(p);
        (void)sink;
      }
    }
  }
}

absl::StatusOr<std::shared_ptr<const MappedShard>> ShardReader::Load(int i) {
  return remote_ ? MapCached(i) : MapLocal(i);
}

std::shared_ptr<const MappedShard> ShardReader::Map(int i, int fd) const {
  const size_t length = static_cast<size_t>(index_.shards[static_cast<size_t>(i)].size_bytes);
  void* base = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return nullptr;
  std::vector<absl::string_view> columns;
  const long page = sysconf(_SC_PAGESIZE);
  for (const Range& r : ranges_[static_cast<size_t>(i)]) {
    columns.emplace_back(static_cast<const char*>(base) + r.offset, static_cast<size_t>(r.length));
    // Start reading the columns in the background: the batches that need them come later.
    const int64_t begin = r.offset / page * page;
    madvise(static_cast<char*>(base) + begin, static_cast<size_t>(r.offset + r.length - begin),
            MADV_WILLNEED);
  }
  return std::make_shared<MappedShard>(fd, base, length, std::move(columns));
}

absl::StatusOr<std::shared_ptr<const MappedShard>> ShardReader::MapLocal(int i) {
  const ShardInfo& info = index_.shards[static_cast<size_t>(i)];
  const std::string path = LocalPath(info.uri);
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("data shard ", path, " is gone"));
    return Errno("cannot open", path);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("cannot stat", path);
  if (st.st_size != info.size_bytes) {
    return absl::DataLossError(absl::StrCat(path, " changed since it was indexed (",
                                            info.size_bytes, " bytes, now ", st.st_size, ")"));
  }
  std::shared_ptr<const MappedShard> mapped = Map(i, fd.get());
  if (mapped == nullptr) return Errno("cannot map", path);
  fd.release();
  return mapped;
}

absl::StatusOr<std::shared_ptr<const MappedShard>> ShardReader::MapCached(int i) {
  const ShardInfo& info = index_.shards[static_cast<size_t>(i)];
  std::error_code ec;
  fs::create_directories(options_.cache_dir, ec);
  const std::string entry =
      absl::StrCat(options_.cache_dir, "/", Sha256Hex(info.uri).substr(0, 32), "-",
                   Sha256Hex(absl::StrCat(info.etag, "\n", columns_key_)).substr(0, 16), ".shard");
  for (int attempt = 0; attempt < 3; ++attempt) {
    // A cached copy: lock it against eviction, then check it is still the file at that name.
    Fd fd(open(entry.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() >= 0) {
      struct stat by_fd, by_name;
      if (flock(fd.get(), LOCK_SH) != 0 || fstat(fd.get(), &by_fd) != 0) {
        return Errno("cannot lock", entry);
      }
      if (stat(entry.c_str(), &by_name) != 0 || by_name.st_ino != by_fd.st_ino) continue;
      if (by_fd.st_size != info.size_bytes) {
        return absl::DataLossError(absl::StrCat("cached shard ", entry, " of ", info.uri, " has ",
                                                by_fd.st_size, " bytes, expected ",
                                                info.size_bytes));
      }
      futimens(fd.get(), nullptr);  // most recently used
      std::shared_ptr<const MappedShard> mapped = Map(i, fd.get());
      if (mapped == nullptr) return Errno("cannot map", entry);
      fd.release();
      return mapped;
    }
    if (errno != ENOENT) return Errno("cannot open", entry);
    // Not cached: one process fetches it while the others sharing the folder wait.
    const std::string lock_path = entry + ".lock";
    Fd lock(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (lock.get() < 0 || flock(lock.get(), LOCK_EX) != 0) return Errno("cannot lock", lock_path);
    if (access(entry.c_str(), F_OK) == 0) continue;
    // What the sparse file takes on disk: each range's blocks, one more where it starts mid-block.
    int64_t need = 0;
    for (const Range& r : ranges_[static_cast<size_t>(i)])
      need += (r.length + 4095) / 4096 * 4096 + 4096;
    Evict(need);
    const std::string part = absl::StrCat(entry, ".part.", getpid());
    absl::Status status = Download(i, part);
    if (status.ok() && rename(part.c_str(), entry.c_str()) != 0) {
      status = Errno("cannot rename", part);
    }
    if (!status.ok()) {
      unlink(part.c_str());
      return status;
    }
  }
  return absl::UnavailableError(absl::StrCat("cached shard ", entry, " keeps being replaced"));
}

absl::Status ShardReader::Download(int i, const std::string& path) {
  const ShardInfo& info = index_.shards[static_cast<size_t>(i)];
  Fd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Errno("cannot create", path);
  // Locked while written, so that eviction leaves it alone and removes it once its writer died.
  if (flock(fd.get(), LOCK_EX) != 0) return Errno("cannot lock", path);
  // Sparse: the header and the tensors not read take no space.
  if (ftruncate(fd.get(), info.size_bytes) != 0) return Errno("cannot size", path);
  std::vector<Range> parts;
  for (const Range& r : ranges_[static_cast<size_t>(i)]) {
    for (int64_t off = 0; off < r.length; off += options_.part_bytes) {
      parts.push_back(Range{r.offset + off, std::min(options_.part_bytes, r.length - off)});
    }
  }
  absl::Status status = ParallelFor(
      static_cast<int64_t>(parts.size()), options_.fetch_threads, [&](int64_t p) -> absl::Status {
        const Range& part = parts[static_cast<size_t>(p)];
        absl::StatusOr<std::string> bytes;
        for (int attempt = 0; attempt < 3; ++attempt) {
          bytes = store_->GetRange(info.uri, part.offset, part.length);
          if (bytes.ok() || bytes.status().code() != absl::StatusCode::kUnavailable) break;
        }
        if (!bytes.ok()) return bytes.status();
        if (static_cast<int64_t>(bytes->size()) != part.length) {
          return absl::DataLossError(absl::StrCat(info.uri, ": ", part.length, " bytes at ",
                                                  part.offset, " asked, ", bytes->size(),
                                                  " received (changed since it was indexed?)"));
        }
        for (size_t done = 0; done < bytes->size();) {
          const ssize_t n = pwrite(fd.get(), bytes->data() + done, bytes->size() - done,
                                   static_cast<off_t>(part.offset) + static_cast<off_t>(done));
          if (n < 0) {
            if (errno == EINTR) continue;
            return Errno("cannot write", path);
          }
          done += static_cast<size_t>(n);
        }
        absl::MutexLock lock(&mu_);
        bytes_fetched_ += part.length;
        return absl::OkStatus();
      });
  return status;
}

void ShardReader::Evict(int64_t need) {
  struct Entry {
    std::string path;
    int64_t bytes;
    struct timespec used;
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(options_.cache_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string path = it->path().string();
    if (!absl::EndsWith(path, ".shard") && !absl::StrContains(path, ".shard.part.")) continue;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    const int64_t bytes = static_cast<int64_t>(st.st_blocks) * 512;
    total += bytes;
    entries.push_back(Entry{path, bytes, st.st_mtim});
  }
  if (total + need <= options_.cache_bytes) return;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.used.tv_sec, a.used.tv_nsec) < std::tie(b.used.tv_sec, b.used.tv_nsec);
  });
  for (const Entry& e : entries) {
    if (total + need <= options_.cache_bytes) return;
    Fd fd(open(e.path.c_str(), O_RDONLY | O_CLOEXEC));
    // Mapped by some process (shared lock) or being written (exclusive): keep it.
    if (fd.get() < 0 || flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;
    if (unlink(e.path.c_str()) == 0) {
      total -= e.bytes;
      if (absl::EndsWith(e.path, ".shard")) unlink((e.path + ".lock").c_str());
    }
  }
  LogWarning("the data cache ", options_.cache_dir, " holds ", total, " bytes in use; ", need,
             " more go over its bound of ", options_.cache_bytes);
}

}  // namespace trainyard
