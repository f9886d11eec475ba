// The PostgreSQL job store's reads: jobs with their details, finished jobs, tokens, searches.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/lifecycle/job_state.h"
#include "server/store/postgres_job_store.h"
#include "server/store/store_rows.h"

namespace trainyard {

using pg::Params;
using store_rows::kActiveJobStates;
using store_rows::kEventColumns;
using store_rows::kFinalJobStates;
using store_rows::kLiveTaskStates;
using store_rows::kTaskColumns;
using store_rows::kTaskOrder;
using store_rows::ReadEvent;
using store_rows::ReadTask;

namespace {

// One row of a result, as store_rows' readers take it.
struct Row {
  const pg::Result& r;
  int row;
  int64_t Int(int col) const { return r.Int(row, col); }
  std::string Text(int col) const { return r.Text(row, col); }
};

// Reads in one snapshot: a read-only REPEATABLE READ transaction around `read`.
template <typename F>
absl::Status InSnapshot(pg::Connection& db, F read) {
  if (absl::Status s = db.Begin("ISOLATION LEVEL REPEATABLE READ READ ONLY"); !s.ok()) return s;
  absl::Status s = read();
  if (s.ok()) s = db.Commit();
  if (!s.ok()) db.Rollback();
  return s;
}

}  // namespace

absl::Status PostgresJobStore::ReadJobs(absl::string_view sql, const Params& params,
                                        bool with_progress, std::vector<StoredJob>* out) {
  absl::StatusOr<pg::Result> r = db_->Exec(sql, params);
  if (!r.ok()) return r.status();
  for (int i = 0; i < r->rows(); ++i) {
    StoredJob stored;
    stored.seq = r->Int(i, 0);
    if (!stored.job.ParseFromString(r->Text(i, 1))) {
      return absl::DataLossError(absl::StrCat("jobs row seq ", stored.seq, " does not parse"));
    }
    if (with_progress && !r->IsNull(i, 2) &&
        !stored.job.mutable_progress()->ParseFromString(r->Text(i, 2))) {
      return absl::DataLossError(
          absl::StrCat("progress of job seq ", stored.seq, " does not parse"));
    }
    out->push_back(std::move(stored));
  }
  return absl::OkStatus();
}

absl::Status PostgresJobStore::ReadDetails(absl::string_view which, const Params& params,
                                           std::vector<StoredJob>& jobs,
                                           std::vector<StoredCheckpoint>* checkpoints) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < jobs.size(); ++i) index[jobs[i].job.id()] = i;
  const std::string where =
      which.empty() ? std::string() : absl::StrCat(" WHERE job_id IN ", which);
  {
    absl::StatusOr<pg::Result> r = db_->Exec(
        absl::StrCat("SELECT job_id, ", kEventColumns, " FROM events", where, " ORDER BY id"),
        params);
    if (!r.ok()) return r.status();
    for (int i = 0; i < r->rows(); ++i) {
      Row row{*r, i};
      auto it = index.find(row.Text(0));
      if (it != index.end()) ReadEvent(row, 1, jobs[it->second].job.add_events());
    }
  }
  {
    absl::StatusOr<pg::Result> r =
        db_->Exec(absl::StrCat("SELECT t.job_id, ", kTaskColumns, " FROM tasks t", where,
                               " ORDER BY t.job_id, ", kTaskOrder),
                  params);
    if (!r.ok()) return r.status();
    for (int i = 0; i < r->rows(); ++i) {
      Row row{*r, i};
      auto it = index.find(row.Text(0));
      if (it != index.end()) ReadTask(row, 1, jobs[it->second].job.add_tasks());
    }
  }
  {
    absl::StatusOr<pg::Result> r =
        db_->Exec(absl::StrCat("SELECT job_id, progress FROM progress", where), params);
    if (!r.ok()) return r.status();
    for (int i = 0; i < r->rows(); ++i) {
      auto it = index.find(r->Text(i, 0));
      if (it == index.end()) continue;
      if (!jobs[it->second].job.mutable_progress()->ParseFromString(r->Text(i, 1))) {
        return absl::DataLossError(
            absl::StrCat("progress row '", r->Text(i, 0), "' does not parse"));
      }
    }
  }
  absl::StatusOr<pg::Result> r =
      db_->Exec(absl::StrCat("SELECT job_id, step, uri, size_bytes, created_ms, generation, "
                             "retired, retired_by FROM checkpoints",
                             where, " ORDER BY job_id, step"),
                params);
  if (!r.ok()) return r.status();
  for (int i = 0; i < r->rows(); ++i) {
    if (!index.count(r->Text(i, 0))) continue;
    StoredCheckpoint c;
    c.checkpoint.set_job_id(r->Text(i, 0));
    c.checkpoint.set_step(r->Int(i, 1));
    c.checkpoint.set_uri(r->Text(i, 2));
    c.checkpoint.set_size_bytes(r->Int(i, 3));
    c.checkpoint.set_created_unix_ms(r->Int(i, 4));
    c.checkpoint.set_generation(r->Int(i, 5));
    c.retired = r->Int(i, 6) != 0;
    c.retired_by_step = r->Int(i, 7);
    checkpoints->push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredJobRecord> PostgresJobStore::LoadJob(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  StoredJobRecord record;
  absl::Status s = InSnapshot(*db_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    std::vector<StoredJob> jobs;
    if (absl::Status s =
            ReadJobs("SELECT seq, job FROM jobs WHERE id = $1", Params().Add(job_id), false, &jobs);
        !s.ok()) {
      return s;
    }
    if (jobs.empty())
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' not in the store"));
    if (absl::Status s = ReadDetails("($1)", Params().Add(job_id), jobs, &record.checkpoints);
        !s.ok()) {
      return s;
    }
    record.job = std::move(jobs[0]);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return record;
}

absl::StatusOr<std::vector<StoredJob>> PostgresJobStore::ListFinishedJobs(
    const std::vector<v1::JobState>& states, int64_t before_seq, int limit,
    absl::string_view owner) {
  const std::set<int> wanted = store_rows::FinalStatesWanted(states);
  std::vector<StoredJob> out;
  if (limit <= 0 || wanted.empty()) return out;
  std::string list = "{";
  for (int state : wanted) absl::StrAppend(&list, list.size() > 1 ? "," : "", state);
  list += "}";
  Params params;
  params.Add(list).Add(before_seq).Add(int64_t{limit});
  if (!owner.empty()) params.Add(owner);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = ReadJobs(
          absl::StrCat("SELECT j.seq, j.job, p.progress FROM jobs j LEFT JOIN progress p ON "
                       "p.job_id = j.id WHERE j.state = ANY($1::bigint[]) AND j.seq < $2",
                       owner.empty() ? "" : " AND j.owner = $4", " ORDER BY j.seq DESC LIMIT $3"),
          params, /*with_progress=*/true, &out);
      !s.ok()) {
    return s;
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, v1::JobState>>> PostgresJobStore::FinishedBefore(
    int64_t unix_ms, int limit) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<pg::Result> r =
      db_->Exec(absl::StrCat("SELECT id, state FROM jobs WHERE state IN ", kFinalJobStates,
                             " AND finished_ms <= $1 ORDER BY finished_ms, seq LIMIT $2"),
                Params().Add(unix_ms).Add(int64_t{limit}));
  if (!r.ok()) return r.status();
  std::vector<std::pair<std::string, v1::JobState>> out;
  for (int i = 0; i < r->rows(); ++i) {
    out.emplace_back(r->Text(i, 0), static_cast<v1::JobState>(r->Int(i, 1)));
  }
  return out;
}

absl::StatusOr<std::vector<StoredToken>> PostgresJobStore::LoadTokens() {
  absl::MutexLock lock(&mu_);
  return TokensLocked();
}

absl::StatusOr<std::vector<StoredToken>> PostgresJobStore::TokensLocked() {
  absl::StatusOr<pg::Result> r = db_->Exec(
      "SELECT id, name, role, hash, created_ms, expires_ms, revoked_ms, created_by, "
      "revoked_by FROM tokens ORDER BY created_ms, id");
  if (!r.ok()) return r.status();
  std::vector<StoredToken> out;
  for (int i = 0; i < r->rows(); ++i) {
    StoredToken t;
    t.id = r->Text(i, 0);
    t.name = r->Text(i, 1);
    t.role = r->Text(i, 2);
    t.hash = r->Text(i, 3);
    t.created_unix_ms = r->Int(i, 4);
    t.expires_unix_ms = r->Int(i, 5);
    t.revoked_unix_ms = r->Int(i, 6);
    t.created_by = r->Text(i, 7);
    t.revoked_by = r->Text(i, 8);
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<std::vector<v1::Queue>> PostgresJobStore::LoadQueues() {
  absl::MutexLock lock(&mu_);
  return QueuesLocked();
}

absl::StatusOr<std::vector<v1::Queue>> PostgresJobStore::QueuesLocked() {
  absl::StatusOr<pg::Result> r = db_->Exec("SELECT name, queue FROM queues ORDER BY name");
  if (!r.ok()) return r.status();
  std::vector<v1::Queue> out;
  for (int i = 0; i < r->rows(); ++i) {
    if (!out.emplace_back().ParseFromString(r->Text(i, 1))) {
      return absl::DataLossError(absl::StrCat("queues row '", r->Text(i, 0), "' does not parse"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<v1::MetricPoint>> PostgresJobStore::LoadMetricHistory(
    absl::string_view job_id, int64_t after_unix_ms) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<pg::Result> r = db_->Exec(
      "SELECT unix_ms, progress FROM metric_points WHERE job_id = $1 AND unix_ms > $2 ORDER BY "
      "unix_ms",
      Params().Add(job_id).Add(after_unix_ms));
  if (!r.ok()) return r.status();
  std::vector<v1::MetricPoint> out;
  out.reserve(r->rows());
  for (int i = 0; i < r->rows(); ++i) {
    v1::MetricPoint& point = out.emplace_back();
    point.set_unix_ms(r->Int(i, 0));
    if (!point.mutable_progress()->ParseFromString(r->Text(i, 1))) {
      return absl::DataLossError(
          absl::StrCat("metric_points row (", job_id, ", ", r->Int(i, 0), ") does not parse"));
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>>
PostgresJobStore::LoadMetricKeys(const std::vector<std::string>& job_ids) {
  // A round trip per 500 jobs, not per job: a coordinator taking over loads every job not
  // finished, most of which never reported.
  constexpr size_t kJobsPerQuery = 500;
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> out;
  for (size_t from = 0; from < job_ids.size(); from += kJobsPerQuery) {
    const size_t to = std::min(job_ids.size(), from + kJobsPerQuery);
    Params params;
    std::string placeholders;
    for (size_t i = from; i < to; ++i) {
      params.Add(job_ids[i]);
      absl::StrAppend(&placeholders, i == from ? "" : ", ", "$", i - from + 1);
    }
    absl::StatusOr<pg::Result> r =
        db_->Exec(absl::StrCat("SELECT job_id, unix_ms, step FROM metric_points WHERE job_id IN (",
                               placeholders, ") ORDER BY job_id, unix_ms"),
                  params);
    if (!r.ok()) return r.status();
    for (int i = 0; i < r->rows(); ++i) {
      out[r->Text(i, 0)].emplace_back(r->Int(i, 1), r->Int(i, 2));
    }
  }
  return out;
}

absl::StatusOr<std::vector<StoredSearch>> PostgresJobStore::LoadSearches() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::vector<StoredSearch>> out;
  absl::Status s = InSnapshot(*db_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    out = SearchesLocked();
    return out.status();
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<StoredSearch>> PostgresJobStore::SearchesLocked() {
  std::vector<StoredSearch> out;
  absl::StatusOr<pg::Result> r = db_->Exec("SELECT seq, search FROM searches ORDER BY seq");
  if (!r.ok()) return r.status();
  std::map<std::string, size_t> by_id;
  for (int i = 0; i < r->rows(); ++i) {
    StoredSearch stored;
    stored.seq = r->Int(i, 0);
    if (!stored.search.ParseFromString(r->Text(i, 1))) {
      return absl::DataLossError(absl::StrCat("searches row ", stored.seq, " does not parse"));
    }
    by_id[stored.search.id()] = out.size();
    out.push_back(std::move(stored));
  }
  r = db_->Exec("SELECT search_id, number, trial FROM trials ORDER BY search_id, number");
  if (!r.ok()) return r.status();
  for (int i = 0; i < r->rows(); ++i) {
    auto it = by_id.find(r->Text(i, 0));
    if (it == by_id.end()) continue;  // a trial of no search: nothing refers to it
    if (!out[it->second].search.add_trials()->ParseFromString(r->Text(i, 2))) {
      return absl::DataLossError(
          absl::StrCat("trials row (", r->Text(i, 0), ", ", r->Int(i, 1), ") does not parse"));
    }
  }
  return out;
}

absl::StatusOr<StoreContents> PostgresJobStore::Load(bool active_only) {
  absl::MutexLock lock(&mu_);
  StoreContents out;
  absl::Status s = InSnapshot(
      *db_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return LoadLocked(active_only, &out); });
  if (!s.ok()) return s;
  return out;
}

absl::Status PostgresJobStore::LoadLocked(bool active_only, StoreContents* out) {
  if (!active_only) {
    if (absl::Status s =
            ReadJobs("SELECT seq, job FROM jobs ORDER BY seq", Params(), false, &out->jobs);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadDetails("", Params(), out->jobs, &out->checkpoints); !s.ok()) {
      return s;
    }
  } else {
    // The jobs not finished, and the final ones with a task not ended; in one snapshot, so the
    // details' subquery selects the same jobs.
    const std::string which =
        absl::StrCat("(SELECT id FROM jobs WHERE state IN ", kActiveJobStates,
                     " UNION SELECT job_id FROM tasks WHERE state IN ", kLiveTaskStates, ")");
    if (absl::Status s =
            ReadJobs(absl::StrCat("SELECT seq, job FROM jobs WHERE id IN ", which, " ORDER BY seq"),
                     Params(), false, &out->jobs);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadDetails(which, Params(), out->jobs, &out->checkpoints); !s.ok()) {
      return s;
    }
    if (absl::Status s = CountFinished(&out->not_loaded); !s.ok()) return s;
    for (const StoredJob& j : out->jobs) {
      if (IsFinalJobState(j.job.state())) out->not_loaded[j.job.state()]--;
    }
  }
  if (absl::Status s = ReadWorkers("", Params(), &out->workers); !s.ok()) return s;
  return ReadNextJobSeq(&out->next_job_seq);
}

absl::Status PostgresJobStore::CountFinished(std::map<v1::JobState, int64_t>* out) {
  absl::StatusOr<pg::Result> r = db_->Exec(absl::StrCat(
      "SELECT state, COUNT(*) FROM jobs WHERE state NOT IN ", kActiveJobStates, " GROUP BY state"));
  if (!r.ok()) return r.status();
  for (int i = 0; i < r->rows(); ++i) {
    (*out)[static_cast<v1::JobState>(r->Int(i, 0))] = r->Int(i, 1);
  }
  return absl::OkStatus();
}

absl::Status PostgresJobStore::ReadWorkers(absl::string_view where, const Params& params,
                                           std::vector<v1::Worker>* out) {
  absl::StatusOr<pg::Result> r =
      db_->Exec(absl::StrCat("SELECT id, worker FROM workers", where, " ORDER BY id"), params);
  if (!r.ok()) return r.status();
  for (int i = 0; i < r->rows(); ++i) {
    if (!out->emplace_back().ParseFromString(r->Text(i, 1))) {
      return absl::DataLossError(absl::StrCat("workers row '", r->Text(i, 0), "' does not parse"));
    }
  }
  return absl::OkStatus();
}

absl::Status PostgresJobStore::ReadNextJobSeq(int64_t* out) {
  absl::StatusOr<pg::Result> r = db_->Exec("SELECT value FROM meta WHERE key = 'next_job_seq'");
  if (!r.ok()) return r.status();
  if (r->rows() > 0 && !absl::SimpleAtoi(r->Text(0, 0), out)) {
    return absl::DataLossError(absl::StrCat("bad next_job_seq '", r->Text(0, 0), "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StoreChanges> PostgresJobStore::ReadChanges(absl::string_view since,
                                                           bool count_finished) {
  absl::MutexLock lock(&mu_);
  StoreChanges out;
  absl::Status s = InSnapshot(*db_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    // In REPEATABLE READ the current snapshot is the transaction's: the one every read below sees.
    absl::StatusOr<pg::Result> r = db_->Exec("SELECT pg_current_snapshot()::text");
    if (!r.ok()) return r.status();
    out.snapshot = r->Text(0, 0);
    if (since.empty()) {
      out.everything = true;
      if (absl::Status s = LoadLocked(/*active_only=*/true, &out.contents); !s.ok()) return s;
      out.finished = std::move(out.contents.not_loaded);
      out.contents.not_loaded.clear();
      for (const StoredJob& j : out.contents.jobs) {
        if (IsFinalJobState(j.job.state())) out.finished[j.job.state()]++;
      }
      auto queues = QueuesLocked();
      if (!queues.ok()) return queues.status();
      out.queues = *std::move(queues);
      auto tokens = TokensLocked();
      if (!tokens.ok()) return tokens.status();
      out.tokens = *std::move(tokens);
      auto searches = SearchesLocked();
      if (!searches.ok()) return searches.status();
      out.searches = *std::move(searches);
      return absl::OkStatus();
    }
    // The rows this snapshot sees and `since` did not: the transactions committed in between.
    r = db_->Exec(
        "SELECT DISTINCT kind, key FROM changes WHERE xid >= pg_snapshot_xmin($1::pg_snapshot) "
        "AND NOT pg_visible_in_snapshot(xid, $1::pg_snapshot)",
        Params().Add(since));
    if (!r.ok()) return r.status();
    std::set<std::string> kinds;
    for (int i = 0; i < r->rows(); ++i) {
      const std::string kind = r->Text(i, 0);
      if (kind == kJobChange) {
        out.jobs.insert(r->Text(i, 1));
      } else if (kind == kWorkerChange) {
        out.workers.insert(r->Text(i, 1));
      } else {
        kinds.insert(kind);
      }
    }
    if (!out.jobs.empty()) {
      const std::vector<std::string> ids(out.jobs.begin(), out.jobs.end());
      const Params ids_param = Params().Add(pg::TextArray(ids));
      // As LoadActive selects them, among the changed jobs.
      const std::string which = absl::StrCat(
          "(SELECT id FROM jobs WHERE id = ANY($1::text[]) AND state IN ", kActiveJobStates,
          " UNION SELECT job_id FROM tasks WHERE job_id = ANY($1::text[]) AND state IN ",
          kLiveTaskStates, ")");
      if (absl::Status s = ReadJobs(
              absl::StrCat("SELECT seq, job FROM jobs WHERE id IN ", which, " ORDER BY seq"),
              ids_param, false, &out.contents.jobs);
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              ReadDetails(which, ids_param, out.contents.jobs, &out.contents.checkpoints);
          !s.ok()) {
        return s;
      }
    }
    if (!out.workers.empty()) {
      const std::vector<std::string> ids(out.workers.begin(), out.workers.end());
      if (absl::Status s = ReadWorkers(" WHERE id = ANY($1::text[])",
                                       Params().Add(pg::TextArray(ids)), &out.contents.workers);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = ReadNextJobSeq(&out.contents.next_job_seq); !s.ok()) return s;
    if (count_finished) {
      if (absl::Status s = CountFinished(&out.finished); !s.ok()) return s;
    }
    if (kinds.count(kQueuesChange)) {
      auto queues = QueuesLocked();
      if (!queues.ok()) return queues.status();
      out.queues = *std::move(queues);
    }
    if (kinds.count(kTokensChange)) {
      auto tokens = TokensLocked();
      if (!tokens.ok()) return tokens.status();
      out.tokens = *std::move(tokens);
    }
    if (kinds.count(kSearchesChange)) {
      auto searches = SearchesLocked();
      if (!searches.ok()) return searches.status();
      out.searches = *std::move(searches);
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

}  // namespace trainyard
