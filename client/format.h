#ifndef TRAINYARD_CLIENT_FORMAT_H_
#define TRAINYARD_CLIENT_FORMAT_H_

// Pure text formatting for the CLI: progress lines, durations, sizes, tables.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/byte_size.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard::cli {

// "[#####-----]" with `width` cells; fraction is clamped to [0, 1].
std::string ProgressBar(double fraction, int width = 10);

// "[#####-----] step 120/500 24%  loss 0.4312  1,234 samples/s  ETA 0:42". Parts without data
// are left out (no total: no bar, percentage or ETA; no samples/s: no rate).
std::string ProgressLine(const v1::JobProgress& progress, std::optional<absl::Duration> eta);

// 1234567 -> "1,234,567".
std::string GroupThousands(int64_t n);

// "1 shard", "2 shards", "1,500 samples": `n` (grouped) and the noun, plural unless n is 1.
std::string Counted(int64_t n, const std::string& noun);

// Clock style for ETAs: "0:42", "12:05", "1:02:03".
std::string ClockDuration(absl::Duration d);

// Compact age: "45s", "12m", "3h", "2d".
std::string ShortAge(absl::Duration d);

// Binary units: "512 B", "1.5 KiB", "20.0 MiB", "3.2 GiB".
using trainyard::HumanBytes;

// Local time in RFC 3339 ("2026-11-21T06:40:00+01:00"); "-" for 0.
std::string LocalTime(int64_t unix_ms, absl::TimeZone zone = absl::LocalTimeZone());

// At most `max` characters; longer text ends in "...".
std::string Truncate(const std::string& text, size_t max);

// Left-aligned columns two spaces apart, a header row first; trailing spaces trimmed.
std::string Table(const std::vector<std::string>& headers,
                  const std::vector<std::vector<std::string>>& rows);

// "RUNNING", "SUCCEEDED", ...; task states as "RUNNING", "EXITED", ...
std::string JobStateName(v1::JobState state);
std::string TaskStateName(v1::TaskState state);
std::string WorkerStateName(v1::WorkerState state);
// Case-insensitive name -> state; JOB_STATE_UNSPECIFIED if unknown.
v1::JobState ParseJobState(const std::string& name);

// Estimates the time left from the step rate seen by the client. Not thread-safe.
class EtaEstimator {
 public:
  // Records that `step` was reached at `now`.
  void Observe(absl::Time now, int64_t step);
  // Time to reach `total` at the rate seen so far; nullopt until two distinct steps are seen.
  std::optional<absl::Duration> Eta(int64_t total) const;

 private:
  std::optional<std::pair<absl::Time, int64_t>> first_;
  std::optional<std::pair<absl::Time, int64_t>> last_;
};

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_FORMAT_H_
