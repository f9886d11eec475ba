#include "client/format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainyard::cli {

std::string ProgressBar(double fraction, int width) {
  if (!(fraction >= 0)) fraction = 0;
  if (fraction > 1) fraction = 1;
  const int filled = static_cast<int>(std::floor(fraction * width + 1e-9));
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '-'), "]");
}

std::string GroupThousands(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  const int len = static_cast<int>(digits.size());
  for (int i = 0; i < len; ++i) {
    if (i > 0 && (len - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return n < 0 ? "-" + out : out;
}

std::string Counted(int64_t n, const std::string& noun) {
  return absl::StrCat(GroupThousands(n), " ", noun, n == 1 ? "" : "s");
}

std::string ClockDuration(absl::Duration d) {
  int64_t seconds = absl::ToInt64Seconds(d);
  if (seconds < 0) seconds = 0;
  const int64_t h = seconds / 3600;
  const int64_t m = (seconds / 60) % 60;
  const int64_t s = seconds % 60;
  if (h > 0) return absl::StrFormat("%d:%02d:%02d", h, m, s);
  return absl::StrFormat("%d:%02d", m, s);
}

std::string ShortAge(absl::Duration d) {
  int64_t seconds = absl::ToInt64Seconds(d);
  if (seconds < 0) seconds = 0;
  if (seconds < 60) return absl::StrCat(seconds, "s");
  if (seconds < 3600) return absl::StrCat(seconds / 60, "m");
  if (seconds < 86400) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds / 86400, "d");
}

std::string LocalTime(int64_t unix_ms, absl::TimeZone zone) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%S%Ez", absl::FromUnixMillis(unix_ms), zone);
}

std::string Truncate(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  if (max <= 3) return text.substr(0, max);
  return text.substr(0, max - 3) + "...";
}

std::string Table(const std::vector<std::string>& headers,
                  const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(headers.size(), 0);
  for (size_t i = 0; i < headers.size(); ++i) widths[i] = headers[i].size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::string out;
  auto add_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < widths.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      absl::StrAppend(&line, cell);
      if (i + 1 < widths.size())
        absl::StrAppend(&line, std::string(widths[i] - cell.size() + 2, ' '));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  };
  add_row(headers);
  for (const auto& row : rows) add_row(row);
  return out;
}

std::string ProgressLine(const v1::JobProgress& progress, std::optional<absl::Duration> eta) {
  std::string out;
  const int64_t total = progress.total_steps();
  if (total > 0) {
    const double fraction = static_cast<double>(progress.step()) / static_cast<double>(total);
    absl::StrAppend(&out, ProgressBar(fraction), " step ", progress.step(), "/", total, " ",
                    static_cast<int>(std::min(1.0, std::max(0.0, fraction)) * 100), "%");
  } else {
    absl::StrAppend(&out, "step ", progress.step());
  }
  if (progress.step() > 0 || progress.loss() != 0) {
    absl::StrAppend(&out, absl::StrFormat("  loss %.4f", progress.loss()));
  }
  if (progress.samples_per_second() > 0) {
    absl::StrAppend(
        &out, "  ",
        GroupThousands(static_cast<int64_t>(std::llround(progress.samples_per_second()))),
        " samples/s");
  }
  if (progress.has_val_accuracy()) {
    absl::StrAppend(&out, absl::StrFormat("  val acc %.1f%%", progress.val_accuracy() * 100));
  }
  if (progress.has_val_loss()) {
    absl::StrAppend(&out, absl::StrFormat("  val loss %.4f", progress.val_loss()));
  }
  if (total > 0 && eta.has_value()) absl::StrAppend(&out, "  ETA ", ClockDuration(*eta));
  return out;
}

std::string JobStateName(v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED) return "UNKNOWN";
  return v1::JobState_Name(state);
}

std::string TaskStateName(v1::TaskState state) {
  if (state == v1::TASK_STATE_UNSPECIFIED) return "UNKNOWN";
  std::string name = v1::TaskState_Name(state);
  return name.rfind("TASK_", 0) == 0 ? name.substr(5) : name;
}

std::string WorkerStateName(v1::WorkerState state) {
  if (state == v1::WORKER_STATE_UNSPECIFIED) return "UNKNOWN";
  return v1::WorkerState_Name(state);
}

v1::JobState ParseJobState(const std::string& name) {
  v1::JobState state;
  if (v1::JobState_Parse(absl::AsciiStrToUpper(name), &state)) return state;
  return v1::JOB_STATE_UNSPECIFIED;
}

void EtaEstimator::Observe(absl::Time now, int64_t step) {
  if (!first_.has_value() || step < first_->second) {
    first_ = {now, step};
    last_ = first_;
    return;
  }
  if (step > last_->second) last_ = {now, step};
}

std::optional<absl::Duration> EtaEstimator::Eta(int64_t total) const {
  if (!first_.has_value() || last_->second <= first_->second) return std::nullopt;
  const double seconds = absl::ToDoubleSeconds(last_->first - first_->first);
  if (seconds <= 0) return std::nullopt;
  const double rate = static_cast<double>(last_->second - first_->second) / seconds;
  const int64_t left = std::max<int64_t>(0, total - last_->second);
  return absl::Seconds(static_cast<double>(left) / rate);
}

}  // namespace trainyard::cli
