// bench_cluster_sim: the co-location policy at cluster scale. One trace of
// jobs (generator: cluster_sim_model.h, sources in docs/colocation.md) runs
// under static allocation, kill-and-requeue, and forecast-driven co-location
// (omni::colocate's Policy and GuestGate); per-job step behaviour comes from
// the step logs in tests/data (the runtime's own format), replayed through
// the guest gate. Prints the profiles, one line per policy, then one JSON
// line.
//
//   bench_cluster_sim [--devices N] [--days D] [--seed S] [--load-factor F]
//                     [--traces DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "cluster_sim_model.h"
#include "nlohmann/json.hpp"

namespace cs = omni::clustersim;

namespace {

bool Flag(int argc, char** argv, int& i, const char* name, std::string* out) {
  if (std::strcmp(argv[i], name) != 0) return false;
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", name);
    std::exit(2);
  }
  *out = argv[++i];
  return true;
}

double Number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(d >= 0)) {
    std::fprintf(stderr, "%s: not a non-negative number: %s\n", flag.c_str(), v.c_str());
    std::exit(2);
  }
  return d;
}

}  // namespace

int Run(int argc, char** argv) {
  cs::WorkloadOptions wo;
  std::string traces = std::string(OMNI_SOURCE_DIR) + "/tests/data";
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (Flag(argc, argv, i, "--devices", &v)) {
      wo.devices = static_cast<int>(Number("--devices", v));
    } else if (Flag(argc, argv, i, "--days", &v)) {
      wo.days = Number("--days", v);
    } else if (Flag(argc, argv, i, "--seed", &v)) {
      wo.seed = static_cast<uint64_t>(Number("--seed", v));
    } else if (Flag(argc, argv, i, "--load-factor", &v)) {
      wo.load_factor = Number("--load-factor", v);
    } else if (Flag(argc, argv, i, "--traces", &v)) {
      traces = v;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (wo.devices < 8 || wo.days <= 0) {
    std::fprintf(stderr, "--devices must be >= 8 and --days > 0\n");
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<cs::StepProfile>> profiles = cs::LoadProfiles(traces, {});
  if (!profiles.ok()) {
    std::fprintf(stderr, "%s\n", std::string(profiles.status().message()).c_str());
    return 1;
  }
  nlohmann::json prof_json = nlohmann::json::array();
  for (const cs::StepProfile& p : *profiles) {
    std::printf(
        "profile %-26s idle %.3f  harvest %.3f  host slowdown %.5f  windows %lld  units %lld  "
        "misses %lld  yield p99 %.2f ms\n",
        p.name.c_str(), p.idle_fraction, p.harvest_fraction, p.host_slowdown,
        static_cast<long long>(p.windows), static_cast<long long>(p.guest_units),
        static_cast<long long>(p.deadline_misses), p.yield_p99_ms);
    prof_json.push_back({{"log", p.name},
                         {"idle_fraction", p.idle_fraction},
                         {"harvest_fraction", p.harvest_fraction},
                         {"host_slowdown", p.host_slowdown}});
  }
  const std::vector<cs::JobSpec> jobs = cs::GenerateJobs(wo, static_cast<int>(profiles->size()));
  cs::SimOptions so;
  so.devices = wo.devices;
  so.warmup_s = wo.warmup_days * 86400.0;
  so.window_s = wo.days * 86400.0;

  const cs::SimPolicy kinds[] = {cs::SimPolicy::kStatic, cs::SimPolicy::kKillRequeue,
                                 cs::SimPolicy::kColocate};
  absl::StatusOr<cs::SimResult> results[3] = {absl::UnknownError(""), absl::UnknownError(""),
                                              absl::UnknownError("")};
  double policy_s[3] = {0, 0, 0};
  auto run = [&](int k) {
    const auto start = std::chrono::steady_clock::now();
    results[k] = cs::Simulate(jobs, *profiles, kinds[k], so);
    policy_s[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  {
    // Two cores: the three policies on two threads.
    std::thread other([&] { run(2); });
    run(0);
    run(1);
    other.join();
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json pol = nlohmann::json::object();
  for (int k = 0; k < 3; ++k) {
    if (!results[k].ok()) {
      std::fprintf(stderr, "%s: %s\n", cs::SimPolicyName(kinds[k]),
                   std::string(results[k].status().message()).c_str());
      return 1;
    }
    const cs::SimResult& r = *results[k];
    std::printf(
        "%-12s utilization %.4f  critical slowdown %.2f%%  regular JCT %.2f h  lost %.0f "
        "device-h  starved %d  preemptions %lld  guest attaches %lld  harvested %.0f device-h  "
        "events %lld  (%.2f s)\n",
        cs::SimPolicyName(kinds[k]), r.utilization, r.critical_slowdown_pct, r.regular_jct_h,
        r.lost_work_h, r.starved, static_cast<long long>(r.preemptions),
        static_cast<long long>(r.guest_attaches), r.harvested_device_s / 3600.0,
        static_cast<long long>(r.events), policy_s[k]);
    pol[cs::SimPolicyName(kinds[k])] = {
        {"utilization", r.utilization},
        {"critical_slowdown_pct", r.critical_slowdown_pct},
        {"regular_jct_h", r.regular_jct_h},
        {"lost_work_h", r.lost_work_h},
        {"starved", r.starved},
        {"preemptions", r.preemptions},
        {"harvested_device_h", r.harvested_device_s / 3600.0},
    };
  }
  nlohmann::json out = {{"benchmark", "cluster_sim"},
                        {"devices", wo.devices},
                        {"sim_days", wo.days},
                        {"wall_s", wall_s},
                        {"seed", wo.seed},
                        {"jobs", jobs.size()},
                        {"load_factor", wo.load_factor},
                        {"offered_load", cs::OfferedLoad(wo)},
                        {"warmup_days", wo.warmup_days},
                        {"profiles", prof_json},
                        {"policies", pol}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {  // e.g. bad_alloc, a JSON dump of a bad string
    std::fprintf(stderr, "bench_cluster_sim: %s\n", e.what());
    return 1;
  }
}
