// The keyword options of the omni._C classes (private to python/src), each
// listed once and visited both to read **kwargs (KwargsReader) and to report
// the defaults (DictWriter). Shared by the class that takes them and by
// omni.Runtime, which takes them as nested dicts (telemetry=, preemption=,
// elastic=, sampler=).
//
// Thread safety: plain functions over option structs.
#pragma once

#include "omni/elastic.h"
#include "omni/preemption.h"
#include "omni/sampler.h"
#include "omni/telemetry.h"

namespace omni_python {

// The keyword options of Telemetry(...), in Python units, listed once and
// visited both to read kwargs and to report the defaults.
template <typename Visitor>
void VisitTelemetryOptions(omni::TelemetryOptions& o, Visitor& v) {
  v.Int("window", &o.stats.window);
  v.Int("warmup_min_steps", &o.stats.warmup.min_steps);
  v.Int("warmup_max_steps", &o.stats.warmup.max_steps);
  v.Int("warmup_window", &o.stats.warmup.window);
  v.Float("warmup_max_drift", &o.stats.warmup.max_drift);
  v.Bool("forecast", &o.forecast_enabled);
  v.Seconds("horizon_s", &o.forecast.horizon_ns);
  v.Float("k", &o.forecast.k);
  v.Seconds("min_window_s", &o.forecast.min_window_ns);
  v.Int("max_windows", &o.forecast.max_windows);
  v.Int("checkpoint_every", &o.forecast.checkpoint.every_steps);
  v.Int("checkpoint_offset", &o.forecast.checkpoint.offset);
  v.Seconds("checkpoint_expected_s", &o.forecast.checkpoint.expected_ns);
  v.Seconds("checkpoint_every_s", &o.forecast.checkpoint.every_ns);
  v.Int("checkpoint_wall_lag_steps", &o.forecast.checkpoint.wall_lag_steps);
  v.Int("eval_every", &o.forecast.eval.every_steps);
  v.Int("eval_offset", &o.forecast.eval.offset);
  v.Seconds("eval_expected_s", &o.forecast.eval.expected_ns);
  v.Seconds("eval_every_s", &o.forecast.eval.every_ns);
  v.Int("eval_wall_lag_steps", &o.forecast.eval.wall_lag_steps);
  v.Int("pipeline_stages", &o.forecast.pipeline.stages);
  v.Int("pipeline_micro_batches", &o.forecast.pipeline.micro_batches);
  v.Int("pipeline_stage", &o.forecast.pipeline.stage);
  v.Float("pipeline_backward_over_forward", &o.forecast.pipeline.backward_over_forward);
  v.Seconds("publish_interval_s", &o.publish_interval_ns);
  v.Path("step_log", &o.step_log_path);
  v.Path("trace", &o.trace_path);
  v.Bool("keep_previous_outputs", &o.keep_previous_outputs);
  v.Int("learn_previous_steps", &o.learn_previous_steps);
  v.Str("window_channel", &o.window_channel_name);
  v.Str("source", &o.source);
  v.Int("ring_capacity", &o.ring_capacity);
}

// The scalar keyword options of PreemptionMonitor(...), in Python units.
template <typename Visitor>
void VisitPreemptionOptions(omni::PreemptionOptions& o, Visitor& v) {
  v.Path("notice_file", &o.notice_file);
  v.Str("notice_key", &o.notice_key);
  v.Duration("notice_poll_s", &o.notice_poll);
  v.Duration("grace_s", &o.grace);
  v.Float("k", &o.k);
}

// The keyword options of DistributedSampler(dataset_size, ...).
template <typename Visitor>
void VisitSamplerOptions(omni::SamplerOptions& o, Visitor& v) {
  v.Int("global_batch", &o.global_batch);
  v.Int("seed", &o.seed);
  v.Bool("shuffle", &o.shuffle);
  v.Bool("drop_last", &o.drop_last);
}

template <typename Visitor>
void VisitElasticOptions(omni::ElasticOptions& o, Visitor& v) {
  v.Str("job_id", &o.membership.job_id);
  v.Str("model_digest", &o.membership.model_digest);
  v.Str("replica_id", &o.membership.self.id);
  v.Str("replica_host", &o.membership.self.host);
  v.Str("rack", &o.membership.self.rack);
  v.Str("switch", &o.membership.self.switch_name);
  v.Int("min_replicas", &o.membership.min_replicas);
  v.Int("max_replicas", &o.membership.max_replicas);
  v.Duration("heartbeat_s", &o.membership.heartbeat);
  v.Duration("peer_timeout_s", &o.membership.peer_timeout);
  v.Duration("join_timeout_s", &o.membership.join_timeout);
  v.Duration("settle_s", &o.membership.settle);
  v.Duration("store_retry_s", &o.membership.store_retry);
  v.Str("backend", &o.backend);
  v.Str("host", &o.host);
  v.Int("device", &o.device);
  v.Duration("collective_timeout_s", &o.collective_timeout);
  v.Duration("init_timeout_s", &o.init_timeout);
}

}  // namespace omni_python
