// Gloo backend: host buffers, TCP connections to the two ring neighbours.
//
// gloo (Debian 12: git 2022-05) provides the TCP transport and its event loop
// (the rendezvous is RingContext below, over the omni::Store); the four collectives are written
// here over its public unbound-buffer transport (send / recv / waitSend / waitRecv) rather than
// taken from gloo/allreduce.h & co, for one reason: Abort() must wake a call
// wherever it waits. gloo's own algorithms wait on internal buffers (the
// allreduce scratch segment) that nothing outside can wake, and closing or
// shutting down the connections does not fail an operation whose bytes are
// half sent or half received (the pair's writer queue and reader own it):
// measured, 1 in 8 aborts during a 32 MB gloo::allreduce then sat until the
// call's timeout. Here every buffer view a call waits on is registered with
// the communicator and Abort() wakes each one (abortWaitRecv/Send), so the
// call returns at once; ending the connections then tells the peers, which
// fail with Unavailable instead of waiting for their own timeout.
//
// The watchdog thread poll(2)s the connections for a hang-up only (never for
// data, which stays gloo's): a peer that dies or closes its communicator
// while no call runs breaks this one within milliseconds, so AsyncError()
// reports it and the next call fails at once. During a call it only takes
// note (and breaks the communicator when the call returns): a peer that
// finished the call and left at once may have sent everything this rank
// still needs, so waking the call would fail it for nothing; when the
// departed peer still owed something, gloo's reader sees the end of the
// connection and fails the operations pending on it (an operation whose bytes
// were half transferred when the peer died is the exception: it ends at the
// call's timeout). The connections are found right after connecting: the
// sockets opened meanwhile whose local address is one of the pairs'.
//
// Memory safety on failure: a buffer view (UnboundBuffer) waits in its
// destructor for any transfer into it to finish, and later transfers find it
// gone; so once a call returns, gloo never touches the caller's memory.
//
// SIGPIPE: gloo writes with writev(2), which raises SIGPIPE on a connection
// the peer reset, killing the process by default. Instead of changing the
// process-wide disposition, the threads that write block it: the event-loop
// thread inherits a blocked mask (the device is created while it is blocked)
// and every call blocks it for its duration and drops a SIGPIPE it raised.
#include <fcntl.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/comm_internal.h"
#include "common/fs.h"
#include "common/thread_name.h"
#include "omni/comm.h"
#include "omni/store.h"

namespace omni::internal {
namespace {

using Ms = std::chrono::milliseconds;
using gloo::transport::UnboundBuffer;

// A Store failure inside connectFullMesh: thrown through gloo, caught below.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(absl::Status s)
      : std::runtime_error(std::string(s.message())), status_(std::move(s)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// A call woken by Abort() or the watchdog; the reason is the latched error.
class Interrupted : public std::exception {
 public:
  const char* what() const noexcept override { return "interrupted"; }
};

// Blocks SIGPIPE in this thread while alive (threads started meanwhile
// inherit the mask), then drops a SIGPIPE this thread raised meanwhile.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    was_pending_ = Pending();
  }
  ~SigpipeBlock() {
    if (!was_pending_ && Pending()) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  static bool Pending() {
    sigset_t p;
    sigemptyset(&p);
    return sigpending(&p) == 0 && sigismember(&p, SIGPIPE) == 1;
  }

  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
};

// ------------------------------------------------------------ connections

// The TCP connection to one peer, known by both of its addresses so that a
// descriptor number reused for another socket is never mistaken for it.
struct Conn {
  int peer_rank = -1;
  int fd = -1;
  sockaddr_storage local{};
  sockaddr_storage peer{};
};

bool SameAddress(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    sockaddr_in x{};
    sockaddr_in y{};
    std::memcpy(&x, &a, sizeof(x));
    std::memcpy(&y, &b, sizeof(y));
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    sockaddr_in6 x{};
    sockaddr_in6 y{};
    std::memcpy(&x, &a, sizeof(x));
    std::memcpy(&y, &b, sizeof(y));
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

bool Addresses(int fd, sockaddr_storage* local, sockaddr_storage* peer) {
  socklen_t n = sizeof(*local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(local), &n) != 0) return false;
  n = sizeof(*peer);
  return getpeername(fd, reinterpret_cast<sockaddr*>(peer), &n) == 0;
}

// Still the same socket as when found.
bool Valid(const Conn& c) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  return Addresses(c.fd, &local, &peer) && SameAddress(local, c.local) && SameAddress(peer, c.peer);
}

// The sockets open in this process now: (descriptor, inode).
std::set<std::pair<int, ino_t>> OpenSockets() {
  std::set<std::pair<int, ino_t>> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    int fd = -1;
    if (!absl::SimpleAtoi(it->path().filename().string(), &fd)) continue;
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) out.emplace(fd, st.st_ino);
  }
  return out;
}

// The connections of `context`: sockets opened since `before` whose local
// address is the address of one of the context's pairs.
std::vector<Conn> FindConnections(gloo::Context& context,
                                  const std::set<std::pair<int, ino_t>>& before) {
  std::vector<std::pair<int, sockaddr_storage>> pairs;  // (peer rank, local address)
  for (int r = 0; r < context.size; ++r) {
    if (r == context.rank || context.getPair(r) == nullptr) continue;
    const auto* a =
        dynamic_cast<const gloo::transport::tcp::Address*>(&context.getPair(r)->address());
    if (a != nullptr) pairs.emplace_back(r, a->getSockaddr());
  }
  std::vector<Conn> conns;
  for (const auto& [fd, ino] : OpenSockets()) {
    if (before.count({fd, ino}) != 0) continue;
    Conn c;
    c.fd = fd;
    if (!Addresses(fd, &c.local, &c.peer)) continue;  // not a connected socket
    for (const auto& [rank, address] : pairs) {
      if (SameAddress(address, c.local)) {
        c.peer_rank = rank;
        conns.push_back(c);
        break;
      }
    }
  }
  return conns;
}

// ------------------------------------------------------------ helpers

// A timeout for gloo: whole milliseconds, at least 1, at most 30 days
// (gloo adds it to steady_clock::now()).
Ms ToMs(absl::Duration d) {
  d = std::min(std::max(d, absl::Milliseconds(1)), absl::Hours(24 * 30));
  return Ms(absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))));
}

bool IsTimeout(const std::string& message) {
  const std::string m = absl::AsciiStrToLower(message);
  return absl::StrContains(m, "timeout") || absl::StrContains(m, "timed out");
}

// What an IoException from gloo means for the caller.
absl::Status FromIo(const std::string& what, const std::string& message) {
  if (IsTimeout(message)) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": a peer did not answer in time (", message, ")"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": connection to a peer lost (", message, ")"));
}

template <typename T>
T Add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wraps instead of overflowing
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename T>
T Min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
T Max(T a, T b) {
  return a < b ? b : a;
}

using ReduceFn = void (*)(void* acc, const void* in, size_t n);

// acc[i] = op(acc[i], in[i]).
template <typename T, T (*Op)(T, T)>
void Reduce(void* acc, const void* in, size_t n) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  for (size_t i = 0; i < n; ++i) a[i] = Op(a[i], b[i]);
}

template <typename T>
ReduceFn ReduceFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &Reduce<T, Add<T>>;
    case ReduceOp::kMin:
      return &Reduce<T, Min<T>>;
    case ReduceOp::kMax:
      return &Reduce<T, Max<T>>;
  }
  return nullptr;
}

ReduceFn ReduceFor(DType type, ReduceOp op) {
  switch (type) {
    case DType::kF32:
      return ReduceFor<float>(op);
    case DType::kF64:
      return ReduceFor<double>(op);
    case DType::kI32:
      return ReduceFor<int32_t>(op);
    case DType::kI64:
      return ReduceFor<int64_t>(op);
    case DType::kU8:
      return ReduceFor<uint8_t>(op);
    default:  // refused by CheckAllReduceArgs
      return nullptr;
  }
}

// Sum / n in place (integers truncate toward zero).
template <typename T>
void DivideBy(void* data, size_t count, int n) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      p[i] = static_cast<T>(static_cast<int64_t>(p[i]) / n);
    } else {
      p[i] = p[i] / static_cast<T>(n);
    }
  }
}

void DivideBy(DType type, void* data, size_t count, int n) {
  switch (type) {
    case DType::kF32:
      return DivideBy<float>(data, count, n);
    case DType::kF64:
      return DivideBy<double>(data, count, n);
    case DType::kI32:
      return DivideBy<int32_t>(data, count, n);
    case DType::kI64:
      return DivideBy<int64_t>(data, count, n);
    case DType::kU8:
      return DivideBy<uint8_t>(data, count, n);
    default:  // refused by CheckAllReduceArgs
      return;
  }
}

// Element range [begin, end) of block `i` when `count` elements are split
// into `n` blocks as evenly as possible.
std::pair<size_t, size_t> Block(size_t count, int n, int i) {
  const size_t un = static_cast<size_t>(n);
  const size_t ui = static_cast<size_t>(i);
  const size_t base = count / un;
  const size_t extra = count % un;
  const size_t begin = ui * base + std::min(ui, extra);
  return {begin, begin + base + (ui < extra ? 1 : 0)};
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Broadcast pipelines chunks of this size along the ring.
constexpr size_t kBroadcastChunk = size_t{1} << 20;

// Makes gloo's event loop tick while started. This gloo's loop waits in
// epoll_wait with a 10 ms timeout, and every descriptor unregistered from
// another thread (as connecting or closing a pair does), and the loop's own
// destructor, block until the loop's next tick: up to 10 ms each while the
// loop is idle. An eventfd registered with the loop and written every 100 us
// by a thread makes it tick at once. Started while connecting and while
// tearing down. The eventfd is never unregistered (that would wait for a
// tick it can no longer cause): the ticker must outlive the device, whose
// loop forgets the eventfd when it ends.
class LoopTicker final : public gloo::transport::tcp::Handler {
 public:
  explicit LoopTicker(gloo::transport::Device* device)
      : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    auto* tcp = dynamic_cast<gloo::transport::tcp::Device*>(device);
    if (tcp == nullptr || fd_.get() < 0) return;  // no ticking: only slower
    tcp->registerDescriptor(fd_.get(), EPOLLIN, this);
    registered_ = true;
  }
  ~LoopTicker() override { Stop(); }
  LoopTicker(const LoopTicker&) = delete;
  LoopTicker& operator=(const LoopTicker&) = delete;

  void Start() {
    if (!registered_ || thread_.joinable()) return;
    stop_.store(false);
    thread_ = std::thread([this] {
      internal::NameThisThread("omni-gloo-wake");
      while (!stop_.load()) {
        const uint64_t one = 1;
        if (write(fd_.get(), &one, sizeof(one)) < 0) {
          // EAGAIN (counter full): the loop has not read it yet; fine.
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
  }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  void handleEvents(int /*events*/) override {
    uint64_t v = 0;
    if (read(fd_.get(), &v, sizeof(v)) < 0) {
      // EAGAIN: already drained.
    }
  }

 private:
  Fd fd_;
  bool registered_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A gloo context connected to its ring neighbours only (rank - 1 and
// rank + 1): every collective here runs on the ring, so a rank needs two
// connections whatever the size, and building a communicator for a new
// generation costs two connection set-ups per rank instead of size - 1
// (gloo's connectFullMesh). The addresses are exchanged as store keys
// "addr/<from>/<to>".
class RingContext final : public gloo::Context {
 public:
  RingContext(int r, int n) : gloo::Context(r, n) {}

  // Throws StoreError for store failures, gloo exceptions for connections.
  void Connect(omni::Store& store, absl::Time deadline,
               const std::shared_ptr<gloo::transport::Device>& device,
               const std::function<bool()>& abandon) {
    std::shared_ptr<gloo::transport::Context> ctx = device->createContext(rank, size);
    ctx->setTimeout(getTimeout());
    std::vector<int> peers;
    if (size > 1) peers.push_back(Mod(rank - 1, size));
    if (size > 2) peers.push_back(Mod(rank + 1, size));
    // A passive side's connect() waits for its peer: connecting in
    // ascending peer order (as connectFullMesh does) keeps the waits acyclic.
    std::sort(peers.begin(), peers.end());
    const auto key = [](int from, int to) { return absl::StrCat("addr/", from, "/", to); };
    for (int peer : peers) {
      const std::vector<char> bytes = ctx->createPair(peer)->address().bytes();
      Check(store.Set(key(rank, peer), std::string(bytes.begin(), bytes.end())));
    }
    std::vector<std::vector<char>> addresses;
    for (int peer : peers) {
      absl::StatusOr<std::string> v =
          RendezvousGet(store, key(peer, rank), deadline, abandon, "gloo");
      Check(v.status());
      addresses.emplace_back(v->begin(), v->end());
    }
    ConnectPairs(*ctx, peers, addresses, abandon);
    device_ = device;
    transportContext_ = std::move(ctx);
  }

 private:
  // Connects the pairs in `peers` order. A peer that wrote its address and
  // then gave up on the generation (it recovers) never connects, and a
  // pair waits for it up to 5x the context timeout: so the pairs connect
  // on a thread of their own while this one asks `abandon`, and closing
  // the pairs ends their waits (a closed pair counts as done for gloo).
  static void ConnectPairs(gloo::transport::Context& ctx, const std::vector<int>& peers,
                           const std::vector<std::vector<char>>& addresses,
                           const std::function<bool()>& abandon) {
    if (!abandon) {
      for (size_t i = 0; i < peers.size(); ++i) ctx.getPair(peers[i])->connect(addresses[i]);
      return;
    }
    std::atomic<bool> abandoned{false};
    std::exception_ptr failure;
    absl::Notification finished;
    std::thread worker([&] {
      try {
        for (size_t i = 0; i < peers.size() && !abandoned.load(); ++i) {
          ctx.getPair(peers[i])->connect(addresses[i]);
        }
      } catch (...) {
        failure = std::current_exception();
      }
      finished.Notify();
    });
    while (!finished.WaitForNotificationWithTimeout(kConnectSlice)) {
      if (!abandoned.load() && !abandon()) continue;
      abandoned.store(true);
      // Again at every slice: a connect that began just as the flag was
      // set finds its pair closed too.
      for (int peer : peers) ctx.getPair(peer)->close();
    }
    worker.join();
    if (abandoned.load()) {
      throw StoreError(absl::AbortedError(
          absl::StrCat("gloo rendezvous abandoned while connecting to rank(s) ",
                       absl::StrJoin(peers, " "), " (a peer of this generation is gone)")));
    }
    if (failure) std::rethrow_exception(failure);
  }

  static constexpr absl::Duration kConnectSlice = absl::Milliseconds(20);

  static void Check(const absl::Status& s) {
    if (!s.ok()) throw StoreError(s);
  }
};

// ------------------------------------------------------------ communicator

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, std::unique_ptr<LoopTicker> ticker,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context, std::vector<Conn> conns, Fd stop_read,
                   Fd stop_write)
      : rank_(rank),
        size_(size),
        ticker_(std::move(ticker)),
        device_(std::move(device)),
        context_(std::move(context)),
        base_(context_),
        conns_(std::move(conns)),
        stop_read_(std::move(stop_read)),
        stop_write_(std::move(stop_write)) {}

  ~GlooCommunicator() override {
    StopWatchdog();
    if (watchdog_.joinable()) watchdog_.join();
    // Closing the pairs unregisters their descriptors from gloo's loop: keep
    // it ticking meanwhile (see LoopTicker), or each close waits up to 10 ms.
    ticker_->Start();
    base_.reset();
    context_.reset();
    device_.reset();  // ends gloo's loop thread
    ticker_->Stop();
  }

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  // Starts the watchdog thread (it must not start inside the constructor of
  // an object that might still fail to be built).
  absl::Status Start() {
    if (conns_.empty()) return absl::OkStatus();
    try {
      watchdog_ = std::thread([this] {
        internal::NameThisThread("omni-gloo-watch");
        Watch();
      });
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("gloo: cannot start the connection watchdog: ", e.what()));
    }
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }

  absl::Status AllReduce(void* data, size_t count, DType type, ReduceOp op,
                         absl::Duration timeout) override {
    if (absl::Status s = CheckAllReduceArgs(data, count, type, timeout); !s.ok()) return s;
    const size_t elem = DataTypeSize(type);
    const ReduceFn reduce = ReduceFor(type, op);
    if (reduce == nullptr) return absl::InvalidArgumentError("AllReduce: unknown reduce op");
    if (count == 0) return AsyncError();
    const std::string what = absl::StrCat("gloo AllReduce(", ReduceOpName(op), ", ", count, " x ",
                                          DataTypeName(type), ") on rank ", rank_, " of ", size_);
    absl::Status s = Run(what, timeout, [&](Call& call) {
      RingAllReduce(call, static_cast<uint8_t*>(data), count, elem, reduce);
    });
    if (s.ok() && op == ReduceOp::kAvg) DivideBy(type, data, count, size_);
    return s;
  }

  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) override {
    if (absl::Status s = CheckBroadcastArgs(data, bytes, root, size_, timeout); !s.ok()) {
      return s;
    }
    if (bytes == 0) return AsyncError();
    const std::string what = absl::StrCat("gloo Broadcast(", bytes, " bytes from root ", root,
                                          ") on rank ", rank_, " of ", size_);
    return Run(what, timeout, [&](Call& call) {
      // A pipeline along the ring from the root: each rank receives a chunk
      // from its left and passes it on to its right (the last one does not),
      // so every rank sends and receives the data once.
      const int dist = Mod(rank_ - root, size_);
      const int right = Mod(rank_ + 1, size_);
      const int left = Mod(rank_ - 1, size_);
      const bool forward = dist + 1 < size_;
      UnboundBuffer& buf = call.View(data, bytes);
      bool sending = false;
      for (size_t off = 0; off < bytes; off += kBroadcastChunk) {
        const size_t len = std::min(kBroadcastChunk, bytes - off);
        if (dist > 0) {
          buf.recv(left, call.slot, off, len);
          call.WaitRecv(buf, left);
        }
        if (forward) {
          if (sending) call.WaitSend(buf, right);  // one send in flight per view
          buf.send(right, call.slot, off, len);
          sending = true;
        }
      }
      if (sending) call.WaitSend(buf, right);
    });
  }

  absl::Status AllGather(const void* in, size_t bytes, void* out, absl::Duration timeout) override {
    if (absl::Status s = CheckAllGatherArgs(in, bytes, out, size_, timeout); !s.ok()) return s;
    if (bytes == 0) return AsyncError();
    const std::string what =
        absl::StrCat("gloo AllGather(", bytes, " bytes per rank) on rank ", rank_, " of ", size_);
    uint8_t* o = static_cast<uint8_t*>(out);
    if (o + static_cast<size_t>(rank_) * bytes != in) {
      std::memmove(o + static_cast<size_t>(rank_) * bytes, in, bytes);
    }
    return Run(what, timeout, [&](Call& call) {
      // Ring: at step s, pass on block (rank - s) and receive block (rank - s - 1).
      UnboundBuffer& buf = call.View(o, bytes * static_cast<size_t>(size_));
      const int right = Mod(rank_ + 1, size_);
      const int left = Mod(rank_ - 1, size_);
      for (int s = 0; s + 1 < size_; ++s) {
        buf.send(right, call.slot, static_cast<size_t>(Mod(rank_ - s, size_)) * bytes, bytes);
        buf.recv(left, call.slot, static_cast<size_t>(Mod(rank_ - s - 1, size_)) * bytes, bytes);
        call.WaitRecv(buf, left);
        call.WaitSend(buf, right);
      }
    });
  }

  absl::Status Barrier(absl::Duration timeout) override {
    if (absl::Status s = CheckTimeout(timeout, "Barrier"); !s.ok()) return s;
    const std::string what = absl::StrCat("gloo Barrier on rank ", rank_, " of ", size_);
    return Run(what, timeout, [&](Call& call) {
      // Two laps of a token around the ring from rank 0: after the first,
      // rank 0 knows every rank has entered; the second tells the others.
      if (size_ == 1) return;
      uint8_t token_out = 1;
      uint8_t token_in = 0;
      const int right = Mod(rank_ + 1, size_);
      const int left = Mod(rank_ - 1, size_);
      for (int lap = 0; lap < 2; ++lap) {
        UnboundBuffer& out = call.View(&token_out, 1);
        UnboundBuffer& in = call.View(&token_in, 1);
        if (rank_ != 0) {
          in.recv(left, call.slot);
          call.WaitRecv(in, left);
        }
        out.send(right, call.slot);
        call.WaitSend(out, right);
        if (rank_ == 0) {
          in.recv(left, call.slot);
          call.WaitRecv(in, left);
        }
      }
    });
  }

  void Abort() override {
    if (aborted_.exchange(true)) return;
    Interrupt(absl::AbortedError(absl::StrCat("gloo communicator of rank ", rank_, " of ", size_,
                                              " was aborted (Abort() called)")))
        .IgnoreError();
  }

  absl::Status AsyncError() const override {
    absl::MutexLock l(&mu_);
    return error_;
  }

 private:
  // One collective call: its deadline, its slot, and the buffer views it
  // waits on, registered so that Interrupt() can wake them.
  class Call {
   public:
    Call(GlooCommunicator& comm, uint64_t call_slot, absl::Duration timeout)
        : slot(call_slot), comm_(comm), deadline_(absl::Now() + timeout) {
      absl::MutexLock l(&comm_.inflight_mu_);
      comm_.in_call_ = true;
    }
    ~Call() {
      {
        absl::MutexLock l(&comm_.inflight_mu_);
        comm_.inflight_.clear();
        comm_.in_call_ = false;
      }
      views_.clear();  // each waits for a transfer into it to finish
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    // A view of [p, p + n) that Interrupt() can wake.
    UnboundBuffer& View(void* p, size_t n) {
      views_.push_back(comm_.base_->createUnboundBuffer(p, n));
      UnboundBuffer* v = views_.back().get();
      {
        absl::MutexLock l(&comm_.inflight_mu_);
        comm_.inflight_.push_back(v);
      }
      // Interrupt() sets the flag before it wakes the registered views: a
      // view registered after that is caught here.
      if (comm_.interrupted_.load()) throw Interrupted();
      return *v;
    }
    // Waits for the receive from / the send to `peer` posted on `b`.
    void WaitRecv(UnboundBuffer& b, int peer) {
      Waiting w(comm_, peer);
      if (!b.waitRecv(nullptr, ToMs(deadline_ - absl::Now())) || comm_.interrupted_.load()) {
        throw Interrupted();
      }
    }
    void WaitSend(UnboundBuffer& b, int peer) {
      Waiting w(comm_, peer);
      if (!b.waitSend(nullptr, ToMs(deadline_ - absl::Now())) || comm_.interrupted_.load()) {
        throw Interrupted();
      }
    }

    const uint64_t slot;

   private:
    // Tells the watchdog which peer the call is blocked on, while it is.
    class Waiting {
     public:
      Waiting(GlooCommunicator& comm, int peer) : comm_(comm) {
        comm_.wait_epoch_.fetch_add(1);
        comm_.waiting_on_.store(peer);
      }
      ~Waiting() { comm_.waiting_on_.store(-1); }
      Waiting(const Waiting&) = delete;
      Waiting& operator=(const Waiting&) = delete;

     private:
      GlooCommunicator& comm_;
    };

    GlooCommunicator& comm_;
    const absl::Time deadline_;
    std::vector<std::unique_ptr<UnboundBuffer>> views_;
  };

  // Ring all-reduce in place: reduce-scatter, then all-gather, one block of
  // the buffer per rank (block b ends up complete on rank b - 1 first).
  void RingAllReduce(Call& call, uint8_t* data, size_t count, size_t elem, ReduceFn reduce) {
    if (size_ == 1) return;
    const int right = Mod(rank_ + 1, size_);
    const int left = Mod(rank_ - 1, size_);
    const auto bytes_of = [&](int b) {
      const auto [begin, end] = Block(count, size_, b);
      return std::make_pair(begin * elem, (end - begin) * elem);
    };
    const size_t max_block = bytes_of(0).second;  // block 0 is a largest one
    std::vector<uint8_t> tmp(max_block);
    UnboundBuffer& buf = call.View(data, count * elem);
    UnboundBuffer& scratch = call.View(tmp.data(), tmp.size());
    for (int s = 0; s + 1 < size_; ++s) {
      const auto [send_off, send_len] = bytes_of(Mod(rank_ - s, size_));
      const auto [recv_off, recv_len] = bytes_of(Mod(rank_ - s - 1, size_));
      if (send_len > 0) buf.send(right, call.slot, send_off, send_len);
      if (recv_len > 0) scratch.recv(left, call.slot, 0, recv_len);
      if (recv_len > 0) {
        call.WaitRecv(scratch, left);
        reduce(data + recv_off, tmp.data(), recv_len / elem);
      }
      if (send_len > 0) call.WaitSend(buf, right);
    }
    for (int s = 0; s + 1 < size_; ++s) {
      const auto [send_off, send_len] = bytes_of(Mod(rank_ + 1 - s, size_));
      const auto [recv_off, recv_len] = bytes_of(Mod(rank_ - s, size_));
      if (send_len > 0) buf.send(right, call.slot, send_off, send_len);
      if (recv_len > 0) buf.recv(left, call.slot, recv_off, recv_len);
      if (recv_len > 0) call.WaitRecv(buf, left);
      if (send_len > 0) call.WaitSend(buf, right);
    }
  }

  // Runs one collective: fails fast when broken; maps gloo's exceptions;
  // breaks the communicator on the first error.
  template <typename Fn>
  absl::Status Run(const std::string& what, absl::Duration timeout, Fn&& fn) {
    if (absl::Status s = AsyncError(); !s.ok()) return s;
    SigpipeBlock block;
    absl::Status failure;
    try {
      {
        Call call(*this, kSlotBase | next_tag_++, timeout);
        fn(call);
      }
      // A peer left during the call, which did not need it (any more).
      absl::Status left;
      {
        absl::MutexLock l(&inflight_mu_);
        std::swap(left, peer_left_);
      }
      if (!left.ok()) Interrupt(std::move(left)).IgnoreError();
      return absl::OkStatus();
    } catch (const Interrupted&) {
      failure = absl::AbortedError(absl::StrCat(what, ": interrupted"));  // latched already
    } catch (const gloo::IoException& e) {
      failure = FromIo(what, e.what());
    } catch (const gloo::EnforceNotMet& e) {
      failure = absl::InternalError(absl::StrCat(what, ": gloo check failed: ", e.what()));
    } catch (const std::exception& e) {
      failure = absl::InternalError(absl::StrCat(what, ": ", e.what()));
    } catch (...) {
      failure = absl::InternalError(absl::StrCat(what, ": unknown exception from gloo"));
    }
    absl::Status latched = Interrupt(std::move(failure));
    // No call is running now: close the pairs for good (peers see a reset).
    try {
      context_->closeConnections();
    } catch (...) {  // NOLINT(bugprone-empty-catch): best effort; the error is latched
    }
    return latched;
  }

  // Latches `s` unless an error is latched already, then (first time only)
  // wakes the running call, ends the connections so the peers learn of it at
  // once, and stops the watchdog. Returns the latched error.
  absl::Status Interrupt(absl::Status s) {
    absl::Status latched;
    {
      absl::MutexLock l(&mu_);
      if (error_.ok()) error_ = std::move(s);
      latched = error_;
    }
    if (interrupted_.exchange(true)) return latched;
    {
      absl::MutexLock l(&inflight_mu_);
      for (UnboundBuffer* b : inflight_) {
        b->abortWaitRecv();
        b->abortWaitSend();
      }
    }
    // shutdown(2), not close: gloo still owns the descriptors; its event
    // loop reads the end of each connection and fails what is pending there.
    for (const Conn& c : conns_) {
      if (Valid(c)) shutdown(c.fd, SHUT_RDWR);
    }
    StopWatchdog();
    return latched;
  }

  void StopWatchdog() {
    const char b = 1;
    if (stop_write_.valid()) (void)!write(stop_write_.get(), &b, 1);
  }

  // The watchdog (see the top of the file).
  void Watch() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);  // signals go to other threads: no EINTR here
    std::vector<pollfd> fds;
    fds.push_back(pollfd{stop_read_.get(), POLLIN, 0});
    for (const Conn& c : conns_) fds.push_back(pollfd{c.fd, POLLRDHUP, 0});
    std::vector<std::string> gone;
    // Peers that left during the running call, and since when the call has
    // been blocked on one of them (with the wait's epoch).
    std::vector<size_t> departed;
    int blocked_on = -1;
    uint64_t blocked_epoch = 0;
    absl::Time blocked_since;
    for (;;) {
      const int n = poll(fds.data(), fds.size(), departed.empty() ? -1 : 5);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || fds[0].revents != 0 || interrupted_.load()) return;
      if (n > 0) {
        // A dead process ends all its connections at once: give the others
        // a moment to show, so that the error names every rank that is gone.
        absl::SleepFor(absl::Milliseconds(5));
        poll(fds.data(), fds.size(), 0);
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents == 0 || fds[i].fd < 0) continue;
          gone.push_back(absl::StrCat("rank ", conns_[i - 1].peer_rank));
          departed.push_back(i - 1);
          fds[i].fd = -1;  // poll ignores it from now on
        }
        absl::Status lost = absl::UnavailableError(absl::StrCat(
            "gloo rank ", rank_, " of ", size_, ": the connection to ", absl::StrJoin(gone, ", "),
            " ended (the peer exited, failed, aborted or closed its communicator)"));
        bool idle = false;
        {
          absl::MutexLock l(&inflight_mu_);
          idle = !in_call_;
          if (!idle) peer_left_ = lost;  // Run() breaks it once the call returns
        }
        if (idle) {
          Interrupt(std::move(lost)).IgnoreError();
          return;
        }
      }
      // During a call: once gloo has handled the end of a departed peer's
      // connection (it closes the socket after failing what was pending
      // there), a call still blocked on that peer waits for an operation
      // that was half transferred and can never finish: wake it. The grace
      // lets a wait that did complete return first.
      int on = waiting_on_.load();
      const uint64_t epoch = wait_epoch_.load();
      bool doomed = false;
      for (size_t i : departed) doomed = doomed || (conns_[i].peer_rank == on && !Valid(conns_[i]));
      if (!doomed) on = -1;
      if (on != blocked_on || epoch != blocked_epoch) {
        blocked_on = on;
        blocked_epoch = epoch;
        blocked_since = absl::Now();
      } else if (on >= 0 && absl::Now() - blocked_since >= absl::Milliseconds(20)) {
        Interrupt(absl::UnavailableError(absl::StrCat(
                      "gloo rank ", rank_, " of ", size_, ": rank ", on,
                      " ended its connection in the middle of a transfer to or from this rank "
                      "(it exited, failed or aborted)")))
            .IgnoreError();
        return;
      }
    }
  }

  static constexpr uint64_t kSlotBase = uint64_t{0x6f6d} << 48;  // "om"

  const int rank_;
  const int size_;
  const std::unique_ptr<LoopTicker> ticker_;         // outlives device_
  std::shared_ptr<gloo::transport::Device> device_;  // reset last in the destructor
  std::shared_ptr<gloo::Context> context_;           // reset first in the destructor
  std::shared_ptr<gloo::Context> base_;
  const std::vector<Conn> conns_;
  const Fd stop_read_;
  const Fd stop_write_;
  uint64_t next_tag_ = 0;  // only the (one) calling thread touches it
  std::atomic<bool> aborted_{false};
  std::atomic<bool> interrupted_{false};
  std::atomic<int> waiting_on_{-1};  // the peer a call is blocked on, or -1
  std::atomic<uint64_t> wait_epoch_{0};
  absl::Mutex inflight_mu_;
  std::vector<UnboundBuffer*> inflight_ ABSL_GUARDED_BY(inflight_mu_);
  bool in_call_ ABSL_GUARDED_BY(inflight_mu_) = false;
  absl::Status peer_left_ ABSL_GUARDED_BY(inflight_mu_);  // noted during a call
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommOptions& options) {
  const absl::Time deadline = absl::Now() + options.init_timeout;
  const std::string who = absl::StrCat("gloo rank ", options.rank, " of ", options.size);
  SigpipeBlock block;  // the device's event-loop thread inherits the mask
  const std::set<std::pair<int, ino_t>> sockets_before = OpenSockets();
  std::unique_ptr<LoopTicker> ticker;  // declared first: outlives the device
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    device = gloo::transport::tcp::CreateDevice(attr);
    ticker = std::make_unique<LoopTicker>(device.get());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("CommOptions.host: cannot listen on '",
                                                   options.host, "' for gloo: ", e.what()));
  }
  // Announce, then wait for the neighbours' addresses only; the arrival keys
  // name the ranks that never came when that wait times out.
  if (absl::Status s = AnnounceRank(*options.store, options.rank, "gloo"); !s.ok()) return s;
  std::unique_ptr<Store> view = MakePrefixStore(*options.store, "gloo");
  auto context = std::make_shared<RingContext>(options.rank, options.size);
  // A pair waits up to 5x the context timeout to connect; keep that within
  // the rendezvous deadline. Collectives pass their own timeouts.
  context->setTimeout(ToMs((deadline - absl::Now()) / 5));
  try {
    ticker->Start();
    context->Connect(*view, deadline, device, options.abandon);
    ticker->Stop();
  } catch (const StoreError& e) {
    if (absl::IsDeadlineExceeded(e.status())) {
      absl::Status missing = MissingRanksError(*options.store, options.rank, options.size,
                                               options.init_timeout, "gloo");
      if (!missing.ok()) return missing;
    }
    return absl::Status(e.status().code(),
                        absl::StrCat(who, ": rendezvous: ", e.status().message()));
  } catch (const gloo::IoException& e) {
    if (IsTimeout(e.what())) {
      return absl::DeadlineExceededError(
          absl::StrCat(who, ": connecting to the peers did not finish within ",
                       absl::FormatDuration(options.init_timeout), ": ", e.what()));
    }
    return absl::UnavailableError(absl::StrCat(who, ": connecting to the peers: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(who, ": connecting to the peers: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(who, ": unknown exception while connecting"));
  }
  std::vector<Conn> conns = FindConnections(*context, sockets_before);
  int p[2] = {-1, -1};
  if (pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, who + ": pipe2");
  auto comm = std::make_unique<GlooCommunicator>(options.rank, options.size, std::move(ticker),
                                                 std::move(device), std::move(context),
                                                 std::move(conns), Fd(p[0]), Fd(p[1]));
  if (absl::Status s = comm->Start(); !s.ok()) return s;
  return comm;
}

}  // namespace omni::internal
