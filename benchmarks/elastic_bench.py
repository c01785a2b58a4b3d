"""Elastic data-parallel benchmark (make bench): real processes over loopback.

detect_ms, rebuild_ms: 4 omni_train replicas with the default heartbeat
  (100 ms) and peer timeout (1000 ms); one is SIGKILLed in the middle of
  training. detect_ms is the time from the kill to the survivors' agreement on
  the new generation (they know who is gone); rebuild_ms from that agreement
  to their next committed step (new communicator, state digest exchange, the
  redone step). Medians over trials (each trial: the slowest survivor).
  Timestamps are CLOCK_MONOTONIC of this host, read by the trainers
  (t_mono_ns in their log) and by this script (time.monotonic_ns): one host,
  one clock.
failure_noticed_ms: from the kill to the survivors' failed allreduce (Gloo sees
  the dead peer's sockets close).
rebuild_vs_torch_<n>: for n = 2, 4, 8 ranks on loopback, the time to build a
  communicator and pass one barrier with omni (Gloo, under a fresh store
  prefix, as for a new generation) over the same with torch.distributed
  (Debian's python3-torch): destroy_process_group + init_process_group("gloo")
  under a fresh PrefixStore + barrier. Both use a c10d TCPStore hosted by rank
  0 (omni through its tcp:// adapter), so the store is the same; also
  omni_file_ms_<n> with omni's embedded FileStore. Median over rounds of the
  slowest rank (goal <= 0.5).

Usage: /usr/bin/python3 benchmarks/elastic_bench.py BUILD_DIR
"""

import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build")
TRAINER = BUILD / "bin" / "omni_train"
REBUILD = BUILD / "bin" / "omni_comm_rebuild"
PY = "/usr/bin/python3"
ROUNDS = 12
MONO_RE = re.compile(r"t_mono_ns=(\d+)")

TORCH_RANK = r"""
import sys, time, datetime
import torch.distributed as dist
host, port, rank, size, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
store = dist.TCPStore(host, port, size, rank == 0, timeout=datetime.timedelta(seconds=60))
for k in range(rounds):
    t0 = time.perf_counter()
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round{k}", store), rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=60))
    dist.barrier()
    ms = (time.perf_counter() - t0) * 1e3
    dist.destroy_process_group()
    print(f"round {k} ms {ms:.3f}", flush=True)
store.add("done", 1)
if rank == 0:
    for _ in range(6000):
        if store.add("done", 0) >= size:
            break
        time.sleep(0.01)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_round(outputs):
    """Median over rounds (after the first) of the slowest rank."""
    rounds = {}
    for out in outputs:
        for line in out.splitlines():
            m = re.match(r"round (\d+) ms ([0-9.]+)", line)
            if m:
                k = int(m.group(1))
                rounds[k] = max(rounds.get(k, 0.0), float(m.group(2)))
    vals = [v for k, v in sorted(rounds.items()) if k > 0]
    if not vals:
        raise SystemExit("no rounds measured")
    return statistics.median(vals)


def run_ranks(cmds, timeout=300):
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"{cmds[0][0]} failed ({p.returncode}): {err[-2000:]}")
        outs.append(out)
    return outs


def omni_rebuild_ms(n, uri_of_rank):
    return per_round(run_ranks([[str(REBUILD), "--store", uri_of_rank(r), "--rank", str(r),
                                 "--size", str(n), "--rounds", str(ROUNDS)] for r in range(n)]))


def torch_rebuild_ms(n):
    port = free_port()
    return per_round(run_ranks([[PY, "-c", TORCH_RANK, "127.0.0.1", str(port), str(r), str(n),
                                 str(ROUNDS)] for r in range(n)]))


def rebuild_figures():
    figures = {}
    for n in (2, 4, 8):
        port = free_port()
        tcp = omni_rebuild_ms(
            n, lambda r, port=port: f"tcp://127.0.0.1:{port}" + ("?server=1" if r == 0 else ""))
        with tempfile.TemporaryDirectory() as tmp:
            fil = omni_rebuild_ms(n, lambda r, tmp=tmp: f"file://{tmp}/store")
        tor = torch_rebuild_ms(n)
        figures[f"omni_tcp_ms_{n}"] = round(tcp, 2)
        figures[f"omni_file_ms_{n}"] = round(fil, 2)
        figures[f"torch_ms_{n}"] = round(tor, 2)
        figures[f"rebuild_vs_torch_{n}"] = round(tcp / tor, 3)
        print(f"{n} ranks: omni tcp {tcp:.1f} ms, omni file {fil:.1f} ms, torch {tor:.1f} ms",
              flush=True)
    return figures


def kill_trial(tmp):
    store = pathlib.Path(tmp) / "store"
    reps = []
    for i in range(4):
        err = pathlib.Path(tmp) / f"r{i}.err"
        log = pathlib.Path(tmp) / f"r{i}.loss"
        p = subprocess.Popen(
            [str(TRAINER), "--steps", "200", "--batch", "8", "--text-only", "--eval-every", "0",
             "--quiet", "--store", f"file://{store}", "--replica-id", f"r{i}", "--min-replicas",
             "2", "--loss-log", str(log)],
            stdout=subprocess.DEVNULL, stderr=open(err, "w"))
        reps.append((p, err, log))
    victim, _, vlog = reps[3]
    deadline = time.monotonic() + 120
    while not (vlog.exists() and len(vlog.read_text().splitlines()) >= 30):
        if time.monotonic() > deadline or victim.poll() is not None:
            for p, _, _ in reps:
                p.kill()
            raise SystemExit("replicas did not start training")
        time.sleep(0.002)
    t_kill = time.monotonic_ns()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    noticed, agreed, committed = [], [], []
    for p, err, _ in reps[:3]:
        if p.wait(timeout=300) != 0:
            raise SystemExit(f"survivor failed: {err.read_text()[-2000:]}")
        text = err.read_text()
        fail = [l for l in text.splitlines() if " failed: " in l]
        rec = [l for l in text.splitlines() if "elastic: recovered:" in l]
        com = [l for l in text.splitlines() if "after recovery" in l]
        if not (fail and rec and com):
            raise SystemExit(f"no recovery in the log: {text[-2000:]}")
        t_fail = int(MONO_RE.search(fail[0]).group(1))
        t_rec = int(MONO_RE.search(rec[0]).group(1))
        build = float(re.search(r"build ([0-9.]+) ms", rec[0]).group(1))
        sync = float(re.search(r"sync ([0-9.]+) ms", rec[0]).group(1))
        t_agreed = t_rec - int((build + sync) * 1e6)
        t_com = int(MONO_RE.search(com[0]).group(1))
        noticed.append((t_fail - t_kill) / 1e6)
        agreed.append((t_agreed - t_kill) / 1e6)
        committed.append((t_com - t_kill) / 1e6)
    return max(noticed), max(agreed), max(committed)


def main():
    if not TRAINER.exists() or not REBUILD.exists():
        raise SystemExit(f"build {TRAINER} and {REBUILD} first")
    trials = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            trials.append(kill_trial(tmp))
            print("kill trial: noticed %.1f ms, agreed %.1f ms, committed %.1f ms" % trials[-1],
                  flush=True)
    noticed = statistics.median(t[0] for t in trials)
    agreed = statistics.median(t[1] for t in trials)
    committed = statistics.median(t[2] for t in trials)
    figures = {"bench": "elastic", "failure_noticed_ms": round(noticed, 1),
               "detect_ms": round(agreed, 1), "rebuild_ms": round(committed - agreed, 1)}
    figures.update(rebuild_figures())
    ratios = [figures[f"rebuild_vs_torch_{n}"] for n in (2, 4, 8)]
    figures["rebuild_vs_torch"] = max(ratios)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
