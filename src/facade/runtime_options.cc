// RuntimeOptions::FromEnvironment: torchrun, Slurm and OMNI_* variables.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "omni/runtime.h"

namespace omni {
namespace {

// The first of `names` that is set and not empty.
std::optional<std::pair<const char*, std::string>> First(const EnvLookup& env,
                                                         std::initializer_list<const char*> names) {
  for (const char* name : names) {
    std::optional<std::string> v = env(name);
    if (v.has_value() && !v->empty()) return std::make_pair(name, *std::move(v));
  }
  return std::nullopt;
}

absl::Status ReadInt(const EnvLookup& env, std::initializer_list<const char*> names, int64_t min,
                     int64_t* out) {
  const auto v = First(env, names);
  if (!v.has_value()) return absl::OkStatus();
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(v->second, &parsed) || parsed < min) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", v->first, "='",
                                                   v->second, "': expected an integer >= ", min));
  }
  *out = parsed;
  return absl::OkStatus();
}

absl::Status ReadInt(const EnvLookup& env, std::initializer_list<const char*> names, int64_t min,
                     int* out) {
  int64_t wide = *out;
  if (auto st = ReadInt(env, names, min, &wide); !st.ok()) return st;
  if (wide > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", *names.begin(), ": ", wide, " is too large"));
  }
  *out = static_cast<int>(wide);
  return absl::OkStatus();
}

void ReadString(const EnvLookup& env, const char* name, std::string* out) {
  if (auto v = First(env, {name}); v.has_value()) *out = v->second;
}

// A number of seconds in [0, 1e9]; `what` names it in the error.
absl::Status ReadSeconds(const EnvLookup& env, const char* name, const char* what,
                         absl::Duration* out) {
  const auto v = First(env, {name});
  if (!v.has_value()) return absl::OkStatus();
  double s = 0;
  if (!absl::SimpleAtod(v->second, &s) || !std::isfinite(s) || s < 0 || s > 1e9) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", v->second,
                                                   "': expected a number of seconds >= 0 (", what,
                                                   ")"));
  }
  *out = absl::Seconds(s);
  return absl::OkStatus();
}

}  // namespace

std::optional<std::string> ProcessEnvironment(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read at the call
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::StatusOr<RuntimeOptions> RuntimeOptions::FromEnvironment(const EnvLookup& env) {
  RuntimeOptions o;
  if (auto st = ReadInt(env, {"RANK", "SLURM_PROCID"}, 0, &o.rank); !st.ok()) return st;
  if (auto st = ReadInt(env, {"WORLD_SIZE", "SLURM_NTASKS"}, 1, &o.world_size); !st.ok()) {
    return st;
  }
  if (auto st = ReadInt(env, {"LOCAL_RANK", "SLURM_LOCALID"}, 0, &o.local_rank); !st.ok()) {
    return st;
  }
  if (o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("environment: rank ", o.rank,
                                                   " is not below the world size ", o.world_size,
                                                   " (RANK / WORLD_SIZE or SLURM_PROCID / "
                                                   "SLURM_NTASKS)"));
  }
  ReadString(env, "OMNI_STORE", &o.store_uri);
  if (o.store_uri.empty()) {
    const auto addr = First(env, {"MASTER_ADDR"});
    const auto port = First(env, {"MASTER_PORT"});
    if (addr.has_value() && port.has_value()) {
      o.store_uri = absl::StrCat("tcp://", addr->second, ":", port->second);
    }
  }
  MembershipOptions& m = o.elastic.membership;
  ReadString(env, "OMNI_REPLICA_ID", &m.self.id);
  if (!o.store_uri.empty()) {
    if (m.self.id.empty()) m.self.id = absl::StrCat("rank-", o.rank);
    if (First(env, {"WORLD_SIZE", "SLURM_NTASKS"}).has_value()) m.max_replicas = o.world_size;
  }
  if (auto st = ReadInt(env, {"OMNI_MIN_REPLICAS"}, 1, &m.min_replicas); !st.ok()) return st;
  if (auto st = ReadInt(env, {"OMNI_MAX_REPLICAS"}, 1, &m.max_replicas); !st.ok()) return st;
  ReadString(env, "OMNI_RACK", &m.self.rack);
  ReadString(env, "OMNI_SWITCH", &m.self.switch_name);
  ReadString(env, "OMNI_JOB_ID", &o.job_id);
  ReadString(env, "OMNI_CKPT_DIR", &o.ckpt_dir);
  if (auto st = ReadInt(env, {"OMNI_CKPT_EVERY"}, 0, &o.ckpt_every); !st.ok()) return st;
  if (auto st = ReadInt(env, {"OMNI_TOTAL_STEPS"}, 0, &o.total_steps); !st.ok()) return st;
  ReadString(env, "OMNI_STEP_LOG", &o.telemetry.step_log_path);
  ReadString(env, "OMNI_TRACE", &o.telemetry.trace_path);
  ReadString(env, "OMNI_NOTICE_FILE", &o.preemption.notice_file);
  ReadString(env, "OMNI_NOTICE_KEY", &o.notice_key);
  ReadString(env, "OMNI_PUBLISH_PREFIX", &o.publish_prefix);
  if (auto st = ReadSeconds(env, "OMNI_PREEMPT_GRACE_S", "the preemption grace period",
                            &o.preemption.grace);
      !st.ok()) {
    return st;
  }
  if (auto st = ReadSeconds(env, "OMNI_CKPT_EVERY_S", "the checkpoint period by wall time",
                            &o.ckpt_every_time);
      !st.ok()) {
    return st;
  }
  return o;
}

}  // namespace omni
