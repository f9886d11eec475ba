#include "server/jobs/hang_diagnosis.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard {

namespace {

using v1::CollectiveRecord;
using v1::RankRecord;

bool IsMessage(const CollectiveRecord& c) { return c.peer() >= 0; }

int64_t LastCollective(const RankRecord& r) {
  int64_t last = 0;
  for (const CollectiveRecord& c : r.recent()) {
    if (!IsMessage(c)) last = std::max(last, c.seq());
  }
  return last;
}

int64_t LastSentTo(const RankRecord& r, int peer) {
  int64_t last = 0;
  for (const CollectiveRecord& c : r.recent()) {
    if (c.kind() == "send" && c.peer() == peer) last = std::max(last, c.seq());
  }
  return last;
}

std::string Who(const RankView& v) {
  return v.worker_id.empty() ? absl::StrCat("rank ", v.rank)
                             : absl::StrCat("rank ", v.rank, " (", v.worker_id, ")");
}

// How long `r` has waited in `c` when its record was read: 0 once it ended.
int64_t WaitedMs(const RankRecord& r, const CollectiveRecord& c) {
  if (c.ended_unix_ms() > 0 || c.started_unix_ms() <= 0) return 0;
  return std::max<int64_t>(0, r.read_unix_ms() - c.started_unix_ms());
}

int64_t SecondsInPhase(const RankRecord& r) {
  if (r.phase_since_unix_ms() <= 0 || r.read_unix_ms() < r.phase_since_unix_ms()) return 0;
  return (r.read_unix_ms() - r.phase_since_unix_ms()) / 1000;
}

// "it has been in data loading for 61 s", or what its stopped process says.
std::string Doing(const RankRecord& r) {
  const std::string phase = r.phase().empty() ? std::string("an unknown phase") : r.phase();
  if (r.process_state() == "stopped") {
    return absl::StrCat("its process was stopped (SIGSTOP or a debugger) in ", phase, ", ",
                        SecondsInPhase(r), " s after entering it");
  }
  return absl::StrCat("it has been in ", phase, " for ", SecondsInPhase(r), " s");
}

std::vector<const RankView*> WithRecords(const std::vector<RankView>& ranks) {
  std::vector<const RankView*> out;
  for (const RankView& v : ranks) {
    if (v.record != nullptr && v.record->error().empty()) out.push_back(&v);
  }
  std::sort(out.begin(), out.end(),
            [](const RankView* a, const RankView* b) { return a->rank < b->rank; });
  return out;
}

// A rank behind the newest collective the others entered.
std::string BehindInCollectives(const std::vector<const RankView*>& ranks, int64_t held_ms) {
  int64_t newest = 0;
  std::string kind;
  for (const RankView* v : ranks) {
    for (const CollectiveRecord& c : v->record->recent()) {
      if (!IsMessage(c) && c.seq() > newest) {
        newest = c.seq();
        kind = c.kind();
      }
    }
  }
  if (newest == 0) return "";
  int64_t waited = 0;  // the longest any rank has waited in the newest collective
  for (const RankView* v : ranks) {
    for (const CollectiveRecord& c : v->record->recent()) {
      if (!IsMessage(c) && c.seq() == newest) waited = std::max(waited, WaitedMs(*v->record, c));
    }
  }
  if (waited < held_ms) return "";
  const RankView* culprit = nullptr;
  std::vector<std::string> also;
  for (const RankView* v : ranks) {
    const int64_t last = LastCollective(*v->record);
    if (last >= newest) continue;
    if (culprit == nullptr || last < LastCollective(*culprit->record)) {
      if (culprit != nullptr) also.push_back(absl::StrCat(culprit->rank));
      culprit = v;
    } else {
      also.push_back(absl::StrCat(v->rank));
    }
  }
  if (culprit == nullptr) return "";
  // The first collective the culprit never entered: the one after its last.
  const int64_t missed = LastCollective(*culprit->record) + 1;
  if (missed != newest) kind = "collective";
  for (const RankView* v : ranks) {
    for (const CollectiveRecord& c : v->record->recent()) {
      if (!IsMessage(c) && c.seq() == missed) kind = c.kind();
    }
  }
  std::string out = absl::StrCat(Who(*culprit), " never entered ", kind, " #", missed, ": ",
                                 Doing(*culprit->record));
  if (!also.empty()) {
    std::sort(also.begin(), also.end());
    absl::StrAppend(&out, " (also behind: rank", also.size() > 1 ? "s " : " ",
                    absl::StrJoin(also, ", "), ")");
  }
  return out;
}

// A rank that never sent what another rank waits to receive.
std::string MissingMessage(const std::vector<const RankView*>& ranks, int64_t held_ms) {
  for (const RankView* waiting : ranks) {
    for (const CollectiveRecord& c : waiting->record->recent()) {
      if (c.kind() != "receive" || (c.ended_unix_ms() > 0 && !c.failed())) continue;
      if (c.ended_unix_ms() == 0 && WaitedMs(*waiting->record, c) < held_ms) continue;
      for (const RankView* sender : ranks) {
        if (sender->rank != c.peer()) continue;
        if (LastSentTo(*sender->record, waiting->rank) >= c.seq()) continue;
        return absl::StrCat(Who(*sender), " never sent message #", c.seq(), " to rank ",
                            waiting->rank, ": ", Doing(*sender->record));
      }
    }
  }
  return "";
}

std::string Stopped(const std::vector<const RankView*>& ranks, int64_t /*held_ms*/) {
  for (const RankView* v : ranks) {
    if (v->record->process_state() == "stopped")
      return absl::StrCat(Who(*v), ": ", Doing(*v->record));
  }
  return "";
}

// Every rank entered the same newest collective and none finished it.
std::string AllInOne(const std::vector<const RankView*>& ranks, int64_t held_ms) {
  if (ranks.size() < 2) return "";
  int64_t seq = -1;
  std::string kind;
  for (const RankView* v : ranks) {
    const CollectiveRecord* newest = nullptr;
    for (const CollectiveRecord& c : v->record->recent()) {
      if (!IsMessage(c) && (newest == nullptr || c.seq() > newest->seq())) newest = &c;
    }
    if (newest == nullptr || (newest->ended_unix_ms() > 0 && !newest->failed())) return "";
    if (newest->ended_unix_ms() == 0 && WaitedMs(*v->record, *newest) < held_ms) return "";
    if (seq >= 0 && newest->seq() != seq) return "";
    seq = newest->seq();
    kind = newest->kind();
  }
  return absl::StrCat("every rank entered ", kind, " #", seq,
                      " and none finished it: no rank held the others up; suspect the network "
                      "between the workers");
}

std::string LongestInPhase(const std::vector<const RankView*>& ranks) {
  const RankView* longest = nullptr;
  for (const RankView* v : ranks) {
    if (longest == nullptr || SecondsInPhase(*v->record) > SecondsInPhase(*longest->record)) {
      longest = v;
    }
  }
  if (longest == nullptr) return "";
  return absl::StrCat(Who(*longest), ": ", Doing(*longest->record));
}

}  // namespace

std::string DiagnoseHang(const std::vector<RankView>& ranks, bool stalled, absl::Duration held) {
  const std::vector<const RankView*> known = WithRecords(ranks);
  if (known.empty()) return "";
  const int64_t held_ms = absl::ToInt64Milliseconds(held);
  for (auto rule : {&BehindInCollectives, &MissingMessage, &Stopped, &AllInOne}) {
    std::string found = rule(known, held_ms);
    if (!found.empty()) return found;
  }
  return stalled ? LongestInPhase(known) : "";
}

}  // namespace trainyard
