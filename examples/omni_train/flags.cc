#include "flags.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace omni_train {
namespace {

absl::Status BadValue(absl::string_view flag, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value '", value, "' for --", flag, ": expected ", expected));
}

absl::Status ParseInt(absl::string_view flag, absl::string_view value, int64_t min, int64_t max,
                      int64_t* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < min || v > max) {
    return BadValue(flag, value, absl::StrCat("an integer in [", min, ", ", max, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParseDouble(absl::string_view flag, absl::string_view value, double min, bool min_open,
                         double* out) {
  double v = 0;
  if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v < min || (min_open && v == min)) {
    return BadValue(flag, value, absl::StrCat("a finite number ", min_open ? "> " : ">= ", min));
  }
  *out = v;
  return absl::OkStatus();
}

}  // namespace

std::string Usage() {
  return R"(usage: omni_train [flags]

A small multimodal LibTorch trainer (conv image encoder + causal transformer
decoder, next-token prediction on synthetic image+text samples) instrumented
with Omni telemetry. The same command gives bit-identical parameters.

  --steps N         training steps (default 300)
  --seed S          seed for the model and the data (default 1)
  --batch B         samples per batch (default 8)
  --lr X            AdamW learning rate (default 0.003)
  --threads T       LibTorch intra-op threads (default 1)
  --device D        cpu (default), cuda (the GPU of LOCAL_RANK) or cuda:N; on CUDA,
                    deterministic kernels only, and with --store the replicas reduce
                    over NCCL (no Gloo needed)
  --float64         train in double precision (parameters, activations, gradients,
                    optimizer state): summation-order differences between runs then
                    stay near 1e-16 relative per operation (the soak test compares
                    runs this way); --params-out still writes float32
  --dropout P       dropout probability in the decoder blocks (default 0); it draws from
                    the device's generator, which checkpoints save and restore
  --log PATH        write the JSON Lines step log to PATH
  --trace PATH      write a Perfetto (Chrome JSON) trace to PATH
  --forecast PATH   publish idle-window forecasts to PATH (atomic file sink)
  --eval-every M    evaluate in every step s with s % M == M-1 (default 50; 0 = never)
  --text-only       text-only training: no images, no heavy-tailed decoding
  --stall-scale X   multiplies the per-sample decode cost (default 1; 0 = no decode cost)
  --stall-io        the decode cost is a blocking wait of the same modelled length (a fetch
                    from remote storage), not CPU work: a data stall leaves the core idle
  --shard-batches N the training data streams in shards of N global batches; the first
                    batch of a shard waits for its fetch (default 0 = no shards)
  --shard-fetch-ms MS
                    the fetch of one shard, a blocking wait (median MS, +-5% per shard)
  --window N        rolling statistics window in steps (default 200)
  --window-channel NAME
                    publish live window notices ("idle now" / "busy again") on the
                    shared-memory channel NAME for guests on this host
                    (omni/window_channel.h, docs/colocation.md)
  --publish-prefix P
                    publish forecasts, window notices and the outlook under P in the
                    store (--store) for guests on other hosts (omni/sinks.h)
  --quiet           print only the final line
  --help            print this help

Checkpoints and preemption:
  --ckpt-dir DIR    save checkpoints to DIR and resume from the newest valid one there
                    (with --store: the same DIR for every replica, job-level checkpoints)
  --ckpt-every N    checkpoint every N steps (default 0: only when preempted)
  --ckpt-every-s S  checkpoint by wall time instead: at the first step boundary S seconds
                    after the last save's (the replicas agree on one boundary)
  --keep K          keep the newest K checkpoints (default 3)
  --async-ckpt      write periodic checkpoints on a background thread
  --start-fresh     start from step 0 even when --ckpt-dir holds checkpoints of which none
                    is valid (without it omni_train refuses, naming each and why)
  --loss-log PATH   append "step=<N> loss=<loss>" for every step to PATH
  --notice-file F   watch F for a scheduler's notice {"deadline_unix_ms": T} / {"yield_in_s": S}
  --notice-key K    watch key K of --store for a notice {"yield_in_s": S} (a store spans
                    hosts, whose wall clocks are never compared)
  --params-out PATH write the final parameters to PATH (raw little-endian float32, in
                    named_parameters() order)

Elastic data parallelism (every replica is one process running the same command
with its own --replica-id; replicas come and go at step boundaries):
  --store URI          rendezvous store: file:///shared/dir or tcp://host:port
                       (tcp://host:port?server=1 hosts it in this process)
  --replica-id ID      this replica's id, unique in the job ([A-Za-z0-9_.-])
  --min-replicas N     train only with at least N replicas; wait otherwise (default 1)
  --max-replicas N     admit at most N replicas (default and limit: --batch)
  --heartbeat-ms T     heartbeat period (default 100)
  --peer-timeout-ms T  a replica silent this long is dropped (default 1000)
  --leave-on-preempt   a preempted replica leaves alone at the next boundary but one
                       (the others go on at once, without a timeout); by default a
                       preemption of any replica stops every replica at one boundary
The global batch (--batch) stays the same whatever the number of replicas: each
takes its share of it in micro-batches of at most ceil(batch / max-replicas)
samples, and gradients are summed across replicas. Topology labels for rank
placement come from OMNI_RACK and OMNI_SWITCH in the environment.
On SIGTERM, SIGUSR1 or SIGINT (or a notice), training stops at the last step
boundary from which a checkpoint still fits before the deadline (30 s after
the signal, or OMNI_PREEMPT_GRACE_S), saves and exits with 75; if even a save
cannot fit it exits with 76 without saving. A second signal saves at the next
boundary. Started again with the same flags it resumes where it stopped.

The last line of stdout is always
  final step=<N> params_xxh3=<16 hex digits> loss=<last training loss>
Exit codes: 0 success, 1 runtime error, 2 bad command line, 75 preempted after
saving a checkpoint (resumable), 76 preempted without a checkpoint.
)";
}

absl::StatusOr<TrainFlags> ParseFlags(int argc, const char* const* argv) {
  TrainFlags f;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (flags start with --)"));
    }
    absl::string_view name = arg.substr(2);
    absl::string_view value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != absl::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }

    // Boolean flags.
    if (name == "text-only" || name == "quiet" || name == "help" || name == "async-ckpt" ||
        name == "leave-on-preempt" || name == "start-fresh" || name == "stall-io" ||
        name == "float64") {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes no value"));
      }
      if (name == "text-only") f.text_only = true;
      if (name == "quiet") f.quiet = true;
      if (name == "help") f.help = true;
      if (name == "async-ckpt") f.async_ckpt = true;
      if (name == "start-fresh") f.start_fresh = true;
      if (name == "stall-io") f.stall_io = true;
      if (name == "float64") f.float64 = true;
      if (name == "leave-on-preempt") f.leave_on_preempt = true;
      continue;
    }

    static constexpr absl::string_view kValued[] = {"steps",          "seed",
                                                    "batch",          "lr",
                                                    "threads",        "log",
                                                    "trace",          "forecast",
                                                    "eval-every",     "stall-scale",
                                                    "window",         "ckpt-dir",
                                                    "ckpt-every",     "keep",
                                                    "loss-log",       "notice-file",
                                                    "store",          "replica-id",
                                                    "min-replicas",   "max-replicas",
                                                    "heartbeat-ms",   "peer-timeout-ms",
                                                    "params-out",     "device",
                                                    "dropout",        "notice-key",
                                                    "window-channel", "shard-batches",
                                                    "shard-fetch-ms", "publish-prefix",
                                                    "ckpt-every-s"};
    bool known = false;
    for (absl::string_view k : kValued) known = known || k == name;
    if (!known) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!has_value) {
      if (i + 1 >= argc || absl::StartsWith(argv[i + 1], "--")) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = argv[++i];
    }

    int64_t n = 0;
    if (name == "steps") {
      if (auto s = ParseInt(name, value, 1, int64_t{1} << 40, &n); !s.ok()) return s;
      f.steps = n;
    } else if (name == "seed") {
      uint64_t seed = 0;
      if (!absl::SimpleAtoi(value, &seed)) {
        return BadValue(name, value, "a non-negative 64-bit integer");
      }
      f.seed = seed;
    } else if (name == "batch") {
      if (auto s = ParseInt(name, value, 1, 4096, &n); !s.ok()) return s;
      f.batch = static_cast<int>(n);
    } else if (name == "lr") {
      if (auto s = ParseDouble(name, value, 0.0, /*min_open=*/true, &f.lr); !s.ok()) return s;
    } else if (name == "threads") {
      if (auto s = ParseInt(name, value, 1, 1024, &n); !s.ok()) return s;
      f.threads = static_cast<int>(n);
    } else if (name == "eval-every") {
      if (auto s = ParseInt(name, value, 0, int64_t{1} << 40, &n); !s.ok()) return s;
      f.eval_every = n;
    } else if (name == "stall-scale") {
      if (auto s = ParseDouble(name, value, 0.0, /*min_open=*/false, &f.stall_scale); !s.ok()) {
        return s;
      }
    } else if (name == "shard-batches") {
      if (auto s = ParseInt(name, value, 0, int64_t{1} << 40, &n); !s.ok()) return s;
      f.shard_batches = n;
    } else if (name == "shard-fetch-ms") {
      if (auto s = ParseDouble(name, value, 0.0, /*min_open=*/false, &f.shard_fetch_ms); !s.ok()) {
        return s;
      }
    } else if (name == "window") {
      if (auto s = ParseInt(name, value, 1, 1 << 24, &n); !s.ok()) return s;
      f.window = static_cast<int>(n);
    } else if (name == "ckpt-every") {
      if (auto s = ParseInt(name, value, 0, int64_t{1} << 40, &n); !s.ok()) return s;
      f.ckpt_every = n;
    } else if (name == "ckpt-every-s") {
      if (auto s = ParseDouble(name, value, 0.0, /*min_open=*/true, &f.ckpt_every_s); !s.ok()) {
        return s;
      }
    } else if (name == "keep") {
      if (auto s = ParseInt(name, value, 1, 1 << 20, &n); !s.ok()) return s;
      f.keep = static_cast<int>(n);
    } else if (name == "min-replicas") {
      if (auto s = ParseInt(name, value, 1, 4096, &n); !s.ok()) return s;
      f.min_replicas = static_cast<int>(n);
    } else if (name == "max-replicas") {
      if (auto s = ParseInt(name, value, 1, 4096, &n); !s.ok()) return s;
      f.max_replicas = static_cast<int>(n);
    } else if (name == "heartbeat-ms") {
      if (auto s = ParseInt(name, value, 1, 3'600'000, &n); !s.ok()) return s;
      f.heartbeat_ms = n;
    } else if (name == "peer-timeout-ms") {
      if (auto s = ParseInt(name, value, 2, 3'600'000, &n); !s.ok()) return s;
      f.peer_timeout_ms = n;
    } else if (name == "device") {
      int64_t index = 0;
      const bool cuda_n = absl::StartsWith(value, "cuda:") &&
                          absl::SimpleAtoi(value.substr(5), &index) && index >= 0 &&
                          index < (1 << 15);
      if (value != "cpu" && value != "cuda" && !cuda_n) {
        return BadValue(name, value, "cpu, cuda or cuda:N");
      }
      f.device = std::string(value);
    } else if (name == "dropout") {
      if (auto s = ParseDouble(name, value, 0.0, /*min_open=*/false, &f.dropout); !s.ok()) return s;
      if (f.dropout >= 1.0) return BadValue(name, value, "a probability in [0, 1)");
    } else if (name == "notice-key") {
      if (value.empty()) return BadValue(name, value, "a non-empty store key");
      f.notice_key = std::string(value);
    } else if (name == "publish-prefix") {
      if (value.empty()) return BadValue(name, value, "a non-empty store key prefix");
      f.publish_prefix = std::string(value);
    } else if (name == "window-channel") {
      if (value.empty()) return BadValue(name, value, "a non-empty channel name");
      f.window_channel = std::string(value);
    } else if (name == "replica-id") {
      if (value.empty()) return BadValue(name, value, "a non-empty id");
      f.replica_id = std::string(value);
    } else {  // paths
      if (value.empty()) return BadValue(name, value, "a non-empty path");
      std::string& path = name == "log"          ? f.log_path
                          : name == "trace"      ? f.trace_path
                          : name == "forecast"   ? f.forecast_path
                          : name == "ckpt-dir"   ? f.ckpt_dir
                          : name == "loss-log"   ? f.loss_log
                          : name == "store"      ? f.store
                          : name == "params-out" ? f.params_out
                                                 : f.notice_file;
      path = std::string(value);
    }
  }
  if (f.ckpt_every > 0 && f.ckpt_dir.empty()) {
    return absl::InvalidArgumentError("flag --ckpt-every needs --ckpt-dir");
  }
  if (f.ckpt_every_s > 0 && f.ckpt_dir.empty()) {
    return absl::InvalidArgumentError("flag --ckpt-every-s needs --ckpt-dir");
  }
  if (f.ckpt_every_s > 0 && f.ckpt_every > 0) {
    return absl::InvalidArgumentError("flags --ckpt-every and --ckpt-every-s: choose one");
  }
  if (f.leave_on_preempt && f.store.empty()) {
    return absl::InvalidArgumentError("flag --leave-on-preempt needs --store");
  }
  if (!f.notice_key.empty() && f.store.empty()) {
    return absl::InvalidArgumentError("flag --notice-key needs --store");
  }
  if (f.store.empty() != f.replica_id.empty()) {
    return absl::InvalidArgumentError("flags --store and --replica-id go together");
  }
  if (f.max_replicas == 0) f.max_replicas = f.batch;
  if (f.max_replicas > f.batch) {
    return absl::InvalidArgumentError(absl::StrCat("flag --max-replicas: ", f.max_replicas,
                                                   " is more than --batch ", f.batch,
                                                   " (every replica needs a sample)"));
  }
  if (f.min_replicas > f.max_replicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --min-replicas: ", f.min_replicas, " is more than --max-replicas ", f.max_replicas));
  }
  if (f.peer_timeout_ms < 2 * f.heartbeat_ms) {
    return absl::InvalidArgumentError(absl::StrCat("flag --peer-timeout-ms: ", f.peer_timeout_ms,
                                                   " must be at least twice --heartbeat-ms (",
                                                   f.heartbeat_ms, ")"));
  }
  return f;
}

}  // namespace omni_train
