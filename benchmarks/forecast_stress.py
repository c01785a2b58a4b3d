#!/usr/bin/python3
"""Forecast stress: the forecaster on step logs it was not tuned on.

Writes the 27 logs of tools/stress_steplogs.py (gradient accumulation,
thermal throttling, an eval period and a stall rhythm that change, 4 ms and
45 s steps, random sampling, an outlier and a suspension, Pareto compute,
three interleaved events, a log starting mid-job, a nested idle phase, a
stall after each eval, an eval whose length shifts, a host-side gap in every
step and rare checkpoints, a checkpoint that slows the steps after it,
dynamic micro-batches, an epoch's refill stall and metrics every 100 steps,
runs of steps not logged, data waits that shrink or grow, two loaders, an
eval every 312.5 steps, flagged warm-up steps, stalls a prefetch mostly
hides, a stall rhythm that restarts at each eval, saves of random length),
scores each with `omni eval --json` (live scoring) and prints a table and one
JSON line, `{"benchmark": "forecast_stress", ...}`. Exits 1 when any log's
window precision or next-step coverage falls below the confidence its
forecasts claimed, or `omni eval` fails on one.

Usage: /usr/bin/python3 benchmarks/forecast_stress.py [BUILD] [--out DIR] [--seed N]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import stress_steplogs  # noqa: E402


def score(omni, log):
    t0 = time.monotonic()
    p = subprocess.run([str(omni), "eval", str(log), "--json"], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-500:]}
    d = json.loads(p.stdout)
    r = {"precision": d["total"]["precision"], "recall": d["total"]["recall"],
         "claimed_confidence": d["claimed_confidence"],
         "next_step_coverage": d["next_step_coverage"],
         "next_step_slack_median": d["next_step_slack_median"],
         "regime_changes": d["regime_changes"], "eval_s": round(time.monotonic() - t0, 2),
         "by_kind": {k: {"precision": v["precision"], "recall": v["recall"]}
                     for k, v in d["by_kind"].items() if v.get("forecast_ms", 0) > 0}}
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default=str(REPO / "build"))
    ap.add_argument("--out", default=None, help="where the logs go (default BUILD/bench/stress)")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    build = pathlib.Path(a.build)
    omni = build / "bin" / "omni"
    out = pathlib.Path(a.out) if a.out else build / "bench" / "stress"
    t0 = time.monotonic()
    logs = stress_steplogs.write_all(str(out), a.seed)
    res, below_p, below_c, failed = {}, [], [], []

    def f(x):
        return "-" if x is None else f"{x:.3f}"
    print(f"{'log':24} {'precision':>9} {'recall':>7} {'claimed':>7} {'coverage':>8} "
          f"{'slack':>6} {'regimes':>7}")
    for log in logs:
        name = pathlib.Path(log).stem
        r = score(omni, log)
        res[name] = r
        if "error" in r:
            failed.append(name)
            print(f"{name:24} omni eval failed: {r['error']}")
            continue
        c = r["claimed_confidence"]
        # A log on which nothing was claimed has no precision (nothing false).
        if r["precision"] is not None and r["precision"] < c:
            below_p.append(name)
        if r["next_step_coverage"] is not None and r["next_step_coverage"] < c:
            below_c.append(name)
        print(f"{name:24} {f(r['precision']):>9} {f(r['recall']):>7} {f(c):>7} "
              f"{f(r['next_step_coverage']):>8} {f(r['next_step_slack_median']):>6} "
              f"{r['regime_changes']:>7}")
    line = {"benchmark": "forecast_stress", "seed": a.seed, "logs": len(logs),
            "precision_below_claim": below_p, "coverage_below_claim": below_c,
            "eval_failed": failed, "wall_s": round(time.monotonic() - t0, 1), "results": res}
    print(json.dumps(line), flush=True)
    return 1 if below_p or below_c or failed else 0


if __name__ == "__main__":
    sys.exit(main())
