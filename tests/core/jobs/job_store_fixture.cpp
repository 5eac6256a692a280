#include "tests/core/jobs/job_store_fixture.h"

#include <algorithm>

namespace backhaul::jobs::testing {
namespace {

template <typename T>
void field(std::ostringstream& out, const char* name, const std::optional<T>& value) {
  out << name << '=';
  if (value) {
    out << '<' << *value << '>';
  } else {
    out << "null";
  }
  out << ' ';
}

template <typename T>
void field(std::ostringstream& out, const char* name, const T& value) {
  out << name << '=' << value << ' ';
}

}  // namespace

std::string describe(const Job& j) {
  std::ostringstream out;
  field(out, "id", j.id);
  field(out, "kind", j.kind);
  field(out, "key", j.concurrency_key);
  field(out, "dedupe", j.dedupe_key);
  field(out, "payload", j.payload);
  field(out, "status", to_string(j.status));
  field(out, "priority", j.priority);
  field(out, "attempts", j.attempts);
  field(out, "max_attempts", j.max_attempts);
  field(out, "run_after", j.run_after_ms);
  field(out, "owner", j.lease_owner);
  field(out, "token", j.lease_token);
  field(out, "lease_expires", j.lease_expires_ms);
  field(out, "checkpoint", j.checkpoint);
  field(out, "result", j.result);
  field(out, "last_error", j.last_error);
  field(out, "parent", j.parent_id);
  field(out, "pending_children", j.pending_children);
  field(out, "wait_deadline", j.wait_deadline_ms);
  field(out, "timeout", j.timeout_ms);
  field(out, "cancel_requested", j.cancel_requested);
  field(out, "created", j.created_ms);
  field(out, "started", j.started_ms);
  field(out, "finished", j.finished_ms);
  field(out, "updated", j.updated_ms);
  return out.str();
}

std::string describe(const std::vector<Attempt>& attempts) {
  std::ostringstream out;
  for (const auto& a : attempts) {
    out << '{';
    field(out, "job", a.job_id);
    field(out, "attempt", a.attempt);
    field(out, "owner", a.owner);
    field(out, "started", a.started_ms);
    field(out, "finished", a.finished_ms);
    field(out, "outcome", a.outcome);
    field(out, "error", a.error);
    out << "} ";
  }
  return out.str();
}

std::string describe(const DeadLetter& l) {
  std::ostringstream out;
  field(out, "id", l.id);
  field(out, "job", l.job_id);
  field(out, "kind", l.kind);
  field(out, "key", l.concurrency_key);
  field(out, "status", to_string(l.status));
  field(out, "error", l.error);
  field(out, "retries", l.retries);
  field(out, "created", l.created_ms);
  field(out, "updated", l.updated_ms);
  return out.str();
}

std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info) {
  return backend_name(info.param);
}

void JobStoreConformance::SetUp() {
  try {
    db_ = TestDatabase::create(GetParam());
    store_ = db_->open();
  } catch (const std::exception& e) {
    FAIL() << "cannot open a fresh " << backend_name(GetParam()) << " job store: " << e.what();
  }
  ASSERT_NE(store_, nullptr) << "open_" << backend_name(GetParam()) << "_store returned null";
}

void JobStoreConformance::TearDown() {
  store_.reset();
  db_.reset();
}

JobSpec JobStoreConformance::spec(std::string kind, std::string key) {
  JobSpec s;
  s.kind = std::move(kind);
  s.payload = R"({"resource":"octo/repo","entity":"issue"})";
  s.concurrency_key = std::move(key);
  return s;
}

JobId JobStoreConformance::add(const JobSpec& s, int64_t now_ms) {
  EnqueueResult r = store().enqueue(s, now_ms);
  if (!r.created) {
    throw Unexpected("enqueue of kind " + s.kind + " was deduplicated to job " +
                     std::to_string(r.id));
  }
  return r.id;
}

JobId JobStoreConformance::add_child(JobId parent, std::string kind, int64_t now_ms) {
  JobSpec s = spec(std::move(kind));
  s.parent_id = parent;
  return add(s, now_ms);
}

std::vector<Claimed> JobStoreConformance::claim(size_t limit, int64_t now_ms,
                                                std::vector<std::string> kinds,
                                                const std::string& owner, int64_t lease_ms) {
  ClaimRequest request;
  request.owner = owner;
  request.limit = limit;
  request.now_ms = now_ms;
  request.lease_ms = lease_ms;
  request.kinds = std::move(kinds);
  return store().claim(request);
}

Claimed JobStoreConformance::claim_one(int64_t now_ms, const std::string& owner, int64_t lease_ms) {
  std::vector<Claimed> claimed = claim(1, now_ms, {}, owner, lease_ms);
  if (claimed.size() != 1) {
    throw Unexpected("expected to claim one job at " + std::to_string(now_ms) + ", claimed " +
                     std::to_string(claimed.size()));
  }
  return claimed.front();
}

Claimed JobStoreConformance::claim_job(JobId id, int64_t now_ms, const std::string& owner,
                                       int64_t lease_ms) {
  std::vector<Claimed> claimed = claim(1, now_ms, {get_job(id).kind}, owner, lease_ms);
  if (claimed.empty()) {
    throw Unexpected("expected to claim job " + std::to_string(id) + " at " +
                     std::to_string(now_ms) + ", claimed nothing: " + describe(get_job(id)));
  }
  const Claimed& c = claimed.front();
  if (c.job.id != id) {
    throw Unexpected("expected to claim job " + std::to_string(id) + ", claimed job " +
                     std::to_string(c.job.id));
  }
  return c;
}

Job JobStoreConformance::get_job(JobId id) {
  std::optional<Job> j = store().get(id);
  if (!j) throw Unexpected("job " + std::to_string(id) + " does not exist");
  return *j;
}

JobId JobStoreConformance::add_dead(const JobSpec& s, const std::string& error, int64_t now_ms) {
  JobId id = add(s, now_ms);
  Claimed c = claim_job(id, now_ms);
  Failure failure;
  failure.error = error;
  failure.fatal = true;
  JobStatus st = store().fail(id, c.lease_token, failure, now_ms);
  if (st != JobStatus::kDead) {
    throw Unexpected("a FATAL failure left job " + std::to_string(id) + " " +
                     std::string(to_string(st)));
  }
  return id;
}

DeadLetter JobStoreConformance::letter_of(JobId job_id) {
  std::vector<DeadLetter> found;
  for (const DeadLetter& l : letters_all({})) {
    if (l.job_id == job_id) found.push_back(l);
  }
  if (found.size() != 1) {
    throw Unexpected("job " + std::to_string(job_id) + " has " + std::to_string(found.size()) +
                     " dead letters, expected one");
  }
  return found.front();
}

namespace {

// Follows the paging cursor of a newest-first listing until the last page.
template <typename Item, typename Query, typename Fetch>
std::vector<Item> all_pages(Query query, Fetch fetch) {
  std::vector<Item> all;
  std::optional<int64_t> previous_cursor;
  for (int pages = 0;; ++pages) {
    if (pages > 100'000) throw Unexpected("paging does not terminate");
    auto page = fetch(query);
    auto& items = page.first;
    if (items.size() > query.limit) {
      throw Unexpected("a page holds " + std::to_string(items.size()) + " items, limit is " +
                       std::to_string(query.limit));
    }
    all.insert(all.end(), items.begin(), items.end());
    if (!page.second) break;
    if (previous_cursor && *page.second >= *previous_cursor) {
      throw Unexpected("the paging cursor does not move backwards: " +
                       std::to_string(*page.second));
    }
    previous_cursor = page.second;
    query.before_id = page.second;
  }
  return all;
}

}  // namespace

std::vector<Job> JobStoreConformance::list_all(JobQuery query) {
  if (query.limit == 0) query.limit = 50;
  return all_pages<Job>(query, [&](const JobQuery& q) {
    JobPage p = store().list(q);
    return std::make_pair(p.jobs, p.next_before);
  });
}

std::vector<DeadLetter> JobStoreConformance::letters_all(DeadLetterQuery query) {
  if (query.limit == 0) query.limit = 50;
  return all_pages<DeadLetter>(query, [&](const DeadLetterQuery& q) {
    DeadLetterPage p = store().list_dead_letters(q);
    return std::make_pair(p.items, p.next_before);
  });
}

std::vector<JobId> JobStoreConformance::ids(const std::vector<Job>& jobs) {
  std::vector<JobId> out;
  for (const auto& j : jobs) out.push_back(j.id);
  return out;
}

std::vector<JobId> JobStoreConformance::ids(const std::vector<Claimed>& claimed) {
  std::vector<JobId> out;
  for (const auto& c : claimed) out.push_back(c.job.id);
  return out;
}

std::vector<int64_t> JobStoreConformance::ids(const std::vector<DeadLetter>& letters) {
  std::vector<int64_t> out;
  for (const auto& l : letters) out.push_back(l.id);
  return out;
}

}  // namespace backhaul::jobs::testing
