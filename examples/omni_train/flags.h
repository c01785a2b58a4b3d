// Command-line flags of omni_train: a small hand-written parser (no LibTorch).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace omni_train {

struct TrainFlags {
  int64_t steps = 300;
  uint64_t seed = 1;
  int batch = 8;
  double lr = 3e-3;
  int threads = 1;
  std::string device = "cpu";  // --device: cpu, cuda or cuda:N
  double dropout = 0;          // --dropout: in the decoder blocks (uses the device's RNG)
  std::string log_path;        // --log: JSON Lines step log
  std::string trace_path;      // --trace: Perfetto / Chrome trace
  std::string forecast_path;   // --forecast: forecast file sink
  std::string window_channel;  // --window-channel: live window notices channel
  std::string publish_prefix;  // --publish-prefix: the same in the store, for other hosts
  int64_t eval_every = 50;     // 0 disables eval
  bool text_only = false;
  bool stall_io = false;  // --stall-io: the decode cost is a blocking wait, not CPU work
  bool float64 = false;   // --float64: parameters, activations and gradients in double
  double stall_scale = 1.0;
  int64_t shard_batches = 0;  // --shard-batches: global batches per data shard (0 = none)
  double shard_fetch_ms = 0;  // --shard-fetch-ms: the fetch of one shard (a blocking wait)
  int window = 200;
  bool quiet = false;
  bool help = false;
  // Checkpoints and preemption.
  std::string ckpt_dir;      // --ckpt-dir: resume from / save to (empty = off)
  int64_t ckpt_every = 0;    // --ckpt-every: periodic checkpoint every N steps (0 = off)
  double ckpt_every_s = 0;   // --ckpt-every-s: periodic checkpoint by wall time (0 = off)
  int keep = 3;              // --keep: newest checkpoints kept
  bool async_ckpt = false;   // --async-ckpt: periodic checkpoints written in the background
  bool start_fresh = false;  // --start-fresh: from step 0 when none of --ckpt-dir is valid
  std::string loss_log;      // --loss-log: append "step=<N> loss=<%.9g>" per step
  std::string notice_file;   // --notice-file: scheduler notice (omni::PreemptionOptions)
  std::string notice_key;    // --notice-key: the same notice, as a key of --store
  // Elastic data parallelism (on when --store is given).
  std::string store;               // --store: file:///dir or tcp://host:port
  std::string replica_id;          // --replica-id: unique within the job
  int min_replicas = 1;            // --min-replicas
  int max_replicas = 0;            // --max-replicas (0 = --batch)
  int64_t heartbeat_ms = 100;      // --heartbeat-ms
  int64_t peer_timeout_ms = 1000;  // --peer-timeout-ms
  bool leave_on_preempt = false;   // --leave-on-preempt: a preempted replica leaves alone
  std::string params_out;          // --params-out: raw float32 parameters at the end
};

// Parses argv[1..argc). Accepts "--flag value" and "--flag=value".
// InvalidArgument naming the flag for an unknown flag, a missing value or a
// bad value.
absl::StatusOr<TrainFlags> ParseFlags(int argc, const char* const* argv);

// The --help text.
std::string Usage();

}  // namespace omni_train
