#!/usr/bin/env bash
# make demo: train the example multimodal model for a few hundred steps with
# telemetry and forecasting on, then show what the runtime measured; then
# co-location: a best-effort guest in the idle windows of a 2-replica job.
set -euo pipefail
BUILD="${1:-build}"
OUT="$BUILD/demo"
mkdir -p "$OUT"
# 1000 steps: 25 evals (declared: eval every 40). The training data streams in
# shards of 10 batches, each fetched from (modelled) remote storage in ~60 ms
# (+-5%): the first batch of a shard waits for its fetch, a data stall every
# 10th step, which the forecaster learns from the log (no one declares it). A
# few video clips in the batches cost a random extra decode (--stall-scale
# 0.1): those stalls no forecast made at a step boundary can claim.
echo "== omni_train: 1000 steps, multimodal model, data in shards of 10 batches, eval every 40 steps =="
"$BUILD/bin/omni_train" --steps 1000 --seed 1 --eval-every 40 --shard-batches 10 --shard-fetch-ms 60 --stall-scale 0.1 \
  --log "$OUT/steps.jsonl" --trace "$OUT/trace.json" --forecast "$OUT/forecast.json"
echo
echo "== the forecast the runtime made one step before the last eval (omni forecast --at-step 998) =="
"$BUILD/bin/omni" forecast "$OUT/steps.jsonl" --at-step 998
echo "== forecast quality, replayed on this run's step log (omni eval) =="
echo "   (a window counts from the moment it opens for its guaranteed length, as a guest"
echo "    acting on the window-open notice uses it; the shard fetches are every 10th step,"
echo "    the evals every 40th; the video-clip stalls are random and not claimable;"
echo "    then the live notices a guest reading them every 0.5 ms was given, and the two together)"
"$BUILD/bin/omni" eval "$OUT/steps.jsonl"
echo
echo "== the last 60 steps as a picture: real idle time against forecast windows (omni plot) =="
"$BUILD/bin/omni" plot "$OUT/steps.jsonl" --from-step 940 --out "$OUT/timeline.svg"
echo
echo "== co-location: the critical job (2 elastic replicas) and a best-effort guest in its idle windows =="
/usr/bin/python3 scripts/colocate_demo.py "$BUILD"
echo
echo "Files written:"
echo "  step log (JSON Lines):      $OUT/steps.jsonl"
echo "  timeline (ui.perfetto.dev): $OUT/trace.json"
echo "  latest forecast (JSON):     $OUT/forecast.json"
echo "  idle timeline (SVG):        $OUT/timeline.svg"
echo "  co-location timeline (SVG): $OUT/colocation/timeline.svg"
echo "  co-location trace:          $OUT/colocation/trace.json"
