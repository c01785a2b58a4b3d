// One rank of the communicator-rebuild benchmark (driven by
// benchmarks/elastic_bench.py, which starts `size` of these beside the same
// number of torch.distributed processes).
//
//   omni_comm_rebuild --store URI --rank R --size N --rounds K
//
// Every round builds a new Gloo communicator under its own store prefix (as
// ElasticGroup does for a new generation), runs one barrier, and destroys it.
// Prints one line per round: "round <k> ms <build+barrier milliseconds>".
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "omni/comm.h"
#include "omni/store.h"
#include "omni/torch/store.h"

namespace {

int Usage() {
  std::fprintf(stderr, "usage: omni_comm_rebuild --store URI --rank R --size N --rounds K\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string uri;
  int rank = -1, size = 0, rounds = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    bool ok = true;
    if (flag == "--store") {
      uri = v;
    } else if (flag == "--rank") {
      ok = absl::SimpleAtoi(v, &rank);
    } else if (flag == "--size") {
      ok = absl::SimpleAtoi(v, &size);
    } else if (flag == "--rounds") {
      ok = absl::SimpleAtoi(v, &rounds);
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  if (uri.empty() || rank < 0 || size < 1 || rank >= size || rounds < 1) return Usage();
  if (auto st = omni::torch_ext::RegisterTcpStore(); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<omni::Store>> store = omni::OpenStore(uri);
  if (!store.ok()) {
    std::fprintf(stderr, "omni_comm_rebuild: %s\n", store.status().ToString().c_str());
    return 1;
  }
  for (int k = 0; k < rounds; ++k) {
    std::unique_ptr<omni::Store> view = omni::MakePrefixStore(**store, absl::StrCat("round", k));
    omni::CommOptions o;
    o.rank = rank;
    o.size = size;
    o.store = view.get();
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<omni::Communicator>> comm = omni::CreateCommunicator(o);
    if (!comm.ok()) {
      std::fprintf(stderr, "omni_comm_rebuild: round %d: %s\n", k,
                   comm.status().ToString().c_str());
      return 1;
    }
    if (auto st = (*comm)->Barrier(absl::Seconds(60)); !st.ok()) {
      std::fprintf(stderr, "omni_comm_rebuild: round %d: %s\n", k, st.ToString().c_str());
      return 1;
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("round %d ms %.3f\n", k, ms);
    std::fflush(stdout);
    comm->reset();
  }
  // Keep a tcp:// server up until every rank is done with it.
  if (auto st = (*store)->Add("done", 1); !st.ok()) return 1;
  if (rank == 0) {
    for (int i = 0; i < 6000; ++i) {
      absl::StatusOr<std::optional<std::string>> d = (*store)->TryGet("done");
      int64_t n = 0;
      if (d.ok() && d->has_value() && absl::SimpleAtoi(**d, &n) && n >= size) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return 0;
}
