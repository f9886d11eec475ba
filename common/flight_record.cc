#include "common/flight_record.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <new>

#include "absl/strings/str_cat.h"

namespace trainyard {

namespace {

constexpr char kMagic[8] = {'T', 'Y', 'F', 'L', 'I', 'G', 'H', 'T'};

// `ended` packs the end and its outcome: 0 running, +ms ended well, -ms failed.
int64_t PackEnd(int64_t unix_ms, bool ok) { return ok ? unix_ms : -unix_ms; }

// A word of the file read from `bytes` at word `index` (the reader's copy; no atomics there).
int64_t WordAt(const std::string& bytes, size_t index) {
  int64_t word = 0;
  std::memcpy(&word, bytes.data() + index * sizeof(int64_t), sizeof(word));
  return word;
}

}  // namespace

// Every field is one 64-bit word, so the reader can take the file as an array of words.
struct FlightRecorder::Layout {
  char magic[8];
  std::atomic<int64_t> version;
  std::atomic<int64_t> capacity;
  std::atomic<int64_t> phase;
  std::atomic<int64_t> phase_since_unix_ms;
  std::atomic<int64_t> step;
  std::atomic<int64_t> next;  // entries begun so far
  struct Slot {
    // Written last, with release: entry index + 1 once the slot holds that entry; 0 while it is
    // being rewritten.
    std::atomic<int64_t> stamp;
    std::atomic<int64_t> seq;
    std::atomic<int64_t> kind_and_peer;  // kind in the low 32 bits, peer + 1 in the high
    std::atomic<int64_t> bytes;
    std::atomic<int64_t> started_unix_ms;
    std::atomic<int64_t> ended;  // PackEnd
  } slots[kFlightRecordEntries];
};

namespace {
constexpr size_t kHeaderWords = 7;  // magic .. next
constexpr size_t kSlotWords = 6;
constexpr size_t kRecordBytes =
    (kHeaderWords + kSlotWords * kFlightRecordEntries) * sizeof(int64_t);
static_assert(sizeof(std::atomic<int64_t>) == sizeof(int64_t));
static_assert(std::atomic<int64_t>::is_always_lock_free, "shared across processes");
}  // namespace

const char* RankPhaseName(RankPhase phase) {
  switch (phase) {
    case RankPhase::kStarting:
      return "starting";
    case RankPhase::kData:
      return "data loading";
    case RankPhase::kForward:
      return "the forward pass";
    case RankPhase::kBackward:
      return "the backward pass";
    case RankPhase::kOptimizer:
      return "the optimizer step";
    case RankPhase::kCheckpoint:
      return "a checkpoint save";
    case RankPhase::kValidation:
      return "validation";
    case RankPhase::kFinishing:
      return "finishing";
  }
  return "an unknown phase";
}

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all-reduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kSend:
      return "send";
    case CollectiveKind::kRecv:
      return "receive";
  }
  return "collective";
}

FlightRecorder::FlightRecorder(Layout* layout, size_t mapped_bytes, const Clock& clock)
    : layout_(layout), mapped_bytes_(mapped_bytes), clock_(clock) {
  static_assert(sizeof(Layout) == kRecordBytes, "the file is an array of 64-bit words");
  std::memcpy(layout_->magic, kMagic, sizeof(kMagic));
  layout_->capacity.store(kFlightRecordEntries);
  layout_->phase.store(static_cast<int64_t>(RankPhase::kStarting));
  layout_->phase_since_unix_ms.store(absl::ToUnixMillis(clock_.Now()));
  layout_->step.store(0);
  layout_->next.store(0);
  for (Layout::Slot& slot : layout_->slots) slot.stamp.store(0);
  // Last: a reader takes the file for a record only once it is whole.
  layout_->version.store(kFlightRecordVersion, std::memory_order_release);
}

absl::StatusOr<std::unique_ptr<FlightRecorder>> FlightRecorder::Create(const std::string& path,
                                                                       const Clock& clock) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("flight record ", path, ": ", std::strerror(errno)));
  }
  const size_t bytes = sizeof(Layout);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("flight record ", path, ": ", std::strerror(err)));
  }
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("flight record ", path, ": ", std::strerror(err)));
  }
  // The file is zeros: a Layout of zeros is a valid object of these atomics.
  return std::unique_ptr<FlightRecorder>(new FlightRecorder(new (mapped) Layout, bytes, clock));
}

std::unique_ptr<FlightRecorder> FlightRecorder::InMemory(const Clock& clock) {
  return std::unique_ptr<FlightRecorder>(new FlightRecorder(new Layout(), 0, clock));
}

FlightRecorder::~FlightRecorder() {
  if (mapped_bytes_ == 0) {
    delete layout_;
  } else {
    ::munmap(layout_, mapped_bytes_);
  }
}

void FlightRecorder::SetPhase(RankPhase phase) {
  const int64_t value = static_cast<int64_t>(phase);
  if (layout_->phase.load(std::memory_order_relaxed) == value) return;
  layout_->phase_since_unix_ms.store(absl::ToUnixMillis(clock_.Now()), std::memory_order_relaxed);
  layout_->phase.store(value, std::memory_order_release);
}

void FlightRecorder::SetStep(int64_t step) { layout_->step.store(step, std::memory_order_relaxed); }

uint64_t FlightRecorder::Begin(CollectiveKind kind, int64_t bytes, int peer) {
  int64_t seq = 0;
  if (peer < 0) {
    seq = collectives_.fetch_add(1, std::memory_order_relaxed) + 1;
  } else {
    absl::MutexLock lock(&mu_);
    seq = ++(kind == CollectiveKind::kSend ? sent_ : received_)[peer];
  }
  const int64_t index = layout_->next.fetch_add(1, std::memory_order_relaxed);
  Layout::Slot& slot = layout_->slots[index % kFlightRecordEntries];
  // Each field's store releases the cleared stamp before it (a fence would do as much, but
  // ThreadSanitizer cannot follow fences): a reader that sees a new field sees the slot cleared.
  slot.stamp.store(0, std::memory_order_relaxed);
  slot.seq.store(seq, std::memory_order_release);
  slot.kind_and_peer.store(
      static_cast<int64_t>(kind) | (static_cast<int64_t>(peer < 0 ? 0 : peer + 1) << 32),
      std::memory_order_release);
  slot.bytes.store(bytes, std::memory_order_release);
  slot.started_unix_ms.store(absl::ToUnixMillis(clock_.Now()), std::memory_order_release);
  slot.ended.store(0, std::memory_order_release);
  slot.stamp.store(index + 1, std::memory_order_release);
  return static_cast<uint64_t>(index);
}

void FlightRecorder::End(uint64_t token, bool ok) {
  Layout::Slot& slot = layout_->slots[token % kFlightRecordEntries];
  const int64_t stamp = static_cast<int64_t>(token) + 1;
  // Long gone from the ring: nothing to mark.
  if (slot.stamp.load(std::memory_order_acquire) != stamp) return;
  const int64_t ended = PackEnd(absl::ToUnixMillis(clock_.Now()), ok);
  int64_t running = 0;
  // Only a running entry ends: a second End of the token changes nothing.
  if (!slot.ended.compare_exchange_strong(running, ended, std::memory_order_acq_rel)) return;
  // The slot was begun again between the check and the mark (kFlightRecordEntries newer entries
  // in that instant): the mark may have landed on the new entry, which is still running. Take it
  // back, unless the new entry's own end has replaced it.
  if (slot.stamp.load(std::memory_order_acquire) != stamp) {
    int64_t mine = ended;
    slot.ended.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
  }
}

namespace {

// The record in `bytes`, the file's words, read between two other reads of them, `before` and
// `after`: an entry counts only if its stamp is its own in both. Its writer clears the stamp
// before it rewrites the slot and sets the new one after, so a slot rewritten while `bytes` was
// read shows another stamp in `after`. The stamps are not taken from `bytes` itself: a copy of
// the file (pread, memcpy) need not read its words in order.
absl::StatusOr<FlightRecordSnapshot> ParseRecord(const std::string& before,
                                                 const std::string& bytes, const std::string& after,
                                                 const std::string& path) {
  if (bytes.size() < kRecordBytes || before.size() < kRecordBytes || after.size() < kRecordBytes ||
      std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not a flight record (", bytes.size(),
                                            " bytes, expected ", kRecordBytes, " with its magic)"));
  }
  if (WordAt(bytes, 1) != kFlightRecordVersion || WordAt(bytes, 2) != kFlightRecordEntries) {
    return absl::DataLossError(absl::StrCat(path, ": flight record version ", WordAt(bytes, 1),
                                            " with ", WordAt(bytes, 2), " entries, expected ",
                                            kFlightRecordVersion, " with ", kFlightRecordEntries));
  }
  FlightRecordSnapshot out;
  out.phase = static_cast<RankPhase>(WordAt(bytes, 3));
  out.phase_since_unix_ms = WordAt(bytes, 4);
  out.step = WordAt(bytes, 5);
  const int64_t next = WordAt(bytes, 6);
  for (int64_t index = std::max<int64_t>(0, next - kFlightRecordEntries); index < next; ++index) {
    const size_t base =
        kHeaderWords + kSlotWords * static_cast<size_t>(index % kFlightRecordEntries);
    // Being rewritten as it was read.
    if (WordAt(before, base) != index + 1 || WordAt(after, base) != index + 1) continue;
    CollectiveEntry e;
    e.seq = WordAt(bytes, base + 1);
    const int64_t kind_and_peer = WordAt(bytes, base + 2);
    e.kind = static_cast<CollectiveKind>(kind_and_peer & 0xffffffff);
    e.peer = static_cast<int32_t>(kind_and_peer >> 32) - 1;
    e.bytes = WordAt(bytes, base + 3);
    e.started_unix_ms = WordAt(bytes, base + 4);
    const int64_t ended = WordAt(bytes, base + 5);
    e.ended_unix_ms = ended < 0 ? -ended : ended;
    e.failed = ended < 0;
    out.recent.push_back(e);
  }
  return out;
}

// The words of the header that a reader must see from one moment: the phase, its start, the step.
bool SameMoment(const std::string& a, const std::string& b) {
  if (a.size() < kRecordBytes || b.size() < kRecordBytes) return true;  // ParseRecord refuses it
  return std::memcmp(a.data() + 3 * sizeof(int64_t), b.data() + 3 * sizeof(int64_t),
                     3 * sizeof(int64_t)) == 0;
}

// The record that `read` (which fills its argument with the file's words) gives: read three times
// in a row until the first and the third agree on the header's phase, its start and the step (a
// phase changed while they were read could pair one phase with the other's start; a few tries,
// as the training thread changes them a few times a step), then parsed from the second.
absl::StatusOr<FlightRecordSnapshot> ReadStable(
    const std::function<absl::Status(std::string&)>& read, const std::string& path) {
  constexpr int kTries = 8;
  std::string before;
  std::string bytes;
  std::string after;
  if (absl::Status status = read(before); !status.ok()) return status;
  if (absl::Status status = read(bytes); !status.ok()) return status;
  for (int tries = 1;; ++tries) {
    if (absl::Status status = read(after); !status.ok()) return status;
    if (tries == kTries || SameMoment(before, after)) break;
    before.swap(bytes);
    bytes.swap(after);
  }
  return ParseRecord(before, bytes, after, path);
}

}  // namespace

FlightRecordSnapshot FlightRecorder::Snapshot() const {
  // Word by word through atomic loads, as another process would see the file.
  auto read = [this](std::string& bytes) {
    bytes.assign(sizeof(Layout), '\0');
    std::memcpy(bytes.data(), layout_->magic, sizeof(layout_->magic));
    const auto* words = reinterpret_cast<const std::atomic<int64_t>*>(layout_);
    for (size_t i = 1; i < sizeof(Layout) / sizeof(int64_t); ++i) {
      const int64_t word = words[i].load(std::memory_order_acquire);
      std::memcpy(bytes.data() + i * sizeof(int64_t), &word, sizeof(word));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<FlightRecordSnapshot> parsed = ReadStable(read, "in memory");
  return parsed.ok() ? *std::move(parsed) : FlightRecordSnapshot();
}

absl::StatusOr<FlightRecordSnapshot> ReadFlightRecord(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no flight record"));
    return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  auto read = [fd, &path](std::string& bytes) {
    bytes.assign(kRecordBytes, '\0');
    const ssize_t n = ::pread(fd, bytes.data(), bytes.size(), 0);
    if (n < 0) return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(errno)));
    bytes.resize(static_cast<size_t>(n));
    return absl::OkStatus();
  };
  absl::StatusOr<FlightRecordSnapshot> record = ReadStable(read, path);
  ::close(fd);
  return record;
}

}  // namespace trainyard
