"""Co-location on one machine: a critical omni_train job (2 elastic replicas)
publishes its live window notices; a best-effort colocate_guest runs in them.

  python3 benchmarks/colocation_bench.py [BUILD]    (make bench: the JSON line)
  python3 scripts/colocate_demo.py [BUILD]          (make demo: uses demo() below)

demo: the critical job alone (the undisturbed reference), then with the guest,
while one critical replica is SIGKILLed and started again midway and the guest
is preempted once by a notice and started again; then the guest alone for as
many steps as it did (its reference). Prints a table, writes a timeline SVG
(omni plot with the guest's lane) and a Perfetto trace of both jobs.

bench: the critical job alone, with the forecast-gated guest, with the same
guest ungated (plain time sharing) and ungated in SCHED_IDLE, side by side in
one run; the last line of output is the `colocation` JSON line.

Definitions (docs/colocation.md): the critical job's real idle time is the
idle time of replica r0 (the host whose channel the guest reads) from its
step log under the innermost-phase rule; harvest is the share of it that guest
work covered, a guest unit counting min(1, nominal / wall) of its overlap
(nominal: the guest's median unit time alone), so that a unit stretched by CPU
contention is not counted as full work. Slowdown compares the critical job's
mean post-warm-up step time of r0 with and without the guest (bench: against
the mean of two runs alone, one before and one after; their difference is
reported as critical_alone_spread_pct, the noise floor of the machine).
"""

import argparse
import bisect
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
FINAL_RE = re.compile(r"final step=(\d+) params_xxh3=([0-9a-f]{16}) loss=(-?[\d.]+)")
SAVED_RE = re.compile(r"saved step=(\d+) params_xxh3=([0-9a-f]{16})")
GATE_RE = re.compile(r"units=(\d+) waits=(\d+) yields=(\d+) yield_p99_ms=([\d.]+) "
                     r"yield_max_ms=([\d.]+) deadline_misses=(\d+)(?: overruns=(\d+))?")
SUPER_RE = re.compile(r"supervisor resumes=\d+ run_ms=[\d.]+ cpu_ms=([\d.]+)")
# --stall-io: the critical job's data stalls block (a fetch from remote
# storage), so they free its core: on a CPU host that is the idle time a guest
# can have (eval scoring and host-side work are CPU work here; the guest reads
# data_stall windows only). --stall-scale 4: a data-loading-bound job, whose
# stalls last a few to tens of milliseconds. docs/colocation.md, "What is
# idle on a CPU host".
CRITICAL = ["--seed", "1", "--batch", "8", "--eval-every", "10", "--quiet", "--max-replicas", "2",
            "--heartbeat-ms", "50", "--peer-timeout-ms", "600", "--stall-io", "--stall-scale", "4"]
GUEST = ["--hidden", "64", "--batch", "32", "--seed", "7", "--guard-ms", "1", "--unit-ms", "5"]
# The gated guest: stopped and continued by its supervisor by window
# (colocate_guest --pause), data stalls only.
GATED = ["--kinds", "data_stall", "--poll-ms", "20", "--yield-bound-ms", "1"]
# The supervisor runs the guest from the open of a stall to its close
# (SIGSTOP then), woken by the host's notices (no polling; the remainder is
# not needed: --poll-ms 20): a blocked host's wake-up preempts the guest.
PAUSE = ["--pause", "--until-close"]
CPU_IDLE_PHASES = {"data_wait"}  # the critical job's real idle time on a CPU host
# Cores: r0 and the guest share core 0 (the guest uses r0's windows, as a GPU
# guest uses its host's device); r1 has core 1. None when fewer than 2 cores.
CORES = sorted(os.sched_getaffinity(0))
PIN = {"r0": CORES[0], "r1": CORES[1], "guest": CORES[0]} if len(CORES) >= 2 else {}
WARMUP_STEPS = 10  # excluded from step-time means (the runtime's own warm-up)


def log(msg):
    print(msg, flush=True)


class Proc:
    """A child process with its stdout/stderr in files under `d`."""

    def __init__(self, d, name, args, sched_idle=False, core=None):
        self.name, self.d = name, d
        self.out, self.err = d / f"{name}.out", d / f"{name}.err"

        def pre():
            if core is not None:
                os.sched_setaffinity(0, {core})
            if sched_idle:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.p = subprocess.Popen([str(a) for a in args], stdout=o, stderr=e, preexec_fn=pre)

    def wait(self, timeout=240):
        rc = self.p.wait(timeout=timeout)
        return rc, self.out.read_text(), self.err.read_text()


class Critical:
    """The 2 replicas of the critical job; r0 publishes the window channel.

    r1 starts first and waits for a second replica (--min-replicas 2); r0,
    started once r1 has registered, goes on alone when r1 fails
    (--min-replicas 1), and r1 started again rejoins at a step boundary."""

    def __init__(self, b, d, steps, channel):
        self.b, self.d, self.steps, self.channel = b, d, steps, channel
        self.store = d / "store"
        self.reps = {"r1": self.start("r1")}
        deadline = time.monotonic() + 120
        while not (self.store / "k-hb%r1").exists():
            if self.reps["r1"].p.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"replica r1 did not register: {self.reps['r1'].err.read_text()[-2000:]}")
            time.sleep(0.02)
        self.reps["r0"] = self.start("r0")

    def start(self, rid, tag=""):
        args = [self.b / "omni_train", "--steps", self.steps, *CRITICAL,
                "--min-replicas", "1" if rid == "r0" else "2",
                "--store", f"file://{self.store}", "--replica-id", rid,
                "--log", self.d / f"{rid}{tag}.jsonl", "--params-out", self.d / f"{rid}{tag}.bin"]
        if rid == "r0":
            args += ["--loss-log", self.d / "r0.loss"]
            if self.channel:
                args += ["--window-channel", self.channel]
        return Proc(self.d, rid + tag, args, core=PIN.get(rid))

    def step(self):
        f = self.d / "r0.loss"
        return len(f.read_text().splitlines()) if f.exists() else 0

    def finish(self):
        res = {}
        for rid, p in self.reps.items():
            rc, out, err = p.wait()
            m = FINAL_RE.search(out)
            if rc != 0 or not m:
                sys.exit(f"critical replica {rid} failed (rc {rc}): {err[-2000:]}")
            res[rid] = m.group(2)
        if len(set(res.values())) != 1:
            sys.exit(f"critical replicas disagree: {res}")
        return res["r0"]


def guest_args(b, d, channel, notice=None, steps=1_000_000):
    args = [b / "colocate_guest"] + (PAUSE if channel else []) + [
        "--ckpt-dir", d / "guest_ckpt", "--steps", steps, *GUEST, "--log", d / "guest.jsonl"]
    if channel:
        args += ["--channel", channel, *GATED, "--runs-log", d / "guest_runs.jsonl"]
    if notice:
        args += ["--notice-file", notice]
    return args


def read_jsonl(path):
    out = []
    for line in pathlib.Path(path).read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def step_records(path):
    rows = read_jsonl(path)
    idle = {p["name"]: p["idle"] != "busy" for p in rows[0]["phases"]}
    return [r for r in rows if r.get("type") == "step"], idle


def idle_intervals(steps, idle, phases=None):
    """Idle time under the innermost-phase rule: an idle span minus the deeper
    spans nested in it; only `phases` when given."""
    out = []
    for r in steps:
        spans = r["spans"]
        for s in spans:
            if not idle.get(s["phase"], False) or (phases and s["phase"] not in phases):
                continue
            pieces = [(s["start_ns"], s["end_ns"])]
            for c in spans:
                if c["depth"] > s["depth"] and s["start_ns"] <= c["start_ns"] < s["end_ns"]:
                    nxt = []
                    for a, e in pieces:
                        if c["end_ns"] <= a or c["start_ns"] >= e:
                            nxt.append((a, e))
                            continue
                        if c["start_ns"] > a:
                            nxt.append((a, c["start_ns"]))
                        if c["end_ns"] < e:
                            nxt.append((c["end_ns"], e))
                    pieces = nxt
            out += [(a, e, s["phase"]) for a, e in pieces if e > a]
    return out


def overlap(spans, idle):
    """Total overlap of sorted-or-not (a, e) spans with idle (a, e, _) intervals."""
    idle = sorted(idle)
    starts = [a for a, _, _ in idle]
    total = 0
    for a, e in spans:
        i = max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(idle) and idle[i][0] < e:
            total += max(0, min(e, idle[i][1]) - max(a, idle[i][0]))
            i += 1
    return total


def harvest(idle, units, nominal_ns, runs=None):
    """Share of the idle time the guest's work covered. Units gated at their
    boundaries: each unit's overlap, weighted min(1, nominal / wall). Paused
    and resumed (runs given): the runs' overlap, weighted by the guest's speed
    while it ran (units done x nominal / run time). Also the guest's run time
    outside the idle time (ns): the host's busy time it was on the cores."""
    total = sum(e - a for a, e, _ in idle)
    if runs is not None:
        spans = [(r["resume_ns"], r["stop_ns"]) for r in runs]
        run_ns = sum(e - a for a, e in spans)
        speed = min(1.0, len(units) * nominal_ns / run_ns) if run_ns else 0.0
        inside = overlap(spans, idle)
        return (speed * inside / total if total else 0.0), total, run_ns - inside
    used, outside = 0.0, 0
    for u in units:
        a, e = u["start_ns"], u["end_ns"]
        w = min(1.0, nominal_ns / max(1, e - a))
        o = overlap([(a, e)], idle)
        used += w * o
        outside += (e - a) - o
    return used / total if total else 0.0, total, outside


def mean_step_ms(steps, skip=(), stat=statistics.mean):
    ds = [(r["end_ns"] - r["start_ns"]) / 1e6 for r in steps
          if r["step"] >= WARMUP_STEPS and r["step"] not in skip]
    return stat(ds)


def median_step_ms(steps, skip=()):
    """The median step: robust to the bursts of other processes on a shared
    machine, which hit a few steps hard (the mean moves with them)."""
    return mean_step_ms(steps, skip, statistics.median)


def gate_stats(errs):
    s = {"units": 0, "yields": 0, "yield_p99_ms": 0.0, "deadline_misses": 0, "overruns": 0,
         "supervisor_cpu_ms": sum(float(x) for e in errs for x in SUPER_RE.findall(e))}
    for err in errs:
        for m in GATE_RE.finditer(err):
            s["units"] += int(m.group(1))
            s["yields"] += int(m.group(3))
            s["yield_p99_ms"] = max(s["yield_p99_ms"], float(m.group(4)))
            s["deadline_misses"] += int(m.group(6))
            s["overruns"] += int(m.group(7) or 0)
    return s


def run_critical_alone(b, d, steps):
    d.mkdir(parents=True)
    c = Critical(b, d, steps, channel=None)
    progress(c, None)
    return c.finish(), step_records(d / "r0.jsonl")


def progress(c, guest_log, every=3.0, hooks=()):
    """Prints progress every `every` s until both replicas exit; runs hooks
    (step, fn) once r0 reached `step`."""
    pending, last, deadline = list(hooks), 0.0, time.monotonic() + 300
    while any(p.p.poll() is None for p in c.reps.values()):
        if time.monotonic() > deadline:
            for p in c.reps.values():
                p.p.kill()
            sys.exit("the critical job did not finish within 300 s")
        s = c.step()
        for h in [h for h in pending if s >= h[0]]:
            pending.remove(h)
            h[1]()
        if time.monotonic() - last > every:
            last = time.monotonic()
            g = len(guest_log.read_text().splitlines()) if guest_log and guest_log.exists() else 0
            log(f"    critical step {s}/{c.steps}" + (f", guest units {g}" if guest_log else ""))
        time.sleep(0.05)


def guest_reference(b, d, steps):
    """The guest alone, undisturbed, for `steps` steps: its digest and median unit."""
    d.mkdir(parents=True)
    rc, out, err = Proc(d, "guest_ref", guest_args(b, d, None, steps=steps)).wait()
    m = FINAL_RE.search(out)
    if rc != 0 or not m:
        sys.exit(f"guest reference failed (rc {rc}): {err[-2000:]}")
    units = read_jsonl(d / "guest.jsonl")
    return m.group(2), statistics.median(u["end_ns"] - u["start_ns"] for u in units)


def last_saved(err):
    m = SAVED_RE.findall(err)
    return (int(m[-1][0]), m[-1][1]) if m else (0, None)


def colocated(b, d, steps, mode, channel, hooks_fn=None):
    """The critical job with a guest: mode gated | plain | idle."""
    d.mkdir(parents=True)
    c = Critical(b, d, steps, channel if mode == "gated" else None)
    notice = d / "notice.json"
    g = {"proc": Proc(d, "guest0", guest_args(b, d, channel if mode == "gated" else None, notice),
                      sched_idle=(mode == "idle"), core=PIN.get("guest")),
         "errs": [], "runs": 1, "marks": []}
    hooks = hooks_fn(c, g, notice) if hooks_fn else ()
    progress(c, d / "guest.jsonl", hooks=hooks)
    digest = c.finish()
    p = g["proc"]
    if mode != "gated":  # ungated guests run until told: stop them like a scheduler would
        p.p.send_signal(signal.SIGTERM)
    rc, _, err = p.wait()
    g["errs"].append(err)
    if rc == -signal.SIGTERM and mode == "idle" and not (d / "guest.jsonl").exists():
        pass  # in SCHED_IDLE on busy cores it never ran, not even to install its handler
    elif rc != 75:
        sys.exit(f"guest exited {rc}: {err[-2000:]}")
    step, gdigest = last_saved(err)
    runs = d / "guest_runs.jsonl"
    return {"critical_digest": digest, "steps": step_records(d / "r0.jsonl"), "guest_steps": step,
            "guest_digest": gdigest, "gate": gate_stats(g["errs"]), "guest_runs": g["runs"],
            "units": read_jsonl(d / "guest.jsonl") if (d / "guest.jsonl").exists() else [],
            "marks": g["marks"], "d": d,
            "runs": read_jsonl(runs) if runs.exists() else None}


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def demo_hooks(kill_at, preempt_at):
    def make(c, g, notice):
        def kill():
            c.reps["r1"].p.send_signal(signal.SIGKILL)
            c.reps["r1"].p.wait()
            g["marks"].append((now_ns(), "r1 SIGKILL"))
            log(f"    >> step {c.step()}: critical replica r1 SIGKILLed")
            # Its id is free once the survivor has formed a generation without it.
            deadline = time.monotonic() + 30
            while "recovered" not in c.reps["r0"].err.read_text():
                if time.monotonic() > deadline:
                    sys.exit("r0 did not recover from the loss of r1 within 30 s")
                time.sleep(0.02)
            g["marks"].append((now_ns(), "r1 restarted"))
            log(f"    >> step {c.step()}: r0 goes on alone; r1 started again (same id, same flags)")
            c.reps["r1"] = c.start("r1", tag="_b")

        def preempt():
            tmp = notice.with_suffix(".tmp")
            tmp.write_text('{"yield_in_s": 5}')
            tmp.rename(notice)
            g["marks"].append((now_ns(), "guest preempted"))
            log(f"    >> step {c.step()}: notice to the guest: yield within 5 s")
            rc, _, err = g["proc"].wait(timeout=30)
            g["errs"].append(err)
            if rc != 75:
                sys.exit(f"preempted guest exited {rc}, not 75: {err[-2000:]}")
            step, _ = last_saved(err)
            notice.unlink()
            log(f"    >> guest exited 75 after saving step {step}; started again (resumes)")
            g["marks"].append((now_ns(), "guest resumed"))
            g["proc"] = Proc(c.d, "guest1", guest_args(c.b, c.d, c.channel, notice),
                             core=PIN.get("guest"))
            g["runs"] += 1
        return [(kill_at, kill), (preempt_at, preempt)]
    return make


def write_trace(path, d, res):
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "critical (omni_train)"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "guest (colocate_guest)"}}]
    for tid, f in enumerate(sorted(d.glob("r*.jsonl"))):
        ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
                   "args": {"name": f.stem}})
        steps, idle = step_records(f)
        for r in steps:
            ev.append({"ph": "X", "pid": 1, "tid": tid, "name": f"step {r['step']}",
                       "ts": r["start_ns"] / 1e3, "dur": (r["end_ns"] - r["start_ns"]) / 1e3})
            for s in r["spans"]:
                ev.append({"ph": "X", "pid": 1, "tid": tid, "name": s["phase"],
                           "ts": s["start_ns"] / 1e3, "dur": (s["end_ns"] - s["start_ns"]) / 1e3})
        if f.stem == "r0":
            for a, e, ph in idle_intervals(steps, idle):
                ev.append({"ph": "X", "pid": 1, "tid": 99, "name": f"idle window ({ph})",
                           "ts": a / 1e3, "dur": (e - a) / 1e3})
    ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 99,
               "args": {"name": "r0 real idle windows"}})
    for u in res["units"]:
        ev.append({"ph": "X", "pid": 2, "tid": 0, "name": f"guest step {u['step']}",
                   "ts": u["start_ns"] / 1e3, "dur": (u["end_ns"] - u["start_ns"]) / 1e3})
    for r in res["runs"] or ():
        ev.append({"ph": "X", "pid": 2, "tid": 1, "name": "running (SIGCONT to SIGSTOP)",
                   "ts": r["resume_ns"] / 1e3, "dur": (r["stop_ns"] - r["resume_ns"]) / 1e3})
    for t, label in res["marks"]:
        ev.append({"ph": "i", "s": "g", "pid": 1, "tid": 0, "name": label, "ts": t / 1e3})
    path.write_text(json.dumps({"traceEvents": ev, "displayTimeUnit": "ms"}))


def summary(alone, res, ref_guest, nominal, skip=(), alone_ms=None):
    steps, idle_phases = res["steps"]
    idle = idle_intervals(steps, idle_phases, CPU_IDLE_PHASES)
    h, idle_ns, outside_ns = harvest(idle, res["units"], nominal, res["runs"])
    offered = (overlap([(r["resume_ns"], r["stop_ns"]) for r in res["runs"]], idle) / idle_ns
               if res["runs"] is not None and idle_ns else None)
    t0 = alone_ms if alone_ms is not None else median_step_ms(alone[1][0], skip)
    t1 = median_step_ms(steps, skip)
    m0, m1 = mean_step_ms(alone[1][0], skip), mean_step_ms(steps, skip)
    n = len([r for r in steps if r["step"] >= WARMUP_STEPS])
    return {"alone_ms": t0, "with_ms": t1, "slowdown_pct": 100 * (t1 - t0) / t0, "harvest": h,
            "slowdown_mean_pct": 100 * (m1 - m0) / m0, "offered": offered,
            "idle_s": idle_ns / 1e9, "idle_share": idle_ns / sum(r["end_ns"] - r["start_ns"]
                                                                 for r in steps),
            "outside_ms_per_step": outside_ns / 1e6 / max(1, n),
            "critical_bit_exact": res["critical_digest"] == alone[0],
            "guest_bit_exact": res["guest_digest"] == ref_guest}


def demo(b, out, steps):
    if out.exists():
        shutil.rmtree(out)
    t_start = time.monotonic()
    ch = f"omni-demo-{os.getpid()}"
    log(f"== [1/3] the critical job alone: omni_train, 2 elastic replicas, {steps} steps "
        "(the undisturbed reference)")
    alone = run_critical_alone(b, out / "alone", steps)
    kill_at, preempt_at = int(steps * 0.35), int(steps * 0.6)
    log(f"== [2/3] the same job publishing its windows (--window-channel {ch}) with a "
        "best-effort guest (colocate_guest) in them;\n   r1 is killed at step "
        f"{kill_at} and replaced, the guest is preempted at step {preempt_at}")
    res = colocated(b, out / "colocated", steps, "gated", ch, demo_hooks(kill_at, preempt_at))
    log(f"== [3/3] the guest alone for its {res['guest_steps']} steps (its undisturbed reference)")
    ref_guest, nominal = guest_reference(b, out / "guest_alone", res["guest_steps"])
    # The steps around the kill wait for the peer timeout and the rejoin in
    # both... only in the co-located run: leave them out of both means.
    kill_step = next((r["step"] for r in res["steps"][0]
                      if r["end_ns"] >= res["marks"][0][0]), kill_at)
    s = summary(alone, res, ref_guest, nominal, skip=range(kill_step - 1, kill_step + 4))
    if not s["critical_bit_exact"]:
        import numpy as np
        a = np.fromfile(out / "alone" / "r0.bin", dtype="<f4").astype(np.float64)
        c = np.fromfile(out / "colocated" / "r0.bin", dtype="<f4").astype(np.float64)
        s["critical_rel_l2"] = float(np.linalg.norm(a - c) / np.linalg.norm(a))
    g = res["gate"]
    track = out / "colocated" / "guest_track.jsonl"
    track.write_text("".join(json.dumps(u) + "\n" for u in res["units"]) +
                     "".join(json.dumps({"t_ns": t, "mark": m}) + "\n" for t, m in res["marks"]))
    svg, trace = out / "timeline.svg", out / "trace.json"
    subprocess.run([str(b / "omni"), "plot", str(out / "colocated" / "r0.jsonl"), "--guest",
                    str(track), "--guest-label", "guest steps", "--out", str(svg)],
                   check=True, stdout=subprocess.DEVNULL)
    write_trace(trace, out / "colocated", res)
    crit_eq = "yes (bit-exact)" if s["critical_bit_exact"] else \
        f"no: rel. L2 {s.get('critical_rel_l2', 0):.1e} (elastic tolerance 7e-4: summation order)"
    rows = [
        ("critical median step alone / with guest",
         f"{s['alone_ms']:.1f} ms / {s['with_ms']:.1f} ms"),
        ("critical slowdown (of medians; of means)",
         f"{s['slowdown_pct']:+.2f} %; {s['slowdown_mean_pct']:+.2f} %"),
        ("critical real idle time (r0's blocked data stalls)",
         f"{s['idle_s']:.2f} s ({100 * s['idle_share']:.1f} % of its steps)"),
        ("harvest (share of it the guest used)", f"{s['harvest']:.3f}"),
        ("  share in which the guest was running", f"{s['offered'] or 0:.3f}"),
        ("guest on the cores outside it", f"{s['outside_ms_per_step']:.2f} ms per critical step"),
        ("guest steps done", f"{res['guest_steps']} (in {res['guest_runs']} runs)"),
        ("yields / p99 latency", f"{g['yields']} / {g['yield_p99_ms']:.2f} ms"),
        ("preemptions (guest exit 75, resumed)", "1"),
        ("deadline misses (stopped > yield bound after a close)", f"{g['deadline_misses']}"),
        ("stops after a close (any delay)", f"{g['overruns']}"),
        ("critical final params = undisturbed run", crit_eq),
        ("guest final params = undisturbed run", "yes (bit-exact)" if s["guest_bit_exact"] else "NO"),
    ]
    w = max(len(k) for k, _ in rows)
    log("\n" + "\n".join(f"  {k.ljust(w)}  {v}" for k, v in rows))
    log(f"\n  timeline (SVG):            {svg}\n  both jobs (ui.perfetto.dev): {trace}"
        f"\n  done in {time.monotonic() - t_start:.0f} s")
    return 0 if s["guest_bit_exact"] else 1


def bench(b, out, steps, pairs):
    """Alternating pairs (alone, gated), the order flipped every pair so that
    a drift of the machine does not favour one side; slowdown per pair, the
    median reported. The noise floor: the same comparison between the alone
    runs of consecutive pairs (the job against itself)."""
    if out.exists():
        shutil.rmtree(out)
    t_start = time.monotonic()
    log(f"colocation bench: {pairs} alternating pairs (critical alone, with the gated guest), "
        f"then the guest plain and in SCHED_IDLE ({steps} steps each; cores {PIN or 'unpinned'})")
    ch = f"omni-bench-{os.getpid()}"
    alone, gated = [], []
    for i in range(pairs):
        for mode in (("alone", "gated") if i % 2 == 0 else ("gated", "alone")):
            log(f"  pair {i + 1}/{pairs}: {mode}")
            if mode == "alone":
                alone.append(run_critical_alone(b, out / f"alone{i}", steps))
            else:
                gated.append(colocated(b, out / f"gated{i}", steps, "gated", ch))
    results = {}
    for mode in ("plain", "idle"):
        log(f"  guest: {mode}")
        results[mode] = colocated(b, out / mode, steps, mode, ch)
    ref_guest, nominal = guest_reference(b, out / "guest_alone", gated[0]["guest_steps"])
    a_ms = [median_step_ms(a[1][0]) for a in alone]
    per_pair = [summary(alone[i], gated[i], ref_guest, nominal, alone_ms=a_ms[i])
                for i in range(pairs)]
    noise = [100 * (a_ms[i + 1] - a_ms[i]) / a_ms[i] for i in range(pairs - 1)]
    a_med = statistics.median(a_ms)
    base = {m: summary(alone[0], r, ref_guest, nominal, alone_ms=a_med) for m, r in results.items()}
    med = statistics.median
    g0 = gated[0]
    line = {
        "benchmark": "colocation", "steps": steps, "replicas": 2, "pairs": pairs,
        "cores": PIN or None,
        "critical_step_ms_alone": round(a_med, 2),
        "critical_step_ms_with_guest": round(med(s["with_ms"] for s in per_pair), 2),
        "critical_slowdown_pct": round(med(s["slowdown_pct"] for s in per_pair), 2),
        "critical_slowdown_pct_pairs": [round(s["slowdown_pct"], 2) for s in per_pair],
        "critical_slowdown_pct_of_means_pairs": [round(s["slowdown_mean_pct"], 2)
                                                 for s in per_pair],
        "noise_floor_pct": round(med(abs(x) for x in noise), 2) if noise else None,
        "noise_pairs_pct": [round(x, 2) for x in noise],
        "harvest_fraction": round(med(s["harvest"] for s in per_pair), 3),
        "harvest_pairs": [round(s["harvest"], 3) for s in per_pair],
        "harvest_offered": round(med(s["offered"] for s in per_pair), 3),
        "critical_idle_s": round(med(s["idle_s"] for s in per_pair), 2),
        "critical_idle_share": round(med(s["idle_share"] for s in per_pair), 4),
        "guest_outside_idle_ms_per_step": round(med(s["outside_ms_per_step"] for s in per_pair), 3),
        "guest_steps": g0["guest_steps"],
        "guest_yields": sum(g["gate"]["yields"] for g in gated),
        "guest_yield_p99_ms": round(max(g["gate"]["yield_p99_ms"] for g in gated), 2),
        "deadline_misses": sum(g["gate"]["deadline_misses"] for g in gated),
        "guest_overruns": sum(g["gate"]["overruns"] for g in gated),
        "supervisor_cpu_ms_per_critical_step": round(med(
            g["gate"]["supervisor_cpu_ms"] / max(1, len(g["steps"][0])) for g in gated), 3),
        "critical_bit_exact": all(s["critical_bit_exact"] for s in per_pair) and
        len({a[0] for a in alone}) == 1,
        "guest_bit_exact": per_pair[0]["guest_bit_exact"],
        "baselines": {m: {"critical_slowdown_pct": round(base[m]["slowdown_pct"], 2),
                          "harvest_fraction": round(base[m]["harvest"], 3),
                          "guest_steps": results[m]["guest_steps"]}
                      for m in ("plain", "idle")},
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    line["baselines"]["sched_idle"] = line["baselines"].pop("idle")
    print(json.dumps(line), flush=True)
    return 0


def main(argv=None, mode="bench"):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default=str(REPO / "build"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--pairs", type=int, default=3, help="bench: alternating pairs (default 3)")
    a = ap.parse_args(argv)
    b = pathlib.Path(a.build).resolve() / "bin"
    for exe in ("omni_train", "colocate_guest", "omni"):
        if not (b / exe).exists():
            sys.exit(f"{b / exe} not built")
    out = pathlib.Path(a.out or pathlib.Path(a.build) / mode / "colocation").resolve()
    if mode == "demo":
        return demo(b, out, a.steps or 120)
    return bench(b, out, a.steps or 100, max(1, a.pairs))


if __name__ == "__main__":
    sys.exit(main())
