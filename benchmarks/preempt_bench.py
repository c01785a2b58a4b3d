"""Preemption benchmark (make bench): real omni_train processes and signals.

preempt_overhead_ms: time from the signal to the exit of a process that saved
  a durable checkpoint, minus the save time the process reports. Escalated
  preemption (two signals: save at the next boundary), so the figure is the
  machinery's cost: finishing the current step, releasing the loader thread,
  telemetry and checkpoint writer, and exiting.
deadline_misses: over repeated trials with a grace period, runs that exited
  after the deadline or without a checkpoint (goal 0). With one signal the job
  keeps training until the last boundary from which a save still fits.

Usage: /usr/bin/python3 benchmarks/preempt_bench.py BUILD_DIR
"""

import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build")
TRAINER = BUILD / "bin" / "omni_train"
SAVE_RE = re.compile(r"in ([0-9.]+) ms; exiting 75")


def start(tmp, grace_s):
    log = pathlib.Path(tmp) / "loss.log"
    env = dict(os.environ, OMNI_PREEMPT_GRACE_S=str(grace_s))
    proc = subprocess.Popen(
        [str(TRAINER), "--steps", "100000", "--quiet", "--eval-every", "0", "--ckpt-dir",
         str(pathlib.Path(tmp) / "ckpt"), "--loss-log", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= 30:
            return proc
        time.sleep(0.005)
    proc.kill()
    raise SystemExit("omni_train did not start training")


def main():
    overheads = []
    for _ in range(8):
        with tempfile.TemporaryDirectory() as tmp:
            proc = start(tmp, grace_s=30)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGUSR1)
            _, err = proc.communicate(timeout=60)
            elapsed_ms = (time.monotonic() - t0) * 1e3
            m = SAVE_RE.search(err)
            if proc.returncode != 75 or not m:
                raise SystemExit(f"escalated preemption failed ({proc.returncode}): {err}")
            overheads.append(elapsed_ms - float(m.group(1)))
    grace_s, trials, misses, slack = 1.0, 8, 0, []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            proc = start(tmp, grace_s=grace_s)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
            elapsed = time.monotonic() - t0
            slack.append((grace_s - elapsed) * 1e3)
            if proc.returncode != 75 or elapsed > grace_s:
                misses += 1
    print(f"escalated preemption: overhead beyond the save, median {statistics.median(overheads):.1f} ms "
          f"(min {min(overheads):.1f}, max {max(overheads):.1f}) over {len(overheads)} runs")
    print(f"grace {grace_s} s: {misses} deadline misses in {trials} trials; "
          f"exit {statistics.median(slack):.1f} ms before the deadline (median)")
    print(json.dumps({"benchmark": "preemption",
                      "preempt_overhead_ms": round(statistics.median(overheads), 2),
                      "deadline_misses": misses, "deadline_trials": trials,
                      "deadline_slack_ms_median": round(statistics.median(slack), 1)}))


if __name__ == "__main__":
    main()
