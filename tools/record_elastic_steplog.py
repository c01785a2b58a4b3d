#!/usr/bin/python3
"""Records the step log of an elastic omni_train job that loses a replica and
gets a new one, for the forecast corpus (tests/data/elastic_replica_lost.jsonl;
see tests/data/README.md). Not an example to copy: the kill is the point.

    /usr/bin/python3 tools/record_elastic_steplog.py --build build \\
        --out tests/data/elastic_replica_lost.jsonl

Two replicas (r0, r1) train over a file store with job-level checkpoints;
when r0 has logged --kill-at steps, r1 is killed (SIGKILL, mid-step); when
r0 has logged --join-at steps, a new replica (r1b) joins. r0's step log is
written to --out: its steps hold the failed collective and its redo, the
survivor's steps alone (twice the compute, no reduction), the join, and a
declared eval every 25 steps and save every 100 throughout.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time


def logged_steps(path: pathlib.Path) -> int:
    try:
        with open(path, "rb") as f:
            return max(0, sum(1 for _ in f) - 1)  # less the header
    except FileNotFoundError:
        return 0


def wait_for(path: pathlib.Path, steps: int, procs) -> None:
    while logged_steps(path) < steps:
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                sys.exit(f"a replica exited with {p.returncode} before step {steps}")
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--kill-at", type=int, default=250)
    ap.add_argument("--join-at", type=int, default=350)
    args = ap.parse_args()
    if not 0 < args.kill_at < args.join_at < args.steps:
        sys.exit("need 0 < --kill-at < --join-at < --steps")
    train = pathlib.Path(args.build) / "bin" / "omni_train"
    out = pathlib.Path(args.out).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        flags = [str(train), "--steps", str(args.steps), "--seed", "3", "--batch", "8",
                 "--eval-every", "25", "--ckpt-dir", str(tmp / "ckpt"), "--ckpt-every", "100",
                 "--stall-io", "--max-replicas", "2", "--heartbeat-ms", "50",
                 "--peer-timeout-ms", "600", "--quiet", "--store", f"file://{tmp / 'store'}"]

        def start(rid: str, log: pathlib.Path) -> subprocess.Popen:
            with open(tmp / f"{rid}.out", "wb") as o:
                return subprocess.Popen(flags + ["--replica-id", rid, "--log", str(log)],
                                        stdout=o, stderr=subprocess.STDOUT)

        r0 = start("r0", out)
        r1 = start("r1", tmp / "r1.jsonl")
        wait_for(out, args.kill_at, [r0, r1])
        r1.kill()
        r1.wait()
        wait_for(out, args.join_at, [r0])
        r1b = start("r1b", tmp / "r1b.jsonl")
        codes = [r0.wait(), r1b.wait()]
        if codes != [0, 0]:
            sys.stderr.write((tmp / "r0.out").read_text() + (tmp / "r1b.out").read_text())
            sys.exit(f"r0 and r1b exited with {codes}")
    print(f"wrote {out} ({logged_steps(out)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
