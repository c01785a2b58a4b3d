// ElasticGroup: membership + one communicator per generation + state sync.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "omni/clock.h"
#include "omni/elastic.h"
#include "omni/hash.h"

namespace omni {
namespace {

constexpr char kMagic[8] = {'O', 'M', 'N', 'I', 'S', 'T', '0', '1'};
// Attempts to build a generation after failures before giving up.
constexpr int kMaxRecoverAttempts = 8;

template <typename T>
void Append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

class BufferWriter final : public StateWriter {
 public:
  explicit BufferWriter(std::string& out) : out_(out) {}
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    absl::StatusOr<size_t> expect = TensorBytes(dtype, shape);
    if (!expect.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state key '", internal::Sv(key), "': ", expect.status().message()));
    }
    if (*expect != nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state key '", internal::Sv(key), "': ", nbytes, " bytes for a tensor of ", *expect));
    }
    Append(out_, static_cast<uint32_t>(key.size()));
    out_.append(key.data(), key.size());
    Append(out_, static_cast<uint8_t>(dtype));
    Append(out_, static_cast<uint32_t>(shape.size()));
    for (int64_t d : shape) Append(out_, d);
    Append(out_, static_cast<uint64_t>(nbytes));
    out_.append(static_cast<const char*>(data), nbytes);
    ++count_;
    return absl::OkStatus();
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    return PutTensor(key, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes.data(),
                     bytes.size());
  }
  uint64_t count() const { return count_; }

 private:
  std::string& out_;
  uint64_t count_ = 0;
};

class BufferReader final : public StateReader {
 public:
  absl::Status Parse(std::string_view b) {
    size_t pos = 0;
    const auto need = [&](size_t n) -> absl::Status {
      if (b.size() - pos < n) {
        return absl::DataLossError(
            absl::StrCat("state buffer truncated at byte ", pos, " of ", b.size()));
      }
      return absl::OkStatus();
    };
    const auto read = [&](void* dst, size_t n) {
      std::memcpy(dst, b.data() + pos, n);
      pos += n;
    };
    if (b.size() < sizeof(kMagic) + 8 || std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0) {
      return absl::DataLossError("not a state buffer (bad magic)");
    }
    pos = sizeof(kMagic);
    uint64_t count = 0;
    read(&count, sizeof(count));
    for (uint64_t i = 0; i < count; ++i) {
      uint32_t klen = 0;
      if (auto st = need(4); !st.ok()) return st;
      read(&klen, 4);
      if (auto st = need(klen + 5); !st.ok()) return st;
      std::string key(b.data() + pos, klen);
      pos += klen;
      uint8_t dtype = 0;
      uint32_t ndim = 0;
      read(&dtype, 1);
      read(&ndim, 4);
      if (dtype > static_cast<uint8_t>(DType::kF64) || ndim > 64) {
        return absl::DataLossError(absl::StrCat("state buffer: bad header of key '", key, "'"));
      }
      Entry e;
      e.info.dtype = static_cast<DType>(dtype);
      e.info.shape.resize(ndim);
      if (auto st = need(8 * static_cast<size_t>(ndim) + 8); !st.ok()) return st;
      for (int64_t& d : e.info.shape) read(&d, 8);
      uint64_t nbytes = 0;
      read(&nbytes, 8);
      if (auto st = need(nbytes); !st.ok()) return st;
      absl::StatusOr<size_t> expect = TensorBytes(e.info.dtype, e.info.shape);
      if (!expect.ok() || *expect != nbytes) {
        return absl::DataLossError(absl::StrCat("state buffer: size of key '", key, "'"));
      }
      e.info.nbytes = nbytes;
      e.data = b.data() + pos;
      pos += nbytes;
      entries_[key] = e;
    }
    if (pos != b.size()) return absl::DataLossError("state buffer: trailing bytes");
    return absl::OkStatus();
  }

  absl::StatusOr<Info> Find(std::string_view key) const override {
    auto it = entries_.find(std::string(key));
    if (it == entries_.end()) {
      return absl::NotFoundError(
          absl::StrCat("state key '", internal::Sv(key), "' missing from the received state"));
    }
    return it->second.info;
  }
  absl::Status ReadTensor(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                          void* dst, size_t nbytes) const override {
    absl::StatusOr<Info> info = Find(key);
    if (!info.ok()) return info.status();
    if (info->dtype != dtype || info->shape != shape || info->nbytes != nbytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("state key '", internal::Sv(key), "': received ", DTypeName(info->dtype),
                       " of ", info->nbytes, " bytes, expected ", DTypeName(dtype), " of ", nbytes,
                       " bytes (another model?)"));
    }
    std::memcpy(dst, entries_.at(std::string(key)).data, nbytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ReadBytes(std::string_view key) const override {
    absl::StatusOr<Info> info = Find(key);
    if (!info.ok()) return info.status();
    if (info->dtype != DType::kU8 || info->shape.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("state key '", internal::Sv(key), "' is not a byte blob"));
    }
    const Entry& e = entries_.at(std::string(key));
    return std::string(e.data, e.info.nbytes);
  }
  std::vector<std::string> Keys(std::string_view prefix) const override {
    std::vector<std::string> out;
    for (const auto& [k, e] : entries_) {
      if (std::string_view(k).substr(0, prefix.size()) == prefix) out.push_back(k);
    }
    return out;
  }

 private:
  struct Entry {
    Info info;
    const char* data = nullptr;
  };
  std::map<std::string, Entry> entries_;
};

double MsSince(int64_t t0) { return static_cast<double>(Clock::Real()->NowNanos() - t0) / 1e6; }

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
    const int64_t t0 = Clock::Real()->NowNanos();
    absl::StatusOr<Generation> g = membership_->Join();
    if (!g.ok()) return g.status();
    return Enter(*std::move(g), completed, t0, absl::OkStatus());
  }

  absl::StatusOr<std::optional<GroupChange>> AtBoundary(int64_t completed) override {
    const int64_t t0 = Clock::Real()->NowNanos();
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
    const int64_t t0 = Clock::Real()->NowNanos();
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
      t0 = Clock::Real()->NowNanos();
      absl::StatusOr<Generation> next = membership_->Recover(completed);
      if (!next.ok()) return next.status();
      g = *std::move(next);
    }
  }

  absl::Status Build(const Generation& g, GroupChange& change) {
    const int64_t t0 = Clock::Real()->NowNanos();
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
    // dead will never arrive: recover at once instead of at init_timeout.
    co.abandon = [m = membership_.get()] { return !m->DeadPeers().empty(); };
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
    const int64_t t0 = Clock::Real()->NowNanos();
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

absl::StatusOr<std::string> SerializeState(const StateRegistry& state) {
  std::string out(kMagic, sizeof(kMagic));
  Append(out, uint64_t{0});  // entry count, patched below
  BufferWriter w(out);
  if (auto st = state.SaveAll(w); !st.ok()) return st;
  const uint64_t count = w.count();
  std::memcpy(out.data() + sizeof(kMagic), &count, sizeof(count));
  return out;
}

absl::Status DeserializeState(std::string_view bytes, const StateRegistry& state) {
  BufferReader r;
  if (auto st = r.Parse(bytes); !st.ok()) return st;
  return state.LoadAll(r);
}

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
