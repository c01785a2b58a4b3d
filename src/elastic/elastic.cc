// ElasticGroup: membership + one communicator per generation + state sync.
#include "omni/elastic.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/hash.h"

namespace omni {
namespace {

// Attempts to build a generation after failures before giving up.
constexpr int kMaxRecoverAttempts = 8;
// How often a communicator's rendezvous asks the store whether a member gave
// up on its generation (two reads).
constexpr absl::Duration kSupersededLook = absl::Milliseconds(50);

class ElasticGroupImpl final : public ElasticGroup {
 public:
  ElasticGroupImpl(Store& store, ElasticOptions options, const StateRegistry& replicated,
                   std::unique_ptr<Membership> membership)
      : store_(store),
        o_(std::move(options)),
        replicated_(replicated),
        membership_(std::move(membership)) {
    membership_->SetOnPeerDead([this](const std::string& /*id*/) {
      // A collective waiting for the dead peer returns now.
      absl::MutexLock lock(&comm_mu_);
      if (comm_ != nullptr) comm_->Abort();
    });
  }

  ~ElasticGroupImpl() override {
    membership_->SetOnPeerDead(nullptr);
    absl::MutexLock lock(&comm_mu_);
    comm_.reset();
  }
  ElasticGroupImpl(const ElasticGroupImpl&) = delete;
  ElasticGroupImpl& operator=(const ElasticGroupImpl&) = delete;

  absl::StatusOr<GroupChange> Start(int64_t completed) override {
    const int64_t t0 = Now();
    absl::StatusOr<Generation> g = membership_->Join();
    if (!g.ok()) return g.status();
    return Enter(*std::move(g), completed, t0, absl::OkStatus());
  }

  absl::StatusOr<std::optional<GroupChange>> AtBoundary(int64_t completed) override {
    const int64_t t0 = Now();
    absl::StatusOr<std::optional<Generation>> next = membership_->AtBoundary(completed);
    if (!next.ok()) return next.status();
    if (!next->has_value()) return std::nullopt;
    Generation g = **std::move(next);
    if (g.rank < 0 && leaving_) {
      DropComm();  // the others have moved on to `g` without us
      GroupChange left;
      left.generation = std::move(g);
      left.completed = completed;
      left.agree_ms = MsSince(t0);
      return std::optional<GroupChange>(std::move(left));
    }
    if (g.rank < 0) {
      // Dropped (e.g. seen dead while frozen): join again.
      DropComm();
      absl::StatusOr<Generation> joined = membership_->Join();
      if (!joined.ok()) return joined.status();
      g = *std::move(joined);
    }
    absl::StatusOr<GroupChange> change = Enter(std::move(g), completed, t0, absl::OkStatus());
    if (!change.ok()) return change.status();
    return std::optional<GroupChange>(*std::move(change));
  }

  absl::Status AllReduce(void* data, size_t count, DType type, ReduceOp op) override {
    Communicator* c = Comm();
    if (c == nullptr) return absl::FailedPreconditionError("ElasticGroup: not started");
    return c->AllReduce(data, count, type, op, o_.collective_timeout);
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    Communicator* c = Comm();
    if (c == nullptr) return absl::FailedPreconditionError("ElasticGroup: not started");
    return c->Broadcast(data, bytes, root, o_.collective_timeout);
  }

  absl::StatusOr<GroupChange> Recover(const absl::Status& failure, int64_t completed) override {
    const int64_t t0 = Now();
    // Our peers may still wait on us: closing our side makes their
    // collectives fail now rather than at their timeout.
    DropComm();
    absl::StatusOr<Generation> g = membership_->Recover(completed);
    if (!g.ok()) return g.status();
    return Enter(*std::move(g), completed, t0, failure);
  }

  absl::Status Leave(int64_t completed) override {
    absl::Status st = membership_->RequestLeave(completed);
    if (st.ok()) leaving_ = true;
    return st;
  }

  Generation generation() const override { return membership_->current(); }
  const std::string& backend() const override { return o_.backend; }

  Communicator& comm() override {
    absl::MutexLock lock(&comm_mu_);
    return *comm_;
  }
  Membership& membership() override { return *membership_; }

 private:
  // The group's timings are on the membership's clock.
  int64_t Now() const { return o_.membership.clock->NowNanos(); }
  double MsSince(int64_t t0) const { return static_cast<double>(Now() - t0) / 1e6; }

  Communicator* Comm() {
    absl::MutexLock lock(&comm_mu_);
    return comm_.get();
  }

  void DropComm() {
    std::unique_ptr<Communicator> old;
    {
      absl::MutexLock lock(&comm_mu_);
      old = std::move(comm_);
    }
    if (old != nullptr) old->Abort();
  }

  // Builds generation `g` and synchronises the state; on failure, recovers
  // into the next generation (a bounded number of times).
  absl::StatusOr<GroupChange> Enter(Generation g, int64_t completed, int64_t t0,
                                    absl::Status failure) {
    for (int attempt = 0;; ++attempt) {
      GroupChange change;
      change.generation = g;
      change.agree_ms = MsSince(t0);
      absl::Status st = Build(g, change);
      if (st.ok()) st = Sync(completed, change);
      if (st.ok()) return change;
      if (absl::IsInvalidArgument(st) || absl::IsDataLoss(st) ||
          attempt + 1 >= kMaxRecoverAttempts) {
        absl::Status out(st.code(), absl::StrCat("entering ", g.ToString(), ": ", st.message(),
                                                 failure.ok() ? "" : " (after: ",
                                                 failure.ok() ? "" : failure.message(),
                                                 failure.ok() ? "" : ")"));
        // Keeps what the error is (e.g. IsStoreFailure) for the caller.
        st.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
          out.SetPayload(url, payload);
        });
        return out;
      }
      failure = st;
      DropComm();
      t0 = Now();
      absl::StatusOr<Generation> next = membership_->Recover(completed);
      if (!next.ok()) return next.status();
      g = *std::move(next);
    }
  }

  absl::Status Build(const Generation& g, GroupChange& change) {
    const int64_t t0 = Now();
    DropComm();
    std::unique_ptr<Store> view = MakePrefixStore(store_, g.prefix() + "/comm");
    CommOptions co;
    co.backend = o_.backend;
    co.rank = g.rank;
    co.size = g.size();
    co.store = view.get();
    co.init_timeout = o_.init_timeout;
    co.host = o_.host;
    co.device = o_.device;
    // A member of `g` (adopted: the membership's current generation) seen
    // dead will never arrive, nor one that gave up on `g` (it recovers):
    // recover at once instead of at init_timeout. The store is asked every
    // kSupersededLook (real time, as the rendezvous polls), not at every
    // slice of the wait.
    co.abandon = [m = membership_.get(), &g, next_look = absl::InfinitePast()]() mutable {
      if (!m->DeadPeers().empty()) return true;
      const absl::Time now = absl::Now();
      if (now < next_look) return false;
      next_look = now + kSupersededLook;
      return m->Superseded(g);
    };
    absl::StatusOr<std::unique_ptr<Communicator>> c = CreateCommunicator(co);
    if (!c.ok()) return c.status();
    {
      absl::MutexLock lock(&comm_mu_);
      comm_ = *std::move(c);
    }
    change.build_ms = MsSince(t0);
    return absl::OkStatus();
  }

  // Exchanges (completed, digest); the most advanced replica's state wins.
  absl::Status Sync(int64_t completed, GroupChange& change) {
    const int64_t t0 = Now();
    absl::StatusOr<std::string> mine = SerializeState(replicated_);
    if (!mine.ok()) return mine.status();
    struct Record {
      int64_t completed;
      uint64_t digest;
    };
    const Record me{completed, Xxh3Of(mine->data(), mine->size())};
    Communicator& c = *Comm();
    std::vector<Record> all(static_cast<size_t>(c.size()));
    if (auto st = c.AllGather(&me, sizeof(me), all.data(), o_.collective_timeout); !st.ok()) {
      return st;
    }
    int source = 0;
    for (int r = 1; r < c.size(); ++r) {
      if (all[static_cast<size_t>(r)].completed > all[static_cast<size_t>(source)].completed) {
        source = r;
      }
    }
    const Record& src = all[static_cast<size_t>(source)];
    change.completed = src.completed;
    const bool equal = std::all_of(all.begin(), all.end(), [&](const Record& r) {
      return r.completed == src.completed && r.digest == src.digest;
    });
    if (!equal) {
      change.source_rank = source;
      uint64_t size = c.rank() == source ? mine->size() : 0;
      if (auto st = c.Broadcast(&size, sizeof(size), source, o_.collective_timeout); !st.ok()) {
        return st;
      }
      std::string buf;
      if (c.rank() == source) {
        buf = *std::move(mine);
      } else {
        buf.resize(size);
      }
      if (auto st = c.Broadcast(buf.data(), buf.size(), source, o_.collective_timeout); !st.ok()) {
        return st;
      }
      change.state_bytes = buf.size();
      if (c.rank() != source) {
        const uint64_t got = Xxh3Of(buf.data(), buf.size());
        if (got != src.digest) {
          return absl::DataLossError(absl::StrCat(
              "state received from rank ", source, " fails its checksum (xxh3 ", HexDigest(got),
              ", sent ", HexDigest(src.digest), "); nothing was loaded"));
        }
        if (me.digest != src.digest) {
          if (auto st = DeserializeState(buf, replicated_); !st.ok()) return st;
          change.state_received = true;
        }
      }
    }
    change.sync_ms = MsSince(t0);
    return absl::OkStatus();
  }

  Store& store_;
  const ElasticOptions o_;
  const StateRegistry& replicated_;
  std::unique_ptr<Membership> membership_;
  absl::Mutex comm_mu_;
  std::unique_ptr<Communicator> comm_ ABSL_GUARDED_BY(comm_mu_);
  bool leaving_ = false;  // training thread only
};

}  // namespace

absl::StatusOr<std::unique_ptr<ElasticGroup>> ElasticGroup::Create(
    Store& store, const ElasticOptions& options, const StateRegistry& replicated) {
  if (options.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ElasticOptions.collective_timeout: must be positive");
  }
  absl::StatusOr<std::unique_ptr<Membership>> m = Membership::Create(store, options.membership);
  if (!m.ok()) return m.status();
  return std::unique_ptr<ElasticGroup>(
      std::make_unique<ElasticGroupImpl>(store, options, replicated, *std::move(m)));
}

}  // namespace omni
