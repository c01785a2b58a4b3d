#!/usr/bin/python3
"""Seeded generator of step logs (omni.steplog v1) for stress-testing the
step-time / idle-window forecaster (`omni eval`).

Usage: /usr/bin/python3 tools/stress_steplogs.py OUTDIR [--seed N]
benchmarks/forecast_stress.py writes them and scores each with `omni eval`
(make bench; the ctest cli.forecast_stress). Written on 2026-12-02 as a
generalisation check: behaviours the corpus in tests/data lacks. Two of its
findings are regression traces there (rhythm_change, events_on_rhythm).

Every log: a header line (omni_tracegen-style phase table and declared
events), then one `step` line per logged step, CLOCK_MONOTONIC nanoseconds
starting at a large value, spans in start order, nested spans inside their
parent (depth 1), step numbers strictly increasing, a ~50 us host-side gap
between steps. Noise is lognormal per phase unless stated. Each scenario is
deterministic for (seed, scenario name).

Scenarios (none of them is in tests/data):
  01_grad_accum        4 micro-steps per optimizer step, each logged as a
                       step. Every micro-step: data wait ~2 ms, fwd+bwd 80 ms,
                       FSDP reduce-scatter ~14 ms, tiny grad-scaler op 1 ms.
                       Every 4th (step % 4 == 3, the optimizer step): an
                       uncovered ~4 ms host gap (grad-norm .item() sync,
                       unscale) then comm+optimizer ~30% longer. 2000 steps.
  02_thermal           compute 200 ms * (1 + 0.15 sin(2 pi s / 150)) (+1.5%
                       noise): a throttling GPU; data stall ~5 ms. 2000 steps.
  03_eval_period_change  eval every 50 steps for the first 1000 steps (steps
                       49, 99, ..., 999), then every 30 (1029, 1059, ...),
                       undeclared. 600 ms eval w/ nested 150 ms forward.
                       2000 steps.
  04_stall_rhythm_change  a ~300 ms data stall every 3rd step for steps
                       0..749, then every 5th step (754, 759, ...); else
                       ~4 ms; compute 500 ms. 1500 steps.
  05_tiny_steps        ~4 ms steps (0.3 ms Gaussian jitter on compute), 1 ms
                       data wait, 20 us gaps. 3000 steps.
  06_long_steps        ~45 s steps (compute 40 s), checkpoint every 20 steps
                       (offset 19) ~90 s +-5%, undeclared. 300 steps
                       (horizon 300 s covers only ~6 steps).
  07_irregular_sampled  a 10000-step job with a ~250 ms stall every 4th step
                       (offset 3), 300 ms compute; a random 30% of the steps
                       are logged (Bernoulli, not a stride). ~3000 lines.
  08_outlier_pause     steady 105 ms steps; step 500 takes 100x (a 10 s NCCL
                       retry inside comm, busy); between steps 750 and 751
                       the job is suspended for 2 s (uncovered gap). 1000
                       steps.
  09_pareto_compute    compute = 120 ms + 30 ms * (Pareto(alpha 1.5) - 1):
                       variable-length packed sequences, infinite variance;
                       data wait ~6 ms. 1500 steps.
  10_three_events      data stall ~200 ms every 7th step (offset 6), eval
                       every 64 (offset 63, ~800 ms with 250 ms forward),
                       checkpoint every 100 (offset 99, ~1.5 s); only the
                       eval is declared (step 1599 has eval+checkpoint,
                       several have stall+event). 2000 steps.
  11_mid_job_start     log starts at step 123456, monotonic clock ~100 days
                       in. The first 30 steps are warm-up ("warmup": true):
                       a 35 s first step (graph compile), recompiles of
                       3-12 s at a few steps, autotuning makes the rest ~1.5x
                       slower. Declared eval every 100 (offset 99 in absolute
                       step numbers: 123499, ...), ~1 s. 800 steps.
  12_nested_eval       two-level idle: eval every 25th step (offset 24,
                       declared): eval phase containing forward pass A
                       (busy, 120 ms), scoring (eval idle, 100 ms), a nested
                       `metric_upload` phase (user phase 8, idle host_side,
                       ~60 ms, registered by a `phase` line), forward pass B
                       (busy, 80 ms), then eval idle ~40 ms. 1000 steps.
  13_stall_after_eval  a loader made again after each eval (a DataLoader
                       without persistent workers): declared eval every 50
                       (offset 49, ~800 ms with a 200 ms forward); the step
                       after each eval opens with a ~450 ms data stall, the
                       others with ~5 ms: a stall in 2% of the steps.
                       1500 steps. (Added 2026-12-03: no period was found
                       for it while the period learner clipped the top 2%.)
  14_eval_length_shift  an undeclared eval every 40 steps (offset 39):
                       150 ms forward, then ~200 ms of idle scoring for
                       evals 1-6, ~350 ms for evals 7-14 (longer generated
                       answers), ~150 ms from then on; training steps
                       unchanged. 1200 steps. (Added 2026-12-03: the
                       lengths of an ended level stayed in the eval's
                       sample.)
  15_host_gap_events   a host-side gap between compute and comm in every
                       step (~3 ms, lognormal sigma 0.8: one in ten below
                       the 1 ms min_window, so not logged as a window) and
                       an undeclared ~2.5 s checkpoint every 200 steps
                       (offset 199). 1500 steps. (Added 2026-12-04: the
                       gap was claimed at each checkpoint step from its
                       few lengths there, and missed when it was short.)
  16_slow_after_checkpoint  a checkpoint declared without a length every
                       100 steps (offset 99, ~80 ms) whose write slows the
                       next 5 steps' compute by half. 2000 steps. (Added
                       2026-12-04: the checkpoint was never learned.)
  17_dynamic_micro_batches  2-5 micro-batches per step (dynamic batching),
                       each a ~15 ms data wait (sigma 0.3) and 30 ms of
                       compute, then comm and optimizer: the number of
                       data-stall windows varies from step to step.
                       1500 steps.
  18_epoch_and_metrics  a ~2 ms data wait, 350 ms every 250 steps (a loader
                       refilling its shuffle buffer at an epoch's end), and
                       a host phase of 1.5 ms, 40 ms every 100 steps
                       (metrics written): periods beyond the residue
                       classes' 64. 3000 steps. (Added 2026-12-04: neither
                       was forecast; recall 0.28, now 0.60.)
Added 2026-12-05 (a second stress test; 19 found a defect, fixed):
  19_dropped_runs      a ~80 ms stall every 3rd step and an undeclared
                       ~500 ms eval every 200 (offset 199); steps
                       1370-1429 and 2180-2204 not logged (a telemetry ring
                       that overflowed), each hiding an eval. 3000 steps.
                       (The eval rule was dropped after each hidden eval
                       for 400 steps: eval recall 0.52, now 0.77.)
  20_shrinking_stalls  a data wait of ~60 ms shrinking to ~15 ms over the
                       run (a page cache warming up), sigma 0.1. 3000 steps.
  21_growing_stalls    a data wait of ~5 ms growing to ~50 ms (storage that
                       degrades). 3000 steps.
  22_two_loaders       two data waits per step (two loaders): ~6 ms before
                       the first half of the compute, and ~40 ms before the
                       second half on every other step. 3000 steps.
  23_fractional_eval   an undeclared eval every 312.5 steps (every 10,000
                       samples at batch 32): spacings of 312 and 313 in
                       turn, which no spacing rule of one step count
                       explains (a fractional rule, 625/2, does). 4000
                       steps.
  24_warmup_flagged    20 warm-up steps flagged by the runtime (the first
                       30x, the others 3x the compute), a declared eval
                       every 50 (offset 49). 1500 steps.
  25_prefetch_hidden   a loader whose fetch (~110 ms, sigma 0.2) overlaps
                       the previous step's compute (~100 ms, sigma 0.3): the
                       stall is what is left, often nothing, at random
                       (nothing to claim). 3000 steps.
  26_stalls_after_eval  a ~120 ms stall every 4th step counted from the
                       last eval (a loader made again after it), an
                       undeclared eval every 150 steps: the stalls' phase
                       moves by 2 steps at each eval (a spike rule that
                       restarts at each eval claims it).
                       3000 steps.
Added 2026-12-06 (events of random length; found two defects, fixed):
  27_variable_saves    an undeclared save every 50 steps whose length is
                       lognormal (median 400 ms, sigma 0.5: shared storage
                       under other jobs' load). 2000 steps. (A rhythm of
                       lengths that noise bought and a rise of two lengths
                       close by chance were claimed: on 12 draws, save
                       precision below the claim on 4, the log's on 3;
                       now 1 and 0.)
"""
import argparse
import json
import math
import os
import random
import sys

PHASES = [
    {"id": 0, "idle": "data_stall", "name": "data_wait"},
    {"id": 1, "idle": "busy", "name": "compute"},
    {"id": 2, "idle": "busy", "name": "comm"},
    {"id": 3, "idle": "busy", "name": "optimizer"},
    {"id": 4, "idle": "checkpoint", "name": "checkpoint"},
    {"id": 5, "idle": "eval", "name": "eval"},
    {"id": 6, "idle": "pipeline_bubble", "name": "pipeline_bubble"},
    {"id": 7, "idle": "host_side", "name": "host"},
]

MS = 1_000_000
S = 1_000_000_000


def header(source, ckpt=(0, 0, 0), ev=(0, 0, 0)):
    """ckpt / ev: (every_steps, offset, expected_ns)."""
    return {
        "clock": "CLOCK_MONOTONIC",
        "events": {
            "checkpoint": {"every_steps": ckpt[0], "expected_ns": ckpt[2], "offset": ckpt[1]},
            "eval": {"every_steps": ev[0], "expected_ns": ev[2], "offset": ev[1]},
            "pipeline": {"backward_over_forward": 2.0, "micro_batches": 1, "stage": 0, "stages": 1},
        },
        "phases": PHASES,
        "schema": "omni.steplog",
        "source": "stress_steplogs.py " + source,
        "type": "header",
        "version": 1,
    }


def ln(rng, median, sigma):
    """lognormal with the given median (ns or ms, whatever the caller uses)."""
    return median * math.exp(rng.gauss(0.0, sigma))


class Writer:
    def __init__(self, path, hdr, t0):
        self.f = open(path, "w")
        self.f.write(json.dumps(hdr, separators=(",", ":")) + "\n")
        self.t = int(t0)
        self.last_step = None
        self.n = 0

    def gap(self, ns):
        self.t += int(ns)

    def step(self, num, segs, kind="normal", warmup=False, log=True, gap_ns=50_000):
        """segs: list of top-level segments, each
             (phase_or_None, dur_ns)            a phase (None: uncovered time)
             (phase, dur_ns, children)          children: list of
                 (phase_or_None, dur_ns) laid out back to back from the
                 parent's start; None = the parent's own time.
        The step starts at self.t; returns the step's end. log=False
        advances the clock without writing (unlogged steps of a sampled log).
        """
        assert self.last_step is None or num > self.last_step
        start = self.t
        t = start
        spans = []
        for seg in segs:
            ph, d = seg[0], int(round(seg[1]))
            assert d > 0
            if ph is not None:
                sp = {"phase": ph, "start_ns": t, "end_ns": t + d, "depth": 0}
                spans.append(sp)
                if len(seg) > 2:
                    c = t
                    for cph, cd in seg[2]:
                        cd = int(round(cd))
                        if cph is not None:
                            spans.append({"phase": cph, "start_ns": c, "end_ns": c + cd, "depth": 1})
                        c += cd
                    assert c <= t + d, (num, seg)
            t += d
        end = t
        if log:
            rec = {"type": "step", "step": num, "start_ns": start, "end_ns": end,
                   "kind": kind, "warmup": warmup, "spans": spans}
            self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            self.last_step = num
            self.n += 1
        self.t = end + int(gap_ns)
        return end

    def raw(self, obj):
        self.f.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def close(self):
        self.f.close()


def eval_seg(rng, total_med, fwd_med, sigma=0.05):
    total = ln(rng, total_med, sigma)
    fwd = min(ln(rng, fwd_med, sigma), total * 0.8)
    return ("eval", total, [("compute", fwd)])


def std_train(rng, data_med, data_sig, comp_med, comp_sig=0.02, comm_med=15 * MS, opt_med=8 * MS):
    return [("data_wait", ln(rng, data_med, data_sig)),
            ("compute", ln(rng, comp_med, comp_sig)),
            ("comm", ln(rng, comm_med, 0.05)),
            ("optimizer", ln(rng, opt_med, 0.04))]


# ---------------------------------------------------------------- scenarios

def s01_grad_accum(w, rng):
    for s in range(2000):
        segs = [("data_wait", ln(rng, 2 * MS, 0.2)), ("compute", ln(rng, 80 * MS, 0.02))]
        if s % 4 == 3:
            segs.append((None, ln(rng, 4 * MS, 0.15)))           # host sync gap
            segs.append(("comm", ln(rng, 14 * MS * 1.3, 0.05)))
            segs.append(("optimizer", ln(rng, 9 * MS, 0.04)))     # (14+1)*1.3 ~ 19.5 -> 27
        else:
            segs.append(("comm", ln(rng, 14 * MS, 0.05)))
            segs.append(("optimizer", ln(rng, 1 * MS, 0.05)))
        w.step(s, segs, gap_ns=ln(rng, 50_000, 0.2))


def s02_thermal(w, rng):
    for s in range(2000):
        f = 1 + 0.15 * math.sin(2 * math.pi * s / 150.0)
        segs = std_train(rng, 5 * MS, 0.2, 200 * MS * f, 0.015)
        w.step(s, segs)


def s03_eval_period_change(w, rng):
    for s in range(2000):
        segs = std_train(rng, 8 * MS, 0.25, 150 * MS)
        is_eval = (s < 1000 and s % 50 == 49) or (s >= 1000 and (s - 1000) % 30 == 29)
        kind = "normal"
        if is_eval:
            segs.append(eval_seg(rng, 600 * MS, 150 * MS))
            kind = "eval"
        w.step(s, segs, kind=kind)


def s04_stall_rhythm_change(w, rng, n=1500, change=750):
    for s in range(n):
        stall = (s < change and s % 3 == 2) or (s >= change and s % 5 == 4)
        d = ln(rng, 300 * MS, 0.08) if stall else ln(rng, 4 * MS, 0.25)
        segs = [("data_wait", d), ("compute", ln(rng, 500 * MS, 0.02)),
                ("comm", ln(rng, 20 * MS, 0.05)), ("optimizer", ln(rng, 10 * MS, 0.04))]
        w.step(s, segs)


def s05_tiny_steps(w, rng):
    for s in range(3000):
        comp = max(1.0 * MS, rng.gauss(2.2 * MS, 0.3 * MS))
        segs = [("data_wait", ln(rng, 1 * MS, 0.1)), ("compute", comp),
                ("comm", ln(rng, 0.5 * MS, 0.05)), ("optimizer", ln(rng, 0.3 * MS, 0.05))]
        w.step(s, segs, gap_ns=ln(rng, 20_000, 0.2))


def s06_long_steps(w, rng):
    for s in range(300):
        segs = [("data_wait", ln(rng, 0.5 * S, 0.2)), ("compute", ln(rng, 40 * S, 0.02)),
                ("comm", ln(rng, 3.5 * S, 0.05)), ("optimizer", ln(rng, 1 * S, 0.04))]
        kind = "normal"
        if s % 20 == 19:
            segs.append(("checkpoint", ln(rng, 90 * S, 0.05)))
            kind = "checkpoint"
        w.step(s, segs, kind=kind, gap_ns=ln(rng, 200_000, 0.2))


def s07_irregular_sampled(w, rng):
    for s in range(10000):
        d = ln(rng, 250 * MS, 0.08) if s % 4 == 3 else ln(rng, 5 * MS, 0.25)
        segs = [("data_wait", d), ("compute", ln(rng, 300 * MS, 0.02)),
                ("comm", ln(rng, 15 * MS, 0.05)), ("optimizer", ln(rng, 8 * MS, 0.04))]
        w.step(s, segs, log=rng.random() < 0.3)


def s08_outlier_pause(w, rng):
    for s in range(1000):
        segs = std_train(rng, 5 * MS, 0.2, 80 * MS)
        if s == 500:   # 100x: an NCCL timeout/retry inside the allreduce
            segs[2] = ("comm", 100 * 105 * MS - 90 * MS)
        w.step(s, segs)
        if s == 750:
            w.gap(2 * S)  # SIGSTOP / preemption-suspend for 2 s


def s09_pareto_compute(w, rng):
    for s in range(1500):
        comp = 120 * MS + 30 * MS * (rng.paretovariate(1.5) - 1.0)
        segs = [("data_wait", ln(rng, 6 * MS, 0.2)), ("compute", comp),
                ("comm", ln(rng, 15 * MS, 0.05)), ("optimizer", ln(rng, 8 * MS, 0.04))]
        w.step(s, segs)


def s10_three_events(w, rng, n=2000):
    for s in range(n):
        d = ln(rng, 200 * MS, 0.08) if s % 7 == 6 else ln(rng, 5 * MS, 0.25)
        segs = [("data_wait", d), ("compute", ln(rng, 250 * MS, 0.02)),
                ("comm", ln(rng, 15 * MS, 0.05)), ("optimizer", ln(rng, 8 * MS, 0.04))]
        kind = "normal"
        if s % 64 == 63:
            segs.append(eval_seg(rng, 800 * MS, 250 * MS))
            kind = "eval"
        if s % 100 == 99:
            segs.append(("checkpoint", ln(rng, 1.5 * S, 0.06)))
            kind = "checkpoint"
        w.step(s, segs, kind=kind)


def s11_mid_job_start(w, rng):
    first = 123456
    recompiles = {first + 4, first + 9, first + 17, first + 23}
    for i in range(800):
        s = first + i
        warm = i < 30
        slow = 1.5 if warm else 1.0
        segs = std_train(rng, 10 * MS, 0.25, 180 * MS * slow)
        if i == 0:
            segs[1] = ("compute", ln(rng, 35 * S, 0.05))        # torch.compile
        elif s in recompiles:
            segs[1] = ("compute", rng.uniform(3, 12) * S)       # dynamic-shape recompile
        kind = "normal"
        if s % 100 == 99:
            segs.append(eval_seg(rng, 1 * S, 300 * MS))
            kind = "eval"
        w.step(s, segs, kind=kind, warmup=warm)


def s12_nested_eval(w, rng):
    w.raw({"type": "phase", "id": 8, "name": "metric_upload", "idle": "host_side"})
    for s in range(1000):
        segs = std_train(rng, 6 * MS, 0.2, 160 * MS)
        kind = "normal"
        if s % 25 == 24:
            fa = ln(rng, 120 * MS, 0.03)
            sc = ln(rng, 100 * MS, 0.05)
            up = ln(rng, 60 * MS, 0.15)
            fb = ln(rng, 80 * MS, 0.03)
            tail = ln(rng, 40 * MS, 0.08)
            segs.append(("eval", fa + sc + up + fb + tail,
                         [("compute", fa), (None, sc), ("metric_upload", up), ("compute", fb)]))
            kind = "eval"
        w.step(s, segs, kind=kind)


def s13_stall_after_eval(w, rng):
    for s in range(1500):
        segs = std_train(rng, 5 * MS, 0.3, 150 * MS)
        if s > 0 and s % 50 == 0:
            segs[0] = ("data_wait", ln(rng, 450 * MS, 0.05))
        kind = "normal"
        if s % 50 == 49:
            segs.append(eval_seg(rng, 800 * MS, 200 * MS))
            kind = "eval"
        w.step(s, segs, kind=kind)


def s14_eval_length_shift(w, rng):
    for s in range(1200):
        segs = std_train(rng, 6 * MS, 0.25, 180 * MS)
        kind = "normal"
        if s % 40 == 39:
            n = s // 40 + 1
            fwd = ln(rng, 150 * MS, 0.03)
            idle = ln(rng, (200 if n <= 6 else 350 if n <= 14 else 150) * MS, 0.04)
            segs.append(("eval", fwd + idle, [("compute", fwd)]))
            kind = "eval"
        w.step(s, segs, kind=kind)


def s15_host_gap_events(w, rng):
    for s in range(1500):
        segs = std_train(rng, 5 * MS, 0.5, 90 * MS)
        segs.insert(2, (None, ln(rng, 3 * MS, 0.8)))   # uncovered host time
        kind = "normal"
        if s % 200 == 199:
            kind = "checkpoint"
            segs.append(("checkpoint", ln(rng, 2500 * MS, 0.15)))
        w.step(s, segs, kind=kind, gap_ns=ln(rng, 200_000, 1.0))


def s16_slow_after_checkpoint(w, rng):
    slow = 0
    for s in range(2000):
        segs = std_train(rng, 8 * MS, 0.3, 100 * MS * (1.5 if slow > 0 else 1.0))
        slow = max(slow - 1, 0)
        kind = "normal"
        if s % 100 == 99:
            kind = "checkpoint"
            segs.append(("checkpoint", ln(rng, 80 * MS, 0.1)))
            slow = 5
        w.step(s, segs, kind=kind)


def s17_dynamic_micro_batches(w, rng):
    for s in range(1500):
        segs = []
        for _ in range(rng.choice([2, 3, 3, 4, 5])):
            segs += [("data_wait", ln(rng, 15 * MS, 0.3)), ("compute", ln(rng, 30 * MS, 0.05))]
        segs += [("comm", ln(rng, 10 * MS, 0.05)), ("optimizer", ln(rng, 4 * MS, 0.05))]
        w.step(s, segs)


def s18_epoch_and_metrics(w, rng):
    # A loader refilling its shuffle buffer at each epoch's end (every 250
    # steps) and metrics written every 100 steps: periods beyond the residue
    # classes' 64, learned as spike rules.
    for s in range(3000):
        segs = std_train(rng, 2 * MS, 0.3, 80 * MS)
        if s % 250 == 249:
            segs[0] = ("data_wait", ln(rng, 350 * MS, 0.08))
        segs.append(("host", ln(rng, 40 * MS, 0.1) if s % 100 == 37 else ln(rng, 1.5 * MS, 0.2)))
        w.step(s, segs)


def s19_dropped_runs(w, rng):
    for s in range(3000):
        segs = std_train(rng, 5 * MS, 0.2, 100 * MS)
        kind = "normal"
        if s % 3 == 0:
            segs[0] = ("data_wait", ln(rng, 80 * MS, 0.1))
        if s % 200 == 199:
            segs.append(eval_seg(rng, 500 * MS, 100 * MS))
            kind = "eval"
        w.step(s, segs, kind=kind, log=not (1370 <= s < 1430 or 2180 <= s < 2205))


def s20_shrinking_stalls(w, rng):
    for s in range(3000):
        w.step(s, std_train(rng, (60 - 45 * s / 3000) * MS, 0.1, 100 * MS))


def s21_growing_stalls(w, rng):
    for s in range(3000):
        w.step(s, std_train(rng, (5 + 45 * s / 3000) * MS, 0.1, 100 * MS))


def s22_two_loaders(w, rng):
    for s in range(3000):
        segs = [("data_wait", ln(rng, 6 * MS, 0.2)), ("compute", ln(rng, 60 * MS, 0.02))]
        if s % 2 == 1:
            segs.append(("data_wait", ln(rng, 40 * MS, 0.15)))
        segs += [("compute", ln(rng, 60 * MS, 0.02)), ("comm", ln(rng, 10 * MS, 0.05))]
        w.step(s, segs)


def s23_fractional_eval(w, rng):
    due = 312.5
    for s in range(4000):
        segs = std_train(rng, 5 * MS, 0.2, 100 * MS)
        kind = "normal"
        if s + 1 >= due:
            due += 312.5
            segs.append(eval_seg(rng, 700 * MS, 200 * MS))
            kind = "eval"
        w.step(s, segs, kind=kind)


def s24_warmup_flagged(w, rng):
    for s in range(1500):
        segs = std_train(rng, 10 * MS, 0.2, 100 * MS)
        if s < 20:
            segs[1] = ("compute", ln(rng, 100 * MS * (30 if s == 0 else 3), 0.1))
        kind = "normal"
        if s % 50 == 49:
            segs.append(eval_seg(rng, 400 * MS, 100 * MS))
            kind = "eval"
        w.step(s, segs, kind=kind, warmup=s < 20)


def s25_prefetch_hidden(w, rng):
    prev = 100 * MS
    for s in range(3000):
        comp = ln(rng, 100 * MS, 0.3)
        stall = max(0.5 * MS, ln(rng, 110 * MS, 0.2) - prev)
        w.step(s, [("data_wait", stall), ("compute", comp), ("comm", ln(rng, 10 * MS, 0.05))])
        prev = comp


def s26_stalls_after_eval(w, rng):
    since = 0
    for s in range(3000):
        segs = std_train(rng, 4 * MS, 0.2, 90 * MS)
        kind = "normal"
        if since % 4 == 3:
            segs[0] = ("data_wait", ln(rng, 120 * MS, 0.1))
        since += 1
        if s % 150 == 149:
            segs.append(eval_seg(rng, 400 * MS, 80 * MS))
            kind = "eval"
            since = 0
        w.step(s, segs, kind=kind)


def s27_variable_saves(w, rng):
    for s in range(2000):
        segs = std_train(rng, 5 * MS, 0.3, 120 * MS)
        kind = "normal"
        if s % 50 == 49:
            segs.append(("checkpoint", ln(rng, 400 * MS, 0.5)))
            kind = "checkpoint"
        w.step(s, segs, kind=kind)


SCENARIOS = [
    ("01_grad_accum", s01_grad_accum, {}),
    ("02_thermal", s02_thermal, {}),
    ("03_eval_period_change", s03_eval_period_change, {}),
    ("04_stall_rhythm_change", s04_stall_rhythm_change, {}),
    ("05_tiny_steps", s05_tiny_steps, {}),
    ("06_long_steps", s06_long_steps, {}),
    ("07_irregular_sampled", s07_irregular_sampled, {}),
    ("08_outlier_pause", s08_outlier_pause, {}),
    ("09_pareto_compute", s09_pareto_compute, {}),
    ("10_three_events", s10_three_events, {"ev": (64, 63, 800 * MS)}),
    ("11_mid_job_start", s11_mid_job_start, {"ev": (100, 99, 1 * S), "t0": 8_640_000 * S}),
    ("12_nested_eval", s12_nested_eval, {"ev": (25, 24, 400 * MS)}),
    ("13_stall_after_eval", s13_stall_after_eval, {"ev": (50, 49, 0)}),
    ("14_eval_length_shift", s14_eval_length_shift, {}),
    ("15_host_gap_events", s15_host_gap_events, {}),
    ("16_slow_after_checkpoint", s16_slow_after_checkpoint, {"ck": (100, 99, 0)}),
    ("17_dynamic_micro_batches", s17_dynamic_micro_batches, {}),
    ("18_epoch_and_metrics", s18_epoch_and_metrics, {}),
    ("19_dropped_runs", s19_dropped_runs, {}),
    ("20_shrinking_stalls", s20_shrinking_stalls, {}),
    ("21_growing_stalls", s21_growing_stalls, {}),
    ("22_two_loaders", s22_two_loaders, {}),
    ("23_fractional_eval", s23_fractional_eval, {}),
    ("24_warmup_flagged", s24_warmup_flagged, {"ev": (50, 49, 0)}),
    ("25_prefetch_hidden", s25_prefetch_hidden, {}),
    ("26_stalls_after_eval", s26_stalls_after_eval, {}),
    ("27_variable_saves", s27_variable_saves, {}),
]


def write_all(out, seed=1234):
    """Writes every scenario to OUTDIR/<name>.jsonl; returns the paths."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for name, fn, opt in SCENARIOS:
        rng = random.Random(f"{seed}:{name}")
        t0 = opt.get("t0", rng.randint(10 ** 12, 10 ** 13))   # ~17 min .. 3 h of uptime
        hdr = header(name, ckpt=opt.get("ck", (0, 0, 0)), ev=opt.get("ev", (0, 0, 0)))
        path = os.path.join(out, name + ".jsonl")
        w = Writer(path, hdr, t0)
        fn(w, rng)
        w.close()
        paths.append(path)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory for the logs")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    for p in write_all(a.out, a.seed):
        print(p)


if __name__ == "__main__":
    main()
