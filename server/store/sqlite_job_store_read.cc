// The job store's reads: jobs with their details, finished jobs, tokens, searches.
#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/lifecycle/job_state.h"
#include "server/store/sqlite_job_store.h"
#include "server/store/sqlite_statement.h"
#include "server/store/store_rows.h"

namespace trainyard {

using sqlite::SqliteError;
using sqlite::Statement;

using store_rows::kActiveJobStates;
using store_rows::kEventColumns;
using store_rows::kLiveTaskStates;
using store_rows::kTaskColumns;
using store_rows::kTaskOrder;
using store_rows::ReadEvent;
using store_rows::ReadTask;

absl::Status SqliteJobStore::ReadJobs(const std::string& sql, int64_t bound, bool with_progress,
                                      std::vector<StoredJob>* out, absl::string_view owner) {
  Statement st(db_, sql);
  if (bound != kNoBound) st.Bind(1, bound);
  if (!owner.empty()) st.Bind(2, owner);
  while (st.Next()) {
    StoredJob stored;
    stored.seq = st.Int(0);
    if (!stored.job.ParseFromString(st.Text(1))) {
      return absl::DataLossError(absl::StrCat("jobs row seq ", stored.seq, " does not parse"));
    }
    if (with_progress && !st.IsNull(2) &&
        !stored.job.mutable_progress()->ParseFromString(st.Text(2))) {
      return absl::DataLossError(
          absl::StrCat("progress of job seq ", stored.seq, " does not parse"));
    }
    out->push_back(std::move(stored));
  }
  return st.step_status();
}

absl::Status SqliteJobStore::ReadDetails(const std::string& which,
                                         const std::optional<std::string>& param,
                                         std::vector<StoredJob>& jobs,
                                         std::vector<StoredCheckpoint>* checkpoints) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < jobs.size(); ++i) index[jobs[i].job.id()] = i;
  const std::string where =
      which.empty() ? std::string() : absl::StrCat(" WHERE job_id IN ", which);
  {
    Statement st(
        db_, absl::StrCat("SELECT job_id, ", kEventColumns, " FROM events", where, " ORDER BY id"));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      auto it = index.find(st.Text(0));
      if (it != index.end()) ReadEvent(st, 1, jobs[it->second].job.add_events());
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, absl::StrCat("SELECT t.job_id, ", kTaskColumns, " FROM tasks t", where,
                                   " ORDER BY t.job_id, ", kTaskOrder));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      auto it = index.find(st.Text(0));
      if (it != index.end()) ReadTask(st, 1, jobs[it->second].job.add_tasks());
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, absl::StrCat("SELECT job_id, progress FROM progress", where));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      auto it = index.find(st.Text(0));
      if (it == index.end()) continue;
      if (!jobs[it->second].job.mutable_progress()->ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("progress row '", st.Text(0), "' does not parse"));
      }
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, absl::StrCat("SELECT job_id, step, uri, size_bytes, created_ms, generation, "
                                   "retired, retired_by FROM checkpoints",
                                   where, " ORDER BY job_id, step"));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      if (!index.count(st.Text(0))) continue;
      StoredCheckpoint c;
      c.checkpoint.set_job_id(st.Text(0));
      c.checkpoint.set_step(st.Int(1));
      c.checkpoint.set_uri(st.Text(2));
      c.checkpoint.set_size_bytes(st.Int(3));
      c.checkpoint.set_created_unix_ms(st.Int(4));
      c.checkpoint.set_generation(st.Int(5));
      c.retired = st.Int(6) != 0;
      c.retired_by_step = st.Int(7);
      checkpoints->push_back(std::move(c));
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredJobRecord> SqliteJobStore::LoadJob(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  std::vector<StoredJob> jobs;
  {
    Statement st(db_, "SELECT seq, job FROM jobs WHERE id = ?");
    st.Bind(1, job_id);
    if (st.Next()) {
      StoredJob& stored = jobs.emplace_back();
      stored.seq = st.Int(0);
      if (!stored.job.ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("jobs row '", job_id, "' does not parse"));
      }
    } else if (absl::Status s = st.step_status(); !s.ok()) {
      return s;
    } else {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' not in the store"));
    }
  }
  // One job: its rows through the by-job indexes.
  StoredJobRecord record;
  if (absl::Status s = ReadDetails("(?)", std::string(job_id), jobs, &record.checkpoints);
      !s.ok()) {
    return s;
  }
  record.job = std::move(jobs[0]);
  return record;
}

absl::StatusOr<std::vector<StoredJob>> SqliteJobStore::ListFinishedJobs(
    const std::vector<v1::JobState>& states, int64_t before_seq, int limit,
    absl::string_view owner) {
  const std::set<int> wanted = store_rows::FinalStatesWanted(states);
  std::vector<StoredJob> out;
  if (limit <= 0) return out;
  // A query per state, each a walk down jobs_by_state from before_seq that stops at `limit`
  // (one query over several states would sort all of their jobs first), merged by seq.
  absl::MutexLock lock(&mu_);
  for (int state : wanted) {
    const std::string sql = absl::StrCat(
        "SELECT j.seq, j.job, p.progress FROM jobs j INDEXED BY ",
        owner.empty() ? "jobs_by_state" : "jobs_by_owner",
        " LEFT JOIN progress p ON p.job_id = j.id WHERE j.state = ", state, " AND j.seq < ?",
        owner.empty() ? "" : " AND j.owner = ?", " ORDER BY j.seq DESC LIMIT ", limit);
    if (absl::Status s = ReadJobs(sql, before_seq, /*with_progress=*/true, &out, owner); !s.ok()) {
      return s;
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StoredJob& a, const StoredJob& b) { return a.seq > b.seq; });
  if (static_cast<int>(out.size()) > limit) out.resize(limit);
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, v1::JobState>>> SqliteJobStore::FinishedBefore(
    int64_t unix_ms, int limit) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, v1::JobState>> out;
  // A walk along the partial index jobs_finished (its WHERE is repeated word for word) that stops
  // at `limit`.
  Statement st(db_,
               "SELECT id, state FROM jobs INDEXED BY jobs_finished WHERE state IN (4, 5, 6) AND "
               "finished_ms <= ? ORDER BY finished_ms, seq LIMIT ?");
  st.Bind(1, unix_ms).Bind(2, int64_t{limit});
  while (st.Next()) out.emplace_back(st.Text(0), static_cast<v1::JobState>(st.Int(1)));
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<StoredToken>> SqliteJobStore::LoadTokens() {
  absl::MutexLock lock(&mu_);
  std::vector<StoredToken> out;
  Statement st(db_,
               "SELECT id, name, role, hash, created_ms, expires_ms, revoked_ms, created_by, "
               "revoked_by FROM tokens ORDER BY created_ms, id");
  while (st.Next()) {
    StoredToken t;
    t.id = st.Text(0);
    t.name = st.Text(1);
    t.role = st.Text(2);
    t.hash = st.Text(3);
    t.created_unix_ms = st.Int(4);
    t.expires_unix_ms = st.Int(5);
    t.revoked_unix_ms = st.Int(6);
    t.created_by = st.Text(7);
    t.revoked_by = st.Text(8);
    out.push_back(std::move(t));
  }
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<v1::Queue>> SqliteJobStore::LoadQueues() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Queue> out;
  Statement st(db_, "SELECT name, queue FROM queues ORDER BY name");
  while (st.Next()) {
    v1::Queue queue;
    if (!queue.ParseFromString(st.Text(1))) {
      return absl::DataLossError(absl::StrCat("queues row '", st.Text(0), "' does not parse"));
    }
    out.push_back(std::move(queue));
  }
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<v1::MetricPoint>> SqliteJobStore::LoadMetricHistory(
    absl::string_view job_id, int64_t after_unix_ms) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::MetricPoint> out;
  Statement st(db_,
               "SELECT unix_ms, progress FROM metric_points WHERE job_id = ? AND unix_ms > ? "
               "ORDER BY unix_ms");
  st.Bind(1, job_id).Bind(2, after_unix_ms);
  while (st.Next()) {
    v1::MetricPoint& point = out.emplace_back();
    point.set_unix_ms(st.Int(0));
    if (!point.mutable_progress()->ParseFromString(st.Text(1))) {
      return absl::DataLossError(
          absl::StrCat("metric_points row (", job_id, ", ", st.Int(0), ") does not parse"));
    }
  }
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>>
SqliteJobStore::LoadMetricKeys(const std::vector<std::string>& job_ids) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> out;
  for (const std::string& job_id : job_ids) {
    Statement st(db_, "SELECT unix_ms, step FROM metric_points WHERE job_id = ? ORDER BY unix_ms");
    st.Bind(1, job_id);
    while (st.Next()) out[job_id].emplace_back(st.Int(0), st.Int(1));
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  return out;
}

absl::StatusOr<std::vector<StoredSearch>> SqliteJobStore::LoadSearches() {
  absl::MutexLock lock(&mu_);
  std::vector<StoredSearch> out;
  std::map<std::string, size_t> by_id;
  {
    Statement st(db_, "SELECT seq, search FROM searches ORDER BY seq");
    while (st.Next()) {
      StoredSearch stored;
      stored.seq = st.Int(0);
      if (!stored.search.ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("searches row ", stored.seq, " does not parse"));
      }
      by_id[stored.search.id()] = out.size();
      out.push_back(std::move(stored));
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  Statement st(db_, "SELECT search_id, number, trial FROM trials ORDER BY search_id, number");
  while (st.Next()) {
    auto it = by_id.find(st.Text(0));
    if (it == by_id.end()) continue;  // a trial of no search: nothing refers to it
    if (!out[it->second].search.add_trials()->ParseFromString(st.Text(2))) {
      return absl::DataLossError(
          absl::StrCat("trials row (", st.Text(0), ", ", st.Int(1), ") does not parse"));
    }
  }
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<StoreContents> SqliteJobStore::Load(bool active_only) {
  absl::MutexLock lock(&mu_);
  StoreContents out;
  if (!active_only) {
    if (absl::Status s =
            ReadJobs("SELECT seq, job FROM jobs ORDER BY seq", kNoBound, false, &out.jobs);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadDetails("", std::nullopt, out.jobs, &out.checkpoints); !s.ok())
      return s;
  } else {
    // The jobs not finished (through jobs_by_state), then the final ones with a task not ended
    // (through tasks_live); their ids go to a temporary table that the other reads join.
    if (absl::Status s = ReadJobs(absl::StrCat("SELECT seq, job FROM jobs WHERE state IN ",
                                               kActiveJobStates, " ORDER BY seq"),
                                  kNoBound, false, &out.jobs);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            ReadJobs(absl::StrCat("SELECT seq, job FROM jobs WHERE state NOT IN ", kActiveJobStates,
                                  " AND id IN (SELECT job_id FROM tasks WHERE state IN ",
                                  kLiveTaskStates, ") ORDER BY seq"),
                     kNoBound, false, &out.jobs);
        !s.ok()) {
      return s;
    }
    std::sort(out.jobs.begin(), out.jobs.end(),
              [](const StoredJob& a, const StoredJob& b) { return a.seq < b.seq; });
    if (absl::Status s = Exec("CREATE TEMP TABLE IF NOT EXISTS loading(id TEXT PRIMARY KEY); "
                              "DELETE FROM temp.loading");
        !s.ok()) {
      return s;
    }
    for (const StoredJob& j : out.jobs) {
      Statement st(db_, "INSERT INTO temp.loading(id) VALUES(?)");
      if (absl::Status s = st.Bind(1, j.job.id()).Run(); !s.ok()) return s;
    }
    absl::Status read =
        ReadDetails("(SELECT id FROM temp.loading)", std::nullopt, out.jobs, &out.checkpoints);
    Exec("DELETE FROM temp.loading").IgnoreError();
    if (!read.ok()) return read;
    Statement st(db_, absl::StrCat("SELECT state, COUNT(*) FROM jobs WHERE state NOT IN ",
                                   kActiveJobStates, " GROUP BY state"));
    while (st.Next()) out.not_loaded[static_cast<v1::JobState>(st.Int(0))] = st.Int(1);
    if (absl::Status s = st.step_status(); !s.ok()) return s;
    for (const StoredJob& j : out.jobs) {
      if (IsFinalJobState(j.job.state())) out.not_loaded[j.job.state()]--;
    }
  }
  {
    Statement st(db_, "SELECT id, worker FROM workers ORDER BY id");
    while (st.Next()) {
      v1::Worker w;
      if (!w.ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("workers row '", st.Text(0), "' does not parse"));
      }
      out.workers.push_back(std::move(w));
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, "SELECT value FROM meta WHERE key = 'next_job_seq'");
    if (st.Next()) {
      if (!absl::SimpleAtoi(st.Text(0), &out.next_job_seq)) {
        return absl::DataLossError(absl::StrCat("bad next_job_seq '", st.Text(0), "'"));
      }
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  return out;
}

}  // namespace trainyard
