// Membership: generations agreed through a Store, heartbeats, joins.
//
// Store keys (relative to the store given to Create):
//   job                 the job id (set once, by compare-and-set)
//   incarnation         a random token written once, by compare-and-set, by
//                       the first replica of the job on this store; every
//                       generation record and join ticket carries it, and
//                       members check it at every heartbeat: a store that
//                       lost it (wiped, replaced) stops the job instead of
//                       letting newcomers fork it
//   model               the model digest (set once)
//   hb/<id>             heartbeat: "<session>:<counter>", rewritten every
//                       heartbeat; only changes are meaningful (leased for
//                       peer_timeout where the store has leases: etcd)
//   join/seq            counter of join requests ("tickets")
//   join/<t>            ticket t: JSON {id, host, rack, switch, session};
//                       {withdrawn, id, session} once its holder left
//   gen/latest          a hint: the newest generation number written
//   gen/<N>             generation N: JSON {number, kind, at_step, members,
//                       joined, left}; written once, by compare-and-set
//   gen/<N>/alive/<id>  "I survived generation N's failure" (Recover)
//   gen/<N>/abandoned   a member gave up on generation N (the id of the
//                       last to enter Recover from it): one key for a
//                       communicator's rendezvous to watch (Superseded)
//   gen/<N>/...         communicators of generation N (not used here)
#include "omni/membership.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_name.h"
#include "nlohmann/json.hpp"
#include "omni/clock.h"

namespace omni {

const char* GenerationKindName(GenerationKind kind) {
  switch (kind) {
    case GenerationKind::kInitial:
      return "initial";
    case GenerationKind::kJoin:
      return "join";
    case GenerationKind::kLeave:
      return "leave";
    case GenerationKind::kRecover:
      return "recover";
  }
  return "unknown";
}

absl::StatusOr<GenerationKind> ParseGenerationKind(std::string_view name) {
  for (GenerationKind k : {GenerationKind::kInitial, GenerationKind::kJoin, GenerationKind::kLeave,
                           GenerationKind::kRecover}) {
    if (name == GenerationKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("generation kind '", std::string(name),
                                                 "' is not initial, join, leave or recover"));
}

std::string Generation::ToString() const {
  std::vector<std::string> ids;
  ids.reserve(members.size());
  for (const ReplicaInfo& m : members) ids.push_back(m.id);
  std::string s =
      absl::StrCat("generation ", number, " (", GenerationKindName(kind), "): ", members.size(),
                   " replica", members.size() == 1 ? "" : "s", " [", absl::StrJoin(ids, " "), "]");
  if (!joined.empty()) absl::StrAppend(&s, ", joined ", absl::StrJoin(joined, " "));
  if (!left.empty()) absl::StrAppend(&s, ", left ", absl::StrJoin(left, " "));
  if (rank >= 0) absl::StrAppend(&s, ", rank ", rank);
  return s;
}

namespace {

constexpr char kStoreFailureUrl[] = "omni.dev/store-failure";

}  // namespace

absl::Status MarkStoreFailure(absl::Status status) {
  if (!status.ok()) status.SetPayload(kStoreFailureUrl, absl::Cord("1"));
  return status;
}

bool IsStoreFailure(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kStoreFailureUrl).has_value();
}

namespace {

using Json = nlohmann::json;

constexpr size_t kMaxIdLength = 64;
// A member that neither reports in to Recover nor goes silent is dropped
// after this many peer timeouts (its training thread is stuck).
constexpr int kStuckPeerTimeouts = 10;
constexpr absl::Duration kPoll = absl::Milliseconds(5);
constexpr char kIncarnationKey[] = "incarnation";

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > kMaxIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

Json InfoToJson(const ReplicaInfo& r) {
  return Json{{"id", r.id},
              {"host", r.host},
              {"rack", r.rack},
              {"switch", r.switch_name},
              {"session", r.session}};
}

absl::StatusOr<ReplicaInfo> InfoFromJson(const Json& j) {
  if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) {
    return absl::InvalidArgumentError("replica record without an id");
  }
  ReplicaInfo r;
  r.id = j["id"].get<std::string>();
  if (!ValidId(r.id)) {
    return absl::InvalidArgumentError(absl::StrCat("replica record with a bad id '", r.id, "'"));
  }
  for (auto [field, out] : {std::pair<const char*, std::string*>{"host", &r.host},
                            {"rack", &r.rack},
                            {"switch", &r.switch_name},
                            {"session", &r.session}}) {
    if (!j.contains(field)) continue;
    if (!j[field].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("replica record '", r.id, "': field '", field, "' is not a string"));
    }
    *out = j[field].get<std::string>();
  }
  return r;
}

// Switch, then rack, then host, then id: replicas under one switch (and in
// it, one rack) get contiguous ranks.
void TopologySort(std::vector<ReplicaInfo>& members) {
  std::sort(members.begin(), members.end(), [](const ReplicaInfo& a, const ReplicaInfo& b) {
    return std::tie(a.switch_name, a.rack, a.host, a.id) <
           std::tie(b.switch_name, b.rack, b.host, b.id);
  });
}

std::string GenKey(int64_t n) { return absl::StrCat("gen/", n); }

// DataLoss naming the key and the field, marked as a store failure.
absl::Status BadRecord(const std::string& key, const std::string& field, const std::string& why) {
  return MarkStoreFailure(absl::DataLossError(absl::StrCat(
      "store key '", key, "' is not a valid generation record: field '", field, "' ", why)));
}

// A generation record, every field checked for its type; DataLoss naming
// the key and the field otherwise (never an exception). `number` is the
// number its key names; `incarnation` the job's (a record carrying another
// one is from another incarnation of the store).
absl::StatusOr<Generation> ParseGeneration(const std::string& key, int64_t number,
                                           const std::string& text,
                                           const std::string& incarnation) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return MarkStoreFailure(absl::DataLossError(
        absl::StrCat("store key '", key, "' is not a generation record (not a JSON object)")));
  }
  Generation g;
  const auto integer = [&](const char* field, int64_t& out, bool required) -> absl::Status {
    if (!j.contains(field)) {
      return required ? BadRecord(key, field, "is missing") : absl::OkStatus();
    }
    if (!j[field].is_number_integer()) return BadRecord(key, field, "is not an integer");
    out = j[field].get<int64_t>();
    return absl::OkStatus();
  };
  const auto strings = [&](const char* field, std::vector<std::string>& out) -> absl::Status {
    if (!j.contains(field)) return absl::OkStatus();
    if (!j[field].is_array()) return BadRecord(key, field, "is not an array");
    for (const Json& e : j[field]) {
      if (!e.is_string()) return BadRecord(key, field, "holds an element that is not a string");
      out.push_back(e.get<std::string>());
    }
    return absl::OkStatus();
  };
  if (auto st = integer("number", g.number, true); !st.ok()) return st;
  if (g.number != number) {
    return BadRecord(key, "number", absl::StrCat("is ", g.number, ", not ", number));
  }
  if (!j.contains("kind")) return BadRecord(key, "kind", "is missing");
  if (!j["kind"].is_string()) return BadRecord(key, "kind", "is not a string");
  const std::string kind = j["kind"].get<std::string>();
  absl::StatusOr<GenerationKind> parsed = ParseGenerationKind(kind);
  if (!parsed.ok()) {
    return BadRecord(key, "kind",
                     absl::StrCat("is '", kind, "', not initial, join, leave or recover"));
  }
  g.kind = *parsed;
  if (auto st = integer("at_step", g.at_step, false); !st.ok()) return st;
  if (!j.contains("members") || !j["members"].is_array()) {
    return BadRecord(key, "members", "is missing or not an array");
  }
  for (const Json& m : j["members"]) {
    absl::StatusOr<ReplicaInfo> r = InfoFromJson(m);
    if (!r.ok()) return BadRecord(key, "members", std::string(r.status().message()));
    g.members.push_back(*std::move(r));
  }
  if (auto st = strings("joined", g.joined); !st.ok()) return st;
  if (auto st = strings("left", g.left); !st.ok()) return st;
  // A record written before incarnations were recorded has none.
  if (j.contains("incarnation")) {
    if (!j["incarnation"].is_string()) return BadRecord(key, "incarnation", "is not a string");
    const std::string theirs = j["incarnation"].get<std::string>();
    if (!incarnation.empty() && theirs != incarnation) {
      return MarkStoreFailure(absl::DataLossError(
          absl::StrCat("store key '", key, "' belongs to incarnation '", theirs,
                       "' of the job's store, but this replica joined incarnation '", incarnation,
                       "' (key 'incarnation'): the store lost its state under the running job")));
    }
  }
  return g;
}

std::string SerializeGeneration(const Generation& g, const std::string& incarnation) {
  Json members = Json::array();
  for (const ReplicaInfo& m : g.members) members.push_back(InfoToJson(m));
  return Json{{"number", g.number},        {"kind", GenerationKindName(g.kind)},
              {"at_step", g.at_step},      {"members", members},
              {"joined", g.joined},        {"left", g.left},
              {"incarnation", incarnation}}
      .dump();
}

bool Contains(const std::vector<ReplicaInfo>& v, const std::string& id) {
  return std::any_of(v.begin(), v.end(), [&](const ReplicaInfo& r) { return r.id == id; });
}

// `id` is in `v` as the process of `session` (a record without a session,
// written before sessions were recorded, matches any).
bool ContainsSession(const std::vector<ReplicaInfo>& v, const std::string& id,
                     const std::string& session) {
  return std::any_of(v.begin(), v.end(), [&](const ReplicaInfo& r) {
    return r.id == id && (r.session.empty() || r.session == session);
  });
}

// The session part of a heartbeat value "<session>:<counter>".
std::string SessionOf(const std::string& heartbeat) {
  const size_t colon = heartbeat.rfind(':');
  return colon == std::string::npos ? std::string() : heartbeat.substr(0, colon);
}

// What a heartbeat observer knows of one replica.
struct Observed {
  std::string value;
  bool read = false;     // `value` was read from the store (not just watching)
  int64_t since_ns = 0;  // when `value` was first seen (or watching began)
  int changes = 0;       // changes seen since watching began
  int64_t read_ns = 0;   // when `value` was last read
};

class MembershipImpl final : public Membership {
 public:
  MembershipImpl(Store& store, MembershipOptions options)
      : store_(store), o_(std::move(options)), clock_(o_.clock) {
    std::random_device rd;
    session_ = absl::StrCat(getpid(), "-", rd(), rd());
    self_ = o_.self;
    self_.session = session_;
  }

  ~MembershipImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  MembershipImpl(const MembershipImpl&) = delete;
  MembershipImpl& operator=(const MembershipImpl&) = delete;

  absl::Status Init() {
    if (auto st = CheckIdentity("job", o_.job_id, "job id"); !st.ok()) return st;
    if (!o_.model_digest.empty()) {
      if (auto st = CheckIdentity("model", o_.model_digest, "model digest"); !st.ok()) return st;
    }
    {
      // The first replica of the job on this store names its incarnation.
      std::random_device rd;
      const std::string mine =
          absl::StrCat(absl::Hex(rd(), absl::kZeroPad8), absl::Hex(rd(), absl::kZeroPad8),
                       absl::Hex(rd(), absl::kZeroPad8), absl::Hex(rd(), absl::kZeroPad8));
      absl::StatusOr<std::string> stored =
          Retry(kIncarnationKey, [&] { return store_.CompareAndSet(kIncarnationKey, "", mine); });
      if (!stored.ok()) return stored.status();
      incarnation_ = *stored;
    }
    // An id in use by a live member of the newest generation is refused.
    absl::StatusOr<std::optional<Generation>> latest = LatestFrom(0);
    if (!latest.ok()) return latest.status();
    if (latest->has_value() && Contains((*latest)->members, o_.self.id)) {
      const std::string key = "hb/" + o_.self.id;
      absl::StatusOr<std::optional<std::string>> first =
          Retry(key, [&] { return store_.TryGet(key); });
      if (!first.ok()) return first.status();
      const int64_t until = Now() + absl::ToInt64Nanoseconds(o_.peer_timeout);
      while (Now() < until) {
        SleepFor(o_.heartbeat);
        absl::StatusOr<std::optional<std::string>> now =
            Retry(key, [&] { return store_.TryGet(key); });
        if (!now.ok()) return now.status();
        if (*now != *first) {
          return absl::AlreadyExistsError(
              absl::StrCat("replica id '", o_.self.id, "' is in use by a live member of ",
                           (*latest)->ToString(), ": give every replica its own id"));
        }
      }
    }
    Beat();
    thread_ = std::thread([this] {
      internal::NameThisThread("omni-heartbeat");
      HeartbeatLoop();
    });
    return absl::OkStatus();
  }

  absl::StatusOr<Generation> Join() override {
    if (absl::Status st = StoreFailure(); !st.ok()) return st;
    const int64_t deadline = Now() + absl::ToInt64Nanoseconds(o_.join_timeout);
    {
      absl::StatusOr<int64_t> t = Retry("join/seq", [&] { return store_.Add("join/seq", 1); });
      if (!t.ok()) return t.status();
      const std::string key = absl::StrCat("join/", *t);
      Json ticket = InfoToJson(self_);
      ticket["incarnation"] = incarnation_;
      const std::string info = ticket.dump();
      if (auto st = Retry(key, [&] { return store_.Set(key, info); }); !st.ok()) return st;
      my_ticket_ = *t;
    }
    int64_t last_seq = -1, seq_changed_ns = Now();
    for (;;) {
      if (absl::Status st = StoreFailure(); !st.ok()) return st;
      absl::StatusOr<std::optional<std::string>> finished = ReadRecord("finished");
      if (!finished.ok()) return finished.status();
      if (finished->has_value()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replica '", o_.self.id, "' cannot join: the job finished (", **finished, ")"));
      }
      // The newest generation, also when it is the one that evicted this
      // replica: its live members will admit us, so we are not orphaned (a
      // search from after it found none, and the evicted replica proposed
      // generation 1 again and again, in a busy loop, until admitted).
      absl::StatusOr<std::optional<Generation>> latest = LatestFrom(0);
      if (!latest.ok()) return latest.status();
      // A generation that lists this id as another process (this replica
      // restarted) is not ours: it is an earlier incarnation's.
      if (latest->has_value() && ContainsSession((*latest)->members, o_.self.id, session_)) {
        return Adopt(**latest);
      }
      if (latest->has_value()) Watch((*latest)->members);
      // Nobody to admit us: form a generation with the other joiners, once
      // min_replicas are there and registrations have settled.
      const bool orphaned = !latest->has_value() || AllDead((*latest)->members);
      absl::StatusOr<int64_t> seq = ReadCounter("join/seq");
      if (!seq.ok()) return seq.status();
      if (*seq != last_seq) {
        last_seq = *seq;
        seq_changed_ns = Now();
      }
      if (orphaned) {
        absl::StatusOr<std::vector<ReplicaInfo>> joiners = PendingJoiners({});
        if (!joiners.ok()) return joiners.status();
        const bool settled = Now() - seq_changed_ns >= absl::ToInt64Nanoseconds(o_.settle);
        const int n = static_cast<int>(joiners->size());
        if (n >= o_.min_replicas && (settled || n >= o_.max_replicas)) {
          Generation g;
          g.number = latest->has_value() ? (*latest)->number + 1 : 1;
          g.kind = GenerationKind::kInitial;
          g.at_step = 0;
          g.members = *joiners;
          if (g.members.size() > static_cast<size_t>(o_.max_replicas)) {
            g.members.resize(static_cast<size_t>(o_.max_replicas));
          }
          for (const ReplicaInfo& m : g.members) g.joined.push_back(m.id);
          if (latest->has_value()) {
            for (const ReplicaInfo& m : (*latest)->members) g.left.push_back(m.id);
          }
          if (auto st = Propose(g); !st.ok()) return st.status();
          continue;
        }
      }
      if (Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "replica '", o_.self.id, "' was not admitted within ",
            absl::FormatDuration(o_.join_timeout), ": ",
            latest->has_value() ? "the members of " + (*latest)->ToString() +
                                      " did not admit it (full at max_replicas, or not "
                                      "reaching a step boundary)"
                                : absl::StrCat("fewer than min_replicas=", o_.min_replicas,
                                               " replicas registered")));
      }
      SleepFor(std::min(o_.heartbeat, absl::Milliseconds(20)));
    }
  }

  absl::StatusOr<std::optional<Generation>> AtBoundary(int64_t completed) override {
    const Generation cur = current();
    if (cur.number == 0 || cur.rank < 0) {
      return absl::FailedPreconditionError("AtBoundary before Join: not a member");
    }
    if (absl::Status st = StoreFailure(); !st.ok()) return st;
    absl::StatusOr<std::optional<Generation>> next = LatestFrom(cur.number);
    if (!next.ok()) return next.status();
    if (!next->has_value()) {
      if (cur.size() >= o_.max_replicas) return std::nullopt;
      absl::StatusOr<std::vector<ReplicaInfo>> joiners = PendingJoiners(cur.members);
      if (!joiners.ok()) return joiners.status();
      if (joiners->empty()) return std::nullopt;
      Generation g;
      g.number = cur.number + 1;
      g.kind = GenerationKind::kJoin;
      g.at_step = completed + 1;
      const std::vector<std::string> dead = DeadPeers();
      for (const ReplicaInfo& m : cur.members) {
        if (std::find(dead.begin(), dead.end(), m.id) == dead.end()) {
          g.members.push_back(m);
        } else {
          g.left.push_back(m.id);
        }
      }
      for (const ReplicaInfo& j : *joiners) {
        if (g.members.size() >= static_cast<size_t>(o_.max_replicas)) break;
        g.members.push_back(j);
        g.joined.push_back(j.id);
      }
      absl::StatusOr<Generation> stored = Propose(g);
      if (!stored.ok()) return stored.status();
      *next = *stored;
    }
    const Generation& g = **next;
    if ((g.kind == GenerationKind::kJoin || g.kind == GenerationKind::kLeave) &&
        g.number == cur.number + 1) {
      if (g.at_step > completed) return std::nullopt;
      if (g.at_step < completed) {
        return absl::InternalError(
            absl::StrCat("replica '", o_.self.id, "' is at the boundary after ", completed,
                         " steps, past the boundary of ", g.ToString(), " (", g.at_step,
                         " steps): the replicas are not in lockstep"));
      }
    }
    return std::optional<Generation>(Adopt(g));
  }

  absl::StatusOr<Generation> Recover(int64_t completed) override {
    const Generation cur = current();
    if (cur.number == 0) return Join();
    const int64_t start = Now();
    const int64_t deadline = start + absl::ToInt64Nanoseconds(o_.join_timeout);
    const int64_t stuck_after =
        start + kStuckPeerTimeouts * absl::ToInt64Nanoseconds(o_.peer_timeout);
    const std::string prefix = cur.prefix() + "/alive/";
    // A collective already failed: a member that has not reported in and
    // whose heartbeat has also stopped for 3 periods is taken as gone
    // without waiting the full peer_timeout. A live member keeps beating
    // (even while it computes) and reports in once its own collective fails;
    // one dropped wrongly (a starved heartbeat thread) joins again.
    const absl::Duration recover_silence = RecoverSilence();
    {
      const std::string key = prefix + o_.self.id;
      if (auto st = Retry(key, [&] { return store_.Set(key, std::to_string(completed)); });
          !st.ok()) {
        return st;
      }
      const std::string gave_up = cur.prefix() + "/abandoned";
      if (auto st = Retry(gave_up, [&] { return store_.Set(gave_up, o_.self.id); }); !st.ok()) {
        return st;
      }
    }
    for (;;) {
      if (absl::Status st = StoreFailure(); !st.ok()) return st;
      absl::StatusOr<std::optional<Generation>> next = LatestFrom(cur.number);
      if (!next.ok()) return next.status();
      if (next->has_value()) {
        Generation g = Adopt(**next);
        if (g.rank < 0) return Join();
        return g;
      }
      std::vector<ReplicaInfo> alive;
      std::vector<const ReplicaInfo*> unreported;
      for (const ReplicaInfo& m : cur.members) {
        absl::StatusOr<std::optional<std::string>> v = ReadRecord(prefix + m.id);
        if (!v.ok()) return v.status();
        if (v->has_value()) {
          alive.push_back(m);
        } else {
          unreported.push_back(&m);
        }
      }
      // The members that were in the generation before `cur` hold the
      // group's state; those that joined in `cur` may not have received it
      // yet (the failure may have come before their sync). Without an
      // incumbent among those that reported, an incumbent that has not
      // reported is dropped only once it is silent for the full
      // peer_timeout: a recovered generation of joiners alone would go on
      // from their older checkpoints and train committed steps again (found
      // by the soak test: a joiner formed a generation of its own while the
      // incumbent's heartbeat paused for 3 periods), and one that keeps
      // beating is never taken for stuck: it is waited for (up to
      // join_timeout), as it reports in once its own wait ends (found by the
      // soak test too: the incumbents sat 30 s in the connect of a build the
      // joiner had abandoned, and the joiner, after 10 peer timeouts, went on
      // alone from its checkpoint).
      const auto incumbent = [&](const std::string& id) {
        return std::find(cur.joined.begin(), cur.joined.end(), id) == cur.joined.end();
      };
      const bool holder_reported =
          std::any_of(alive.begin(), alive.end(),
                      [&](const ReplicaInfo& m) { return incumbent(m.id); }) ||
          std::none_of(cur.members.begin(), cur.members.end(),
                       [&](const ReplicaInfo& m) { return incumbent(m.id); });
      std::vector<std::string> missing_alive;  // not reported, heartbeat still going
      std::vector<std::string> gone;
      for (const ReplicaInfo* m : unreported) {
        const bool may_go = holder_reported || !incumbent(m->id);
        const absl::Duration silence = may_go ? recover_silence : o_.peer_timeout;
        if (SilentFor(m->id, silence) || BeatsAsAnotherProcess(*m) ||
            (may_go && Now() >= stuck_after)) {
          gone.push_back(m->id);
        } else {
          missing_alive.push_back(m->id);
        }
      }
      if (missing_alive.empty()) {
        absl::StatusOr<std::vector<ReplicaInfo>> joiners = PendingJoiners(cur.members);
        if (!joiners.ok()) return joiners.status();
        Generation g;
        g.number = cur.number + 1;
        g.kind = GenerationKind::kRecover;
        g.at_step = completed;
        g.members = alive;
        g.left = gone;
        for (const ReplicaInfo& j : *joiners) {
          if (g.members.size() >= static_cast<size_t>(o_.max_replicas)) break;
          g.members.push_back(j);
          g.joined.push_back(j.id);
        }
        if (g.size() >= o_.min_replicas) {
          if (auto st = Propose(g); !st.ok()) return st.status();
          continue;
        }
      }
      if (Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("no new generation after the failure of ", cur.ToString(), " within ",
                         absl::FormatDuration(o_.join_timeout), ": ", alive.size(),
                         " replica(s) reported in (min_replicas=", o_.min_replicas,
                         "), waiting for [", absl::StrJoin(missing_alive, " "), "]"));
      }
      SleepFor(kPoll);
    }
  }

  absl::Status RequestLeave(int64_t completed) override {
    const Generation cur = current();
    if (cur.rank < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("replica '", o_.self.id, "' cannot leave: not a member"));
    }
    if (cur.size() - 1 < o_.min_replicas) {
      return absl::FailedPreconditionError(absl::StrCat(
          "replica '", o_.self.id, "' cannot leave ", cur.ToString(), ": the others would be ",
          cur.size() - 1, ", fewer than min_replicas=", o_.min_replicas));
    }
    Generation g;
    g.number = cur.number + 1;
    g.kind = GenerationKind::kLeave;
    g.at_step = completed + 1;
    for (const ReplicaInfo& m : cur.members) {
      if (m.id != o_.self.id) g.members.push_back(m);
    }
    g.left.push_back(o_.self.id);
    absl::StatusOr<Generation> stored = Propose(g);
    if (!stored.ok()) return stored.status();
    if (stored->kind != GenerationKind::kLeave || stored->left != g.left ||
        stored->at_step != g.at_step) {
      return absl::UnavailableError(absl::StrCat(
          "replica '", o_.self.id, "' cannot leave yet: ", stored->ToString(), " is pending"));
    }
    // Withdraw this replica's join ticket, so that a member that has not
    // read it yet does not admit us again while our heartbeat still looks
    // alive; the record names this process, so that a reader drops any
    // older ticket of it too.
    if (my_ticket_ > 0) {
      const std::string key = absl::StrCat("join/", my_ticket_);
      const std::string withdrawn =
          Json{{"withdrawn", true}, {"id", o_.self.id}, {"session", session_}}.dump();
      Retry(key, [&] { return store_.Set(key, withdrawn); }).IgnoreError();
    }
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    const Generation g = current();
    const std::string what =
        absl::StrCat("finished by replica '", o_.self.id, "' in ", g.ToString());
    return Retry("finished", [&] { return store_.CompareAndSet("finished", "", what); }).status();
  }

  Generation current() const override {
    absl::MutexLock lock(&mu_);
    return current_;
  }

  void SetOnPeerDead(std::function<void(const std::string& id)> callback) override {
    absl::MutexLock lock(&mu_);
    on_dead_ = std::move(callback);
  }

  std::vector<std::string> DeadPeers() const override {
    absl::MutexLock lock(&mu_);
    return {dead_.begin(), dead_.end()};
  }

  bool Superseded(const Generation& g) override {
    const auto present = [&](const std::string& key) {
      absl::StatusOr<std::optional<std::string>> v = store_.TryGet(key);
      return v.ok() && v->has_value();
    };
    return present(g.prefix() + "/abandoned") || present(GenKey(g.number + 1));
  }

  absl::Status HeartbeatError() const override {
    absl::MutexLock lock(&mu_);
    return hb_error_;
  }

  absl::Status StoreFailure() const override {
    absl::MutexLock lock(&mu_);
    return store_failure_;
  }

 private:
  int64_t Now() const { return clock_->NowNanos(); }
  // Every wait of this class is on the clock (a FakeClock's in tests).
  void SleepFor(absl::Duration d) const { clock_->SleepUntil(Now() + absl::ToInt64Nanoseconds(d)); }

  // Retries transient store errors with backoff for store_retry, then gives
  // up with Unavailable naming the key. Errors about the request itself
  // (bad key or value, missing key) are returned at once.
  template <typename F>
  auto Retry(const std::string& key, F f) -> decltype(f()) {
    const int64_t until = Now() + absl::ToInt64Nanoseconds(o_.store_retry);
    absl::Duration backoff = absl::Milliseconds(10);
    for (;;) {
      auto r = f();
      absl::Status st;
      if constexpr (std::is_same_v<decltype(r), absl::Status>) {
        st = r;
      } else {
        st = r.status();
      }
      // (NotFound is retried: none of the calls made here can return it
      // about the request, so it means the store's directory is gone.)
      if (st.ok() || absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st) ||
          absl::IsAlreadyExists(st) || absl::IsOutOfRange(st) || absl::IsDataLoss(st) ||
          absl::IsPermissionDenied(st)) {
        return r;
      }
      if (Now() >= until) {
        return MarkStoreFailure(absl::UnavailableError(
            absl::StrCat("store unreachable for ", absl::FormatDuration(o_.store_retry), " (key '",
                         key, "'): ", st.message())));
      }
      SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(500));
    }
  }

  absl::Status CheckIdentity(const std::string& key, const std::string& mine,
                             const std::string& what) {
    absl::StatusOr<std::string> stored =
        Retry(key, [&] { return store_.CompareAndSet(key, "", mine); });
    if (!stored.ok()) return stored.status();
    if (*stored != mine) {
      return absl::FailedPreconditionError(
          absl::StrCat("refusing to join: the job's ", what, " is '", *stored,
                       "' but this replica's is '", mine, "' (replica '", o_.self.id, "')"));
    }
    return absl::OkStatus();
  }

  // The record under `key`; a record that an authenticated store refused
  // (PermissionDenied: forged, logged there) counts as absent.
  absl::StatusOr<std::optional<std::string>> ReadRecord(const std::string& key) {
    absl::StatusOr<std::optional<std::string>> v = Retry(key, [&] { return store_.TryGet(key); });
    if (!v.ok() && absl::IsPermissionDenied(v.status())) return std::optional<std::string>();
    return v;
  }

  absl::StatusOr<int64_t> ReadCounter(const std::string& key) {
    absl::StatusOr<std::optional<std::string>> v = ReadRecord(key);
    if (!v.ok()) return v.status();
    int64_t n = 0;
    if (v->has_value() && !absl::SimpleAtoi(**v, &n)) {
      return absl::DataLossError(absl::StrCat("store key '", key, "' is not a counter"));
    }
    return n;
  }

  // The newest generation with a number > `after` (nullopt when none).
  absl::StatusOr<std::optional<Generation>> LatestFrom(int64_t after) {
    absl::StatusOr<int64_t> hint = ReadCounter("gen/latest");
    if (!hint.ok()) return hint.status();
    // The hint is written after its record, so gen/<hint> exists; newer
    // records may exist beyond it.
    std::optional<std::string> best;
    int64_t best_n = 0;
    for (int64_t k = std::max(after + 1, *hint);; ++k) {
      absl::StatusOr<std::optional<std::string>> v = ReadRecord(GenKey(k));
      if (!v.ok()) return v.status();
      if (!v->has_value()) break;
      best = **v;
      best_n = k;
    }
    if (!best.has_value()) return std::nullopt;
    absl::StatusOr<Generation> g = ParseGeneration(GenKey(best_n), best_n, *best, incarnation_);
    if (!g.ok()) return g.status();
    return std::optional<Generation>(*std::move(g));
  }

  // Writes `g` unless another proposal for its number exists; returns what
  // the store holds now.
  absl::StatusOr<Generation> Propose(Generation g) {
    TopologySort(g.members);
    const std::string key = GenKey(g.number);
    const std::string text = SerializeGeneration(g, incarnation_);
    absl::StatusOr<std::string> stored =
        Retry(key, [&] { return store_.CompareAndSet(key, "", text); });
    if (!stored.ok()) return stored.status();
    if (*stored == text) {
      const std::string n = std::to_string(g.number);
      // Best effort: readers also scan past the hint.
      Retry("gen/latest", [&] { return store_.Set("gen/latest", n); }).IgnoreError();
    }
    return ParseGeneration(key, g.number, *stored, incarnation_);
  }

  Generation Adopt(Generation g) {
    // Admitted: their tickets are used up (coming back takes a new one).
    tickets_.erase(std::remove_if(tickets_.begin(), tickets_.end(),
                                  [&](const ReplicaInfo& r) { return Contains(g.members, r.id); }),
                   tickets_.end());
    g.rank = -1;
    for (size_t i = 0; i < g.members.size(); ++i) {
      if (g.members[i].id == o_.self.id) g.rank = static_cast<int>(i);
    }
    if (g.rank >= 0 && my_ticket_ > 0) MarkTicketUsed(g.number);
    absl::MutexLock lock(&mu_);
    current_ = g;
    dead_.clear();
    const int64_t now = Now();
    for (const ReplicaInfo& m : g.members) {
      // Watching restarts: a member is dead after peer_timeout without a
      // change from now on.
      Observed& o = seen_[m.id];
      o.since_ns = now;
      o.changes = 0;
    }
    return g;
  }

  void Watch(const std::vector<ReplicaInfo>& members) {
    absl::MutexLock lock(&mu_);
    for (const ReplicaInfo& m : members) {
      if (m.id == o_.self.id || extra_watch_.count(m.id) > 0) continue;
      extra_watch_.insert(m.id);
      Observed& o = seen_[m.id];
      o.since_ns = Now();
      o.changes = 0;
    }
  }

  // A gap between two of this observer's reads of a heartbeat over which
  // it observed nothing: as long as the shortest silence anything is
  // decided on (Recover's, 3 heartbeat periods), or half a peer timeout.
  int64_t UnobservedGapNs() const {
    return std::min(absl::ToInt64Nanoseconds(o_.peer_timeout) / 2,
                    absl::ToInt64Nanoseconds(RecoverSilence()));
  }
  absl::Duration RecoverSilence() const { return std::min(o_.peer_timeout, 3 * o_.heartbeat); }

  // How long `o` has been observed not to change: from when its value was
  // first seen to the heartbeat thread's latest read of it, never to "now".
  // A heartbeat thread that stopped reading (blocked behind a slow store,
  // starved, frozen) has observed nothing since, so silence does not grow
  // with the time the training thread asks at: a replica is never taken
  // for dead on observations it did not make.
  static int64_t ObservedSilenceNs(const Observed& o) {
    return o.read ? o.read_ns - o.since_ns : 0;
  }

  // The heartbeat in `o` is written by another process than `session` (""
  // matches any): that process is gone, restarted under the same id.
  static bool BeatsForAnotherSession(const Observed& o, const std::string& session) {
    const std::string beating = SessionOf(o.value);
    return !session.empty() && !beating.empty() && beating != session;
  }

  // Observed silent for peer_timeout, or (with `session` given) its id now
  // beats for another process: the member's own process is gone (it was
  // restarted).
  bool IsDeadLocked(const std::string& id, const std::string& session = "") const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    auto it = seen_.find(id);
    if (it == seen_.end()) return false;  // not watched yet
    return BeatsForAnotherSession(it->second, session) ||
           ObservedSilenceNs(it->second) >= absl::ToInt64Nanoseconds(o_.peer_timeout);
  }

  // The id of `m` now beats for another process than the member's (its
  // beats are no sign that the member will report in).
  bool BeatsAsAnotherProcess(const ReplicaInfo& m) const {
    absl::MutexLock lock(&mu_);
    auto it = seen_.find(m.id);
    return it != seen_.end() && BeatsForAnotherSession(it->second, m.session);
  }

  // No heartbeat change from `id` observed for `d` (false when not watched).
  bool SilentFor(const std::string& id, absl::Duration d) const {
    absl::MutexLock lock(&mu_);
    auto it = seen_.find(id);
    return it != seen_.end() && ObservedSilenceNs(it->second) >= absl::ToInt64Nanoseconds(d);
  }

  bool AllDead(const std::vector<ReplicaInfo>& members) {
    absl::MutexLock lock(&mu_);
    return std::all_of(members.begin(), members.end(), [&](const ReplicaInfo& m) {
      // This id as an earlier process (before a restart) is gone for good.
      if (m.id == o_.self.id) return !m.session.empty() && m.session != session_;
      return seen_.count(m.id) > 0 && IsDeadLocked(m.id, m.session);
    });
  }

  // Replicas that asked to join, are not in `members`, and whose heartbeat
  // has been seen to change within peer_timeout (this replica counts as
  // alive). In ticket order; the newest ticket of an id counts.
  absl::StatusOr<std::vector<ReplicaInfo>> PendingJoiners(const std::vector<ReplicaInfo>& members) {
    absl::StatusOr<int64_t> seq = ReadCounter("join/seq");
    if (!seq.ok()) return seq.status();
    for (int64_t t = next_ticket_; t <= *seq; ++t) {
      const std::string key = absl::StrCat("join/", t);
      absl::StatusOr<std::optional<std::string>> v = Retry(key, [&] { return store_.TryGet(key); });
      if (!v.ok() && absl::IsPermissionDenied(v.status())) {
        next_ticket_ = t + 1;  // forged (logged by the store): never admitted
        continue;
      }
      if (!v.ok()) return v.status();
      if (!v->has_value()) break;  // being written: next time
      Json j = Json::parse(**v, nullptr, false);
      if (j.is_object() && j.contains("incarnation") &&
          (!j["incarnation"].is_string() || j["incarnation"].get<std::string>() != incarnation_)) {
        return MarkStoreFailure(absl::DataLossError(
            absl::StrCat("store key '", key,
                         "' is a join ticket of another incarnation of the job's store "
                         "than this replica's '",
                         incarnation_,
                         "' (key 'incarnation'): the store lost its "
                         "state under the running job")));
      }
      if (j.is_object() && (j.contains("withdrawn") || j.contains("admitted"))) {
        // Its holder left, or was admitted with it: none of its tickets
        // counts any more (coming back takes a new one).
        if (absl::StatusOr<ReplicaInfo> gone = InfoFromJson(j); gone.ok()) {
          DropTickets(gone->id, gone->session);
        }
        next_ticket_ = t + 1;
        continue;
      }
      absl::StatusOr<ReplicaInfo> info = InfoFromJson(j);
      if (info.ok()) {
        DropTickets(info->id, "");
        // Read only now, but its holder (this very process) is already a
        // member: it was admitted with this ticket, which is used up, and
        // must not admit it again once it is dropped (killed). Unless a
        // newer generation has left it out since: then the ticket may be
        // the one it rejoins with.
        bool used_up = false;
        if (!info->session.empty()) {
          const Generation cur = current();
          if (ContainsSession(cur.members, info->id, info->session)) {
            absl::StatusOr<std::optional<Generation>> newer = LatestFrom(cur.number);
            if (!newer.ok()) return newer.status();
            used_up = !newer->has_value();
          }
        }
        if (!used_up) tickets_.push_back(*std::move(info));
      }
      next_ticket_ = t + 1;
    }
    std::vector<ReplicaInfo> out;
    absl::MutexLock lock(&mu_);
    const int64_t now = Now();
    for (const ReplicaInfo& r : tickets_) {
      if (Contains(members, r.id)) continue;
      if (r.id == o_.self.id) {
        out.push_back(r);
        continue;
      }
      extra_watch_.insert(r.id);
      auto it = seen_.find(r.id);
      if (it == seen_.end()) {
        seen_[r.id].since_ns = now;
        continue;
      }
      // A ticket counts for the process that wrote it: the heartbeat of its
      // id must be seen changing, under the ticket's session.
      const std::string beating = SessionOf(it->second.value);
      if (!r.session.empty() && beating != r.session) continue;
      if (it->second.changes > 0 && !IsDeadLocked(r.id)) out.push_back(r);
    }
    return out;
  }

  // Marks this replica's ticket as used up by its admission to generation
  // `number`. A member that reads it only later (a newcomer reading the
  // whole history, or a member that reads it first in a generation this
  // replica has already left) would otherwise take it for a pending
  // request, and readmit this process once it is dead while its last
  // heartbeats still look fresh (found by the soak test: a replica killed
  // right after a recovery was readmitted from its old ticket, and the
  // others waited for it until their communicator's init timeout, 30 s).
  void MarkTicketUsed(int64_t number) {
    const std::string key = absl::StrCat("join/", my_ticket_);
    const std::string used =
        Json{{"admitted", number}, {"id", o_.self.id}, {"session", session_}}.dump();
    Retry(key, [&] { return store_.Set(key, used); }).IgnoreError();
    my_ticket_ = 0;
  }

  // Forgets the tickets of `id` (only those of `session` when given).
  void DropTickets(const std::string& id, const std::string& session) {
    tickets_.erase(std::remove_if(tickets_.begin(), tickets_.end(),
                                  [&](const ReplicaInfo& r) {
                                    return r.id == id && (session.empty() || r.session == session);
                                  }),
                   tickets_.end());
  }

  void Beat() {
    const std::string key = "hb/" + o_.self.id;
    // On a store with leases (etcd) the heartbeat key is leased for
    // peer_timeout: it vanishes by itself once this process stops beating.
    const std::string beat = absl::StrCat(session_, ":", ++beats_);
    absl::Status st = store_.has_leases() ? store_.SetWithLease(key, beat, o_.peer_timeout)
                                          : store_.Set(key, beat);
    absl::Status lost;
    if (st.ok() && !incarnation_.empty()) {
      // The incarnation is still the one this replica joined: the store has
      // not lost its state. A refused (forged) record is no news.
      absl::StatusOr<std::optional<std::string>> inc = store_.TryGet(kIncarnationKey);
      if (!inc.ok() && !absl::IsPermissionDenied(inc.status())) {
        st = inc.status();
      } else if (inc.ok() && (!inc->has_value() || **inc != incarnation_)) {
        lost = MarkStoreFailure(absl::DataLossError(absl::StrCat(
            "the job's store lost its state under the running job: key '", kIncarnationKey, "' ",
            inc->has_value() ? absl::StrCat("is '", **inc, "'") : std::string("is missing"),
            ", but replica '", o_.self.id, "' joined incarnation '", incarnation_,
            "' (the store was wiped, replaced or restarted empty); stopping rather than "
            "letting new replicas form a second job beside this one")));
      }
    }
    const int64_t now = Now();
    absl::MutexLock lock(&mu_);
    hb_error_ = st;
    if (st.ok()) {
      hb_failing_since_ns_ = 0;
    } else if (hb_failing_since_ns_ == 0) {
      hb_failing_since_ns_ = now;
    } else if (store_failure_.ok() &&
               now - hb_failing_since_ns_ >= absl::ToInt64Nanoseconds(o_.store_retry)) {
      store_failure_ = MarkStoreFailure(absl::UnavailableError(
          absl::StrCat("store unreachable for ", absl::FormatDuration(o_.store_retry),
                       " (heartbeats of replica '", o_.self.id, "'): ", st.message())));
    }
    if (!lost.ok() && store_failure_.ok()) store_failure_ = lost;
  }

  void HeartbeatLoop() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        const int64_t next = Now() + absl::ToInt64Nanoseconds(o_.heartbeat);
        if (clock_->AwaitUntil(mu_, absl::Condition(&stop_), next)) return;
      }
      Beat();
      std::vector<std::string> ids;
      {
        absl::MutexLock lock(&mu_);
        for (const ReplicaInfo& m : current_.members) ids.push_back(m.id);
        ids.insert(ids.end(), extra_watch_.begin(), extra_watch_.end());
      }
      std::map<std::string, std::optional<std::string>> values;
      for (const std::string& id : ids) {
        if (id == o_.self.id || values.count(id) > 0) continue;
        absl::StatusOr<std::optional<std::string>> v = store_.TryGet("hb/" + id);
        if (v.ok()) values[id] = *v;  // a failed read is no news
      }
      const bool leases = store_.has_leases();
      std::vector<std::string> newly_dead;
      std::function<void(const std::string&)> callback;
      {
        absl::MutexLock lock(&mu_);
        const int64_t now = Now();
        for (const auto& [id, v] : values) {
          Observed& o = seen_[id];
          const std::string value = v.value_or("");
          if (!o.read) {
            // The first read is no change: a dead replica's last heartbeat
            // must not look like a fresh one to an observer that just began
            // watching it (a newcomer reading the old tickets). Nor is it
            // silence: observation begins here, not when watching was asked
            // for (the heartbeat thread may have been blocked since).
            o.read = true;
            o.value = value;
            o.since_ns = now;
          } else if (leases && value.empty() && !o.value.empty()) {
            // Its leased heartbeat key vanished: the lease expired (it has
            // been silent for at least peer_timeout) or it was deleted.
            o.value = value;
            o.since_ns = std::min(o.since_ns, now - absl::ToInt64Nanoseconds(o_.peer_timeout));
          } else if (now - o.read_ns >= UnobservedGapNs()) {
            // This observer did not look for as long as Recover's silence,
            // or half a peer timeout (it was frozen or starved, or its own
            // heartbeat write waited for a slow store, as every replica's
            // did): it knows nothing of that time. A silence must be
            // observed through reads closer together than it (found by the
            // soak test: after a 0.25 s store stall a member whose write was
            // still queued looked silent for 3 heartbeat periods on one read
            // either side of the stall, and Recover dropped it). A change
            // may be older than that, e.g. the last beats of a replica
            // killed meanwhile, so it is no sign of life; no change is no
            // sign of death either, since the peer's write may be queued
            // behind the same slow store. A new start, from which silence
            // (or a change) must be observed again.
            o.value = value;
            o.since_ns = now;
            o.changes = 0;
          } else if (value != o.value) {
            o.value = value;
            o.since_ns = now;
            ++o.changes;
          }
          o.read_ns = now;
        }
        for (const ReplicaInfo& m : current_.members) {
          if (m.id == o_.self.id || dead_.count(m.id) > 0) continue;
          if (IsDeadLocked(m.id, m.session)) {
            dead_.insert(m.id);
            newly_dead.push_back(m.id);
          }
        }
        callback = on_dead_;
      }
      if (callback) {
        for (const std::string& id : newly_dead) callback(id);
      }
    }
  }

  Store& store_;
  const MembershipOptions o_;
  const Clock* clock_;
  std::string session_;
  ReplicaInfo self_;         // o_.self with this process's session
  int64_t beats_ = 0;        // heartbeat thread (and Init, before it starts)
  std::string incarnation_;  // set by Init, then read-only

  // Training thread only.
  int64_t next_ticket_ = 1;
  std::vector<ReplicaInfo> tickets_;
  int64_t my_ticket_ = 0;  // this replica's newest join ticket

  mutable absl::Mutex mu_;
  Generation current_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Observed> seen_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> extra_watch_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dead_ ABSL_GUARDED_BY(mu_);
  absl::Status hb_error_ ABSL_GUARDED_BY(mu_);
  int64_t hb_failing_since_ns_ ABSL_GUARDED_BY(mu_) = 0;  // 0: the last beat succeeded
  // Latched: the store failed for good (see StoreFailure()).
  absl::Status store_failure_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_dead_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Membership>> Membership::Create(Store& store,
                                                               const MembershipOptions& options) {
  const auto bad = [](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("MembershipOptions.", field, ": ", why));
  };
  if (options.job_id.empty()) return bad("job_id", "must not be empty");
  if (!ValidId(options.self.id)) {
    return bad("self.id",
               absl::StrCat("'", options.self.id, "' is not 1..64 characters of [A-Za-z0-9_.-]"));
  }
  if (options.min_replicas < 1) return bad("min_replicas", "must be at least 1");
  if (options.max_replicas < options.min_replicas) {
    return bad("max_replicas",
               absl::StrCat(options.max_replicas, " is below min_replicas ", options.min_replicas));
  }
  if (options.clock == nullptr) return bad("clock", "must not be null");
  if (options.heartbeat <= absl::ZeroDuration()) return bad("heartbeat", "must be positive");
  if (options.peer_timeout < 2 * options.heartbeat) {
    return bad("peer_timeout", absl::StrCat(absl::FormatDuration(options.peer_timeout),
                                            " must be at least twice the heartbeat (",
                                            absl::FormatDuration(options.heartbeat), ")"));
  }
  auto m = std::make_unique<MembershipImpl>(store, options);
  if (auto st = m->Init(); !st.ok()) return st;
  return std::unique_ptr<Membership>(std::move(m));
}

}  // namespace omni
