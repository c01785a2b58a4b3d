#!/usr/bin/python3
"""Forecasts of events whose length varies at random: an eval or a save every
50 steps whose length is steady, alternating, lognormal (sigma 0.3, 0.5),
uniform, Pareto, or one of two modes by a coin's toss.

Writes, for each length distribution and each of three cases (an undeclared
eval, an undeclared save, a declared eval), `--draws` logs of 2000 steps of
~150 ms (tools/stress_steplogs.py's writer), scores each with `omni eval
--json` (live scoring) and prints a table and one JSON line,
`{"benchmark": "forecast_random_lengths", ...}`: per distribution, how many
logs had the event kind's precision below the confidence its forecasts
claimed (`kinds_below`), how many the whole log's (`logs_below`), and the
kind's least and mean precision and mean recall. No event-length rule from
two or three occurrences tells a coin from a steady event, so this is a
measurement, not a gate: it exits 1 only when `omni eval` fails.
docs/telemetry.md ("Events of random length") has its figures.

Usage: /usr/bin/python3 benchmarks/forecast_random_lengths.py [BUILD] [--out DIR]
           [--draws N] [--seed S]
"""
import argparse
import json
import math
import pathlib
import random
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from stress_steplogs import MS, Writer, header, ln, std_train  # noqa: E402

EVERY = 50
STEPS = 2000
MEDIAN = 400 * MS


def length(dist, occurrence, rng):
    """The idle length (ns) of the event's `occurrence`-th time."""
    if dist == "steady":
        return ln(rng, MEDIAN, 0.03)
    if dist == "alternating":  # a quick and a full one in turn: a real rhythm
        return ln(rng, (300 if occurrence % 2 else 900) * MS, 0.03)
    if dist == "lognormal_0.3":
        return ln(rng, MEDIAN, 0.3)
    if dist == "lognormal_0.5":
        return ln(rng, MEDIAN, 0.5)
    if dist == "uniform":
        return rng.uniform(0.5, 1.5) * MEDIAN
    if dist == "pareto":
        return 200 * MS * rng.paretovariate(2.5)
    if dist == "two_modes":  # a quick or a full one as a coin falls
        return ln(rng, (300 if rng.random() < 0.5 else 900) * MS, 0.03)
    raise ValueError(dist)


DISTS = ["steady", "alternating", "lognormal_0.3", "lognormal_0.5", "uniform", "pareto",
         "two_modes"]
CASES = [("eval", False), ("checkpoint", False), ("eval", True)]


def write(path, dist, kind, declared, rng):
    decl = (EVERY, EVERY - 1, MEDIAN) if declared else (0, 0, 0)
    hdr = header(f"forecast_random_lengths {dist} {kind}",
                 ckpt=decl if kind == "checkpoint" else (0, 0, 0),
                 ev=decl if kind == "eval" else (0, 0, 0))
    w = Writer(path, hdr, rng.randint(10 ** 12, 10 ** 13))
    for s in range(STEPS):
        segs = std_train(rng, 5 * MS, 0.3, 120 * MS)
        step_kind = "normal"
        if s % EVERY == EVERY - 1:
            idle = length(dist, s // EVERY, rng)
            if kind == "eval":  # a forward pass, then the idle part
                fwd = ln(rng, 100 * MS, 0.05)
                segs.append(("eval", fwd + idle, [("compute", fwd)]))
            else:
                segs.append(("checkpoint", idle))
            step_kind = kind
        w.step(s, segs, kind=step_kind)
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default=str(REPO / "build"))
    ap.add_argument("--out", default=None, help="where the logs go (default BUILD/bench/lengths)")
    ap.add_argument("--draws", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    build = pathlib.Path(a.build)
    omni = build / "bin" / "omni"
    out = pathlib.Path(a.out) if a.out else build / "bench" / "lengths"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results, failed = {}, []
    print(f"{'lengths':15} {'logs':>5} {'kinds below':>11} {'logs below':>10} "
          f"{'least p':>8} {'mean p':>7} {'mean r':>7}")
    for dist in DISTS:
        below_k = below_l = n = 0
        ps, rs = [], []
        for kind, declared in CASES:
            for d in range(a.draws):
                rng = random.Random(f"{a.seed}:{dist}:{kind}:{declared}:{d}")
                path = out / f"{dist}_{kind}_{'declared' if declared else 'learned'}_{d}.jsonl"
                write(str(path), dist, kind, declared, rng)
                p = subprocess.run([str(omni), "eval", str(path), "--json"],
                                   capture_output=True, text=True, timeout=300)
                if p.returncode != 0:
                    failed.append(path.name)
                    continue
                r = json.loads(p.stdout)
                claim = r["claimed_confidence"]
                k = r["by_kind"].get(kind, {})
                n += 1
                if k.get("precision") is not None:
                    ps.append(k["precision"])
                    below_k += k["precision"] < claim
                rs.append(k.get("recall") or 0.0)
                total = r["total"]["precision"]
                below_l += total is not None and total < claim
        row = {"logs": n, "kinds_below": below_k, "logs_below": below_l,
               "least_precision": round(min(ps), 4) if ps else None,
               "mean_precision": round(sum(ps) / len(ps), 4) if ps else None,
               "mean_recall": round(sum(rs) / len(rs), 4) if rs else None}
        results[dist] = row

        def f(x):
            return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"
        print(f"{dist:15} {n:5} {below_k:11} {below_l:10} {f(row['least_precision']):>8} "
              f"{f(row['mean_precision']):>7} {f(row['mean_recall']):>7}", flush=True)
    line = {"benchmark": "forecast_random_lengths", "draws": a.draws, "seed": a.seed,
            "cases": [f"{k} {'declared' if d else 'learned'}" for k, d in CASES],
            "eval_failed": failed, "wall_s": round(time.monotonic() - t0, 1),
            "results": results}
    print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
