#!/usr/bin/python3
"""Forecast seeds: the corpus's generators with seeds the forecaster never saw.

Each trace of tests/data that `omni_tracegen --scenario NAME` makes (the
commands in tests/data/README.md) is made again with N other seeds, scored
with `omni eval --json` (live scoring), and summarised per scenario: how many
logs had window precision or next-step coverage below the confidence their
forecasts claimed, the least of each, the median of the logs' next-step
slack medians, the mean recall, and the share of the
live notices' claims at a window's open that held (stated: 0.95). The corpus
files are one draw each; a rule tuned until they pass can still fail the next
draw (2026-12-03: window precision below the claim on 8 of 30 `heavy_stalls`
draws and 15 of 30 `bursty_stalls` draws, none of them in the corpus's own).

Prints a table, then one JSON line, `{"benchmark": "forecast_seeds", ...}`.
Exits 1 when a log cannot be made or scored, and with --gate-precision (the
ctest cli.forecast_seeds) when any log's window precision is below the
claim. Next-step coverage is reported, not gated: on fresh draws of short
heavy-tailed logs it falls short by less than one step now and then.

Usage: /usr/bin/python3 benchmarks/forecast_seeds.py [BUILD] [--seeds N] [--first-seed S]
           [--gate-precision]
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"omni_tracegen --scenario (\S+) --out \S+ --steps (\d+)")


def scenarios():
    """(name, steps) of every corpus trace omni_tracegen makes by scenario."""
    text = (REPO / "tests" / "data" / "README.md").read_text()
    seen = {}
    for name, steps in COMMAND.findall(text):
        seen.setdefault(name, int(steps))
    return sorted(seen.items())


def f(x):
    return "-" if x is None else f"{x:.3f}"


def run(cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default=str(REPO / "build"))
    ap.add_argument("--seeds", type=int, default=5, help="draws per scenario (default 5)")
    ap.add_argument("--first-seed", type=int, default=1001)
    ap.add_argument("--out", default=None, help="where the logs go (default BUILD/bench/seeds)")
    ap.add_argument("--gate-precision", action="store_true",
                    help="exit 1 when any log's window precision is below the claim")
    a = ap.parse_args()
    build = pathlib.Path(a.build)
    out = pathlib.Path(a.out) if a.out else build / "bench" / "seeds"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    by, below_p, below_c, failed = {}, [], [], []
    print(f"{'scenario':20} {'logs':>4} {'P<claim':>7} {'least P':>7} {'cov<claim':>9} "
          f"{'least cov':>9} {'slack':>6} {'recall':>6} {'notice held':>11}")
    for name, steps in scenarios():
        rows = []
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            log = out / f"{name}_{seed}.jsonl"
            g = run([build / "bin" / "omni_tracegen", "--scenario", name, "--out", log,
                     "--steps", steps, "--seed", seed])
            e = run([build / "bin" / "omni", "eval", log, "--json"]) if g.returncode == 0 else g
            if e.returncode != 0:
                failed.append(f"{name}@{seed}: {(e.stderr or e.stdout).strip()[-300:]}")
                continue
            d = json.loads(e.stdout)
            c = d["claimed_confidence"]
            p, cov = d["total"]["precision"], d["next_step_coverage"]
            low_p = p is not None and p < c  # nothing claimed: nothing false
            low_c = cov is not None and cov < c
            if low_p:
                below_p.append(f"{name}@{seed}")
            if low_c:
                below_c.append(f"{name}@{seed}")
            rows.append({"seed": seed, "precision": p, "recall": d["total"]["recall"],
                         "coverage": cov, "low_p": low_p, "low_c": low_c,
                         "slack": d["next_step_slack_median"],
                         "notice_claims": d["notices"]["first_claims"],
                         "notice_held": d["notices"]["first_claims_held"]})
        if not rows:
            continue
        ps = [r["precision"] for r in rows if r["precision"] is not None]
        covs = [r["coverage"] for r in rows if r["coverage"] is not None]
        claims = sum(r["notice_claims"] for r in rows)
        slacks = sorted(r["slack"] for r in rows if r["slack"] is not None)
        s = {"logs": len(rows),
             "precision_below_claim": sum(r["low_p"] for r in rows),
             "least_precision": min(ps) if ps else None,
             "coverage_below_claim": sum(r["low_c"] for r in rows),
             "least_coverage": min(covs) if covs else None,
             "median_slack": slacks[len(slacks) // 2] if slacks else None,
             "mean_recall": round(sum(r["recall"] for r in rows) / len(rows), 4),
             "notice_first_claims_held": round(sum(r["notice_held"] for r in rows) / claims, 4)
             if claims else None}
        by[name] = s
        print(f"{name:20} {s['logs']:>4} {s['precision_below_claim']:>7} "
              f"{f(s['least_precision']):>7} {s['coverage_below_claim']:>9} "
              f"{f(s['least_coverage']):>9} {f(s['median_slack']):>6} {f(s['mean_recall']):>6} "
              f"{f(s['notice_first_claims_held']):>11}", flush=True)
    logs = sum(s["logs"] for s in by.values())
    line = {"benchmark": "forecast_seeds", "seeds": a.seeds, "first_seed": a.first_seed,
            "logs": logs, "precision_below_claim": below_p, "coverage_below_claim": below_c,
            "failed": failed, "wall_s": round(time.monotonic() - t0, 1), "by_scenario": by}
    print(json.dumps(line), flush=True)
    return 1 if failed or logs == 0 or (a.gate_precision and below_p) else 0


if __name__ == "__main__":
    sys.exit(main())
