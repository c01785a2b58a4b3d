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

Definitions (docs/colocation.md, "Figures"): the critical job's real idle
time is the idle time of replica r0 (the host whose channel the guest reads)
from its step log under the innermost-phase rule (on a CPU host its blocking
data stalls); harvest is the share of it that guest work covered: the paused
guest's CPU time inside it, weighted by its work per CPU second against the
guest alone (an ungated guest's units: each unit's overlap weighted
min(1, nominal / wall)). Slowdown compares each step of r0 with the guest
against the same step alone, in alternating pairs; the job against itself
between pairs is the noise floor.
"""

import argparse
import atexit
import bisect
import json
import math
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
GATE_BOUND_MS = 1.0  # the supervisor's yield bound (--yield-bound-ms)
GATED = ["--kinds", "data_stall", "--poll-ms", "100", "--yield-bound-ms", str(GATE_BOUND_MS)]
# The supervisor runs the guest from the open of a stall to its close
# (SIGSTOP then), woken by the host's notices (no polling; the remainder is
# not needed: --poll-ms 100): a blocked host's wake-up preempts the guest.
PAUSE = ["--pause", "--until-close"]
# --old-setup: as measured before (docs/colocation.md, "Why a yield looked
# slow"): every process in the benchmark's session and the paused trainer in
# the normal class.
OLD_SETUP = False
CPU_IDLE_PHASES = {"data_wait"}  # the critical job's real idle time on a CPU host
# Cores: r0 and the guest share core 0 (the guest uses r0's windows, as a GPU
# guest uses its host's device); r1 has core 1. None when fewer than 2 cores.
CORES = sorted(os.sched_getaffinity(0))
PIN = {"r0": CORES[0], "r1": CORES[1], "guest": CORES[0]} if len(CORES) >= 2 else {}
WARMUP_STEPS = 10  # excluded from step-time means (the runtime's own warm-up)
LOAD_AT_START = os.getloadavg()[0]


def log(msg):
    print(msg, flush=True)


_STARTED = []


@atexit.register
def _kill_started():
    """Children run in sessions of their own: an interrupted run ends them."""
    for p in _STARTED:
        if p.poll() is None:
            p.kill()


# The best-effort guest's cgroup (idle_cgroup): None until made, False
# where none can be (or --guest-isolation autogroup).
_GUEST_CGROUP = None
USE_CGROUP = True


def idle_cgroup():
    """A cgroup of the cpu controller with cpu.idle 1 for best-effort
    guests (Linux 5.15+, as root), made once per run and removed at exit;
    None where it cannot be made.

    A guest in the idle class is preempted at once by a woken host only
    inside one group. In a session of its own (an autogroup, even at nice
    19) the kernel compares the guest's group with the host's, and lets the
    guest's group finish its slice first (RUN_TO_PARITY): r0's wait for a
    core grew by 1.0-1.4 ms a step with the guest (perf sched, 2026-12-05);
    in an idle cgroup it does not (docs/colocation.md). The group gets a
    real-time budget where the kernel schedules real-time tasks by group, so
    that colocate_guest's supervisor can still run in SCHED_FIFO."""
    global _GUEST_CGROUP
    if _GUEST_CGROUP is None:
        _GUEST_CGROUP = _make_idle_cgroup() if USE_CGROUP else False
    return _GUEST_CGROUP or None


def _make_idle_cgroup():
    """idle_cgroup's cgroup, or False."""
    for root in (pathlib.Path("/sys/fs/cgroup/cpu"), pathlib.Path("/sys/fs/cgroup")):
        if not (root / "cpu.idle").exists() and not (root / "cgroup.subtree_control").exists():
            continue
        path = root / f"omni-colocation-{os.getpid()}"
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / "cpu.idle").write_text("1")
            if (path / "cpu.rt_runtime_us").exists():
                (path / "cpu.rt_runtime_us").write_text("100000")
        except OSError:
            path.rmdir()
            continue
        atexit.register(_remove_cgroup, path)
        return path
    return False


def _remove_cgroup(path):
    """After _kill_started (atexit runs in reverse): its processes are gone."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)  # a killed process may take a moment to leave it


def guest_isolation():
    """How the best-effort guest is kept from the host's core (the JSON line)."""
    return "cgroup cpu.idle" if idle_cgroup() else "session at autogroup nice 19"


class Proc:
    """A child process with its stdout/stderr in files under `d`.

    Each is a session of its own, as separate jobs are (their own containers
    or cgroups): Linux schedules the processes of one session as one group
    (autogroup), so a guest in the critical job's session spends that
    session's share of the core and delays the critical job's wake-ups
    (docs/colocation.md, "Why a yield looked slow")."""

    def __init__(self, d, name, args, sched_idle=False, core=None, best_effort=False):
        self.name, self.d = name, d
        self.out, self.err = d / f"{name}.out", d / f"{name}.err"

        cgroup = idle_cgroup() if best_effort else None

        def pre():
            if core is not None:
                os.sched_setaffinity(0, {core})
            if best_effort:
                # A best-effort job from its exec on: its start (~0.6 s of
                # CPU loading LibTorch here) in the idle class, in an idle
                # cgroup, else its session (made before this runs) at the
                # lowest group weight, or it takes half the host's core
                # while it loads (colocate_guest --pause raises its
                # supervisor to SCHED_FIFO).
                try:
                    if cgroup:
                        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
                    else:
                        pathlib.Path("/proc/self/autogroup").write_text("19")
                except OSError:
                    pass  # the operator's cgroups decide
            if sched_idle or best_effort:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.p = subprocess.Popen([str(a) for a in args], stdout=o, stderr=e, preexec_fn=pre,
                                      start_new_session=not OLD_SETUP)
        _STARTED.append(self.p)

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
        self.sched = [None, None]
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

    def sample(self, step):
        """r0's training thread from /proc/<pid>/schedstat: CPU time and time
        spent runnable but waiting for a core, first after the warm-up and
        last (per-step figures: sched_per_step)."""
        pid = self.reps["r0"].p.pid
        try:
            run_ns, wait_ns, _ = (int(x) for x in
                                  pathlib.Path(f"/proc/{pid}/schedstat").read_text().split())
        except (OSError, ValueError):
            return
        if step >= WARMUP_STEPS:
            if self.sched[0] is None:
                self.sched[0] = (step, run_ns, wait_ns)
            self.sched[1] = (step, run_ns, wait_ns)

    def sched_per_step(self):
        """(CPU ms, wait-for-a-core ms) per step of r0 after the warm-up."""
        a, b = self.sched
        if a is None or b[0] <= a[0]:
            return None, None
        n = b[0] - a[0]
        return (b[1] - a[1]) / 1e6 / n, (b[2] - a[2]) / 1e6 / n

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
    pause = PAUSE + (["--normal-class"] if OLD_SETUP else [])
    args = [b / "colocate_guest"] + (pause if channel else []) + [
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


def run_cpu_in_idle(r, idle):
    """The guest's CPU time in one run (SIGCONT to SIGSTOP) that fell in the
    host's idle time, from the trainer's CPU clock: up to the host's close
    (the CPU to the signal, less the signal's lag after the close, in which
    it may have run), and at most the run's overlap with the idle time."""
    if r.get("cpu_resume_ns", -1) < 0:
        return 0
    if r.get("close_ns", 0) > 0 and r.get("cpu_signal_ns", -1) >= 0:
        cpu = (r["cpu_signal_ns"] - r["cpu_resume_ns"]) - max(0, r["signal_ns"] - r["close_ns"])
    else:
        cpu = r["cpu_stop_ns"] - r["cpu_resume_ns"]
    return max(0, min(cpu, overlap([(r["resume_ns"], r["stop_ns"])], idle)))


def harvest(idle, units, nominal_ns, runs=None):
    """Share of the idle time the guest's work covered (nominal: the guest's
    time per unit alone, undisturbed on a core of its own).

    Units gated at their boundaries: each unit's overlap, weighted
    min(1, nominal / wall), so that a unit stretched by contention is not
    counted as full work. Paused and resumed (runs given): the guest's CPU
    time inside the idle time, weighted by its work per CPU second against
    alone (units done x nominal / CPU time in its runs: cold caches after a
    resume count against it). Its speed is taken from its CPU clock, not
    from the runs' wall time: a run ends when its stop is observed, which at
    the paused trainer's low weight comes after the host has had the core
    back for a while, so wall time counts time in which it did not run.
    Returns (harvest, idle ns, the guest's time outside the idle time in ns:
    what it took of the host's busy time, its CPU inside the idle time in ns
    or None for units)."""
    total = sum(e - a for a, e, _ in idle)
    if runs is not None:
        cpu = sum(max(0, r["cpu_stop_ns"] - r["cpu_resume_ns"]) for r in runs
                  if r.get("cpu_resume_ns", -1) >= 0)
        inside = sum(run_cpu_in_idle(r, idle) for r in runs)
        speed = min(1.0, len(units) * nominal_ns / cpu) if cpu else 0.0
        return (speed * inside / total if total else 0.0), total, cpu - inside, inside
    used, outside = 0.0, 0
    for u in units:
        a, e = u["start_ns"], u["end_ns"]
        w = min(1.0, nominal_ns / max(1, e - a))
        o = overlap([(a, e)], idle)
        used += w * o
        outside += (e - a) - o
    return used / total if total else 0.0, total, outside, None


def warm_unit_ns(units, runs):
    """The guest's median unit among those that began and ended inside one
    run (no stop in them, not the unit a resume continued): its speed
    co-located, at the same time as the harvest, with warm caches. Against
    the unit alone it separates what co-location costs the guest's speed
    (shared caches, the host's other threads, the machine's speed at that
    moment) from what each resume costs; None without runs."""
    if not runs:
        return None
    starts = [r["resume_ns"] for r in runs]
    ends = [r["signal_ns"] if r.get("signal_ns", 0) > 0 else r["stop_ns"] for r in runs]
    warm = []
    for u in units:
        k = bisect.bisect_right(starts, u["start_ns"]) - 1
        if k >= 0 and u["end_ns"] <= ends[k]:
            warm.append(u["end_ns"] - u["start_ns"])
    return statistics.median(warm) if warm else None


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


def run_critical_alone(b, d, steps, kill_at=None):
    """The critical job without a guest; with kill_at, r1 is killed and
    replaced at that step as in the demo's run with the guest, so that the
    two runs differ only by the guest."""
    d.mkdir(parents=True)
    c = Critical(b, d, steps, channel=None)
    marks = []
    progress(c, None, hooks=[(kill_at, lambda: kill_and_replace_r1(c, marks))]
             if kill_at is not None else ())
    return c.finish(), step_records(d / "r0.jsonl"), c.sched_per_step(), marks


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
        c.sample(s)
        for h in [h for h in pending if s >= h[0]]:
            pending.remove(h)
            h[1]()
        if time.monotonic() - last > every:
            last = time.monotonic()
            g = len(guest_log.read_text().splitlines()) if guest_log and guest_log.exists() else 0
            log(f"    critical step {s}/{c.steps}" + (f", guest units {g}" if guest_log else ""))
        time.sleep(0.05)


def guest_reference(b, d, steps):
    """The guest alone, undisturbed, for `steps` steps: its digest and time per unit."""
    d.mkdir(parents=True)
    rc, out, err = Proc(d, "guest_ref", guest_args(b, d, None, steps=steps),
                        core=PIN.get("guest")).wait()
    m = FINAL_RE.search(out)
    if rc != 0 or not m:
        sys.exit(f"guest reference failed (rc {rc}): {err[-2000:]}")
    units = read_jsonl(d / "guest.jsonl")
    # Its time per unit: the span of its units over their number, so that the
    # loop's own work between units counts as it does in a CPU clock.
    return m.group(2), (units[-1]["end_ns"] - units[0]["start_ns"]) / len(units)


def last_saved(err):
    m = SAVED_RE.findall(err)
    return (int(m[-1][0]), m[-1][1]) if m else (0, None)


def colocated(b, d, steps, mode, channel, hooks_fn=None):
    """The critical job with a guest: mode gated | plain | idle."""
    d.mkdir(parents=True)
    notice = d / "notice.json"
    g = {"proc": Proc(d, "guest0", guest_args(b, d, channel if mode == "gated" else None, notice),
                      sched_idle=(mode == "idle"), core=PIN.get("guest"),
                      best_effort=(mode == "gated" and not OLD_SETUP)),
         "errs": [], "runs": 1, "marks": []}
    # The guest is waiting for windows (or running, ungated) when the
    # critical job starts, as a guest of a long job is: its start, once per
    # job (0.5-0.9 s of CPU loading LibTorch here), is not in the figures.
    wait_guest_ready(g["proc"], d, gated=(mode == "gated"))
    c = Critical(b, d, steps, channel if mode == "gated" else None)
    hooks = hooks_fn(c, g, notice) if hooks_fn else ()
    progress(c, d / "guest.jsonl", hooks=hooks)
    digest = c.finish()
    p = g["proc"]
    if mode != "gated":  # ungated guests run until told: stop them like a scheduler would
        p.p.send_signal(signal.SIGTERM)
    else:
        # A gated guest leaves when it sees the host's channel close; one
        # still starting then (restarted after its preemption, in the idle
        # class) never sees it: the scheduler tells it the host is done.
        try:
            p.p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            g["marks"].append((now_ns(), "guest told to stop (the host is done)"))
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
            "sched": c.sched_per_step(),
            "guest_digest": gdigest, "gate": gate_stats(g["errs"]), "guest_runs": g["runs"],
            "units": read_jsonl(d / "guest.jsonl") if (d / "guest.jsonl").exists() else [],
            "marks": g["marks"], "d": d,
            "runs": read_jsonl(runs) if runs.exists() else None}


def trainer_ready(supervisor_pid):
    """Whether the trainer child of a `colocate_guest --pause` supervisor
    has stopped itself for its supervisor (ready, waiting for a window)."""
    pid = supervisor_pid
    try:
        kids = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not kids:
            return False
        stat = pathlib.Path(f"/proc/{kids[0]}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def wait_guest_ready(proc, d, gated, timeout=120):
    """Until the guest is ready: gated, its trainer has stopped itself for
    its supervisor (--pause); ungated, it has logged a unit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            sys.exit(f"guest exited {proc.p.returncode} before it was ready: "
                     f"{proc.err.read_text()[-2000:]}")
        if gated and trainer_ready(proc.p.pid):
            return
        if not gated and (d / "guest.jsonl").exists() and (d / "guest.jsonl").stat().st_size > 0:
            return
        time.sleep(0.02)
    sys.exit(f"guest not ready within {timeout} s: {proc.err.read_text()[-2000:]}")


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def kill_and_replace_r1(c, marks):
    c.reps["r1"].p.send_signal(signal.SIGKILL)
    c.reps["r1"].p.wait()
    marks.append((now_ns(), "r1 SIGKILL"))
    log(f"    >> step {c.step()}: critical replica r1 SIGKILLed")
    # Its id is free once the survivor has formed a generation without it.
    deadline = time.monotonic() + 30
    while "recovered" not in c.reps["r0"].err.read_text():
        if time.monotonic() > deadline:
            sys.exit("r0 did not recover from the loss of r1 within 30 s")
        time.sleep(0.02)
    marks.append((now_ns(), "r1 restarted"))
    log(f"    >> step {c.step()}: r0 goes on alone; r1 started again (same id, same flags)")
    c.reps["r1"] = c.start("r1", tag="_b")


def demo_hooks(kill_at, preempt_at):
    def make(c, g, notice):
        def kill():
            kill_and_replace_r1(c, g["marks"])

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
                             core=PIN.get("guest"), best_effort=not OLD_SETUP)
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


def quantile(xs, q):
    """The q-quantile (nearest rank) of xs; 0 for none."""
    if not xs:
        return 0
    v = sorted(xs)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def stops_after_close(runs, bound_ms):
    """The supervisor's stops after a host's close, from its runs log.

    wall: the close to the kernel's report of the stop (the earlier
    definition of a yield). A stop completes only when the stopped trainer's
    threads get a core again, and the host that just woke has it, so this
    includes time in which the guest is not running at all.
    signal: the close to SIGSTOP sent (the supervisor's wake-up, which the
    host's notice rings; the guest may run in it only if the host lost its
    core). cpu_after_signal: the trainer's CPU time from the signal to the
    stop, from its CPU clock.
    cpu_bound: signal + cpu_after_signal, an upper bound of the CPU the guest
    used after the close: what the critical job could notice. A miss is a
    stop whose cpu_bound exceeds bound_ms (wall_misses: whose wall time
    does)."""
    st = [r for r in runs or () if r.get("close_ns", 0) > 0]
    wall = [(r["stop_ns"] - r["close_ns"]) / 1e6 for r in st]
    sig = [max(0, r["signal_ns"] - r["close_ns"]) / 1e6 for r in st]
    after = [max(0, r["cpu_stop_ns"] - r["cpu_signal_ns"]) / 1e6 if r["cpu_signal_ns"] >= 0
             else float("inf") for r in st]
    bound = [a + b for a, b in zip(sig, after)]
    return {"stops": len(st),
            "wall_p50_ms": quantile(wall, 0.5), "wall_p99_ms": quantile(wall, 0.99),
            "wall_misses": sum(w > bound_ms for w in wall),
            "signal_p50_ms": quantile(sig, 0.5), "signal_p99_ms": quantile(sig, 0.99),
            "signal_max_ms": max(sig, default=0),
            "cpu_after_signal_p99_ms": quantile(after, 0.99),
            "cpu_after_signal_max_ms": max(after, default=0),
            "cpu_bound_p99_ms": quantile(bound, 0.99), "cpu_bound_max_ms": max(bound, default=0),
            "misses": sum(b > bound_ms for b in bound)}


def paired_slowdown(a_steps, b_steps, skip=()):
    """Slowdown of run b against run a, step by step: both runs do the same
    work at the same step (same seed, same modelled stalls), so each step of
    b is compared with the same step of a. Returns (median of the per-step
    differences over the median step of a, difference of the sums), in %."""
    a = {r["step"]: r["end_ns"] - r["start_ns"] for r in a_steps
         if r["step"] >= WARMUP_STEPS and r["step"] not in skip}
    b = {r["step"]: r["end_ns"] - r["start_ns"] for r in b_steps
         if r["step"] >= WARMUP_STEPS and r["step"] not in skip}
    common = sorted(a.keys() & b.keys())
    if not common:
        return 0.0, 0.0
    med = statistics.median(a[i] for i in common)
    diff = statistics.median(b[i] - a[i] for i in common)
    sa, sb = sum(a[i] for i in common), sum(b[i] for i in common)
    return 100 * diff / med, 100 * (sb - sa) / sa


def summary(alone, res, ref_guest, nominal, skip=(), alone_ms=None):
    steps, idle_phases = res["steps"]
    idle = idle_intervals(steps, idle_phases, CPU_IDLE_PHASES)
    h, idle_ns, outside_ns, inside_ns = harvest(idle, res["units"], nominal, res["runs"])
    warm = warm_unit_ns(res["units"], res["runs"])
    # The same harvest with the guest's co-located warm unit as the yardstick
    # (what the resumes themselves cost, not the machine's speed).
    h_warm = harvest(idle, res["units"], warm, res["runs"])[0] if warm else None
    offered = (overlap([(r["resume_ns"], r["stop_ns"]) for r in res["runs"]], idle) / idle_ns
               if res["runs"] is not None and idle_ns else None)
    t0 = alone_ms if alone_ms is not None else median_step_ms(alone[1][0], skip)
    t1 = median_step_ms(steps, skip)
    m0, m1 = mean_step_ms(alone[1][0], skip), mean_step_ms(steps, skip)
    n = len([r for r in steps if r["step"] >= WARMUP_STEPS])
    paired, paired_sum = paired_slowdown(alone[1][0], steps, skip)
    gate = res["gate"]
    stops = stops_after_close(res["runs"], GATE_BOUND_MS)
    cpu_a, wait_a = alone[2]
    cpu_g, wait_g = res["sched"]
    return {"alone_ms": t0, "with_ms": t1, "slowdown_pct": 100 * (t1 - t0) / t0, "harvest": h,
            "harvest_warm": h_warm, "warm_unit_ms": None if warm is None else warm / 1e6,
            "paired_pct": paired, "paired_sum_pct": paired_sum, "stops": stops,
            "harvest_cpu": (inside_ns / idle_ns if inside_ns is not None and idle_ns else None),
            "cpu_ms": (cpu_a, cpu_g), "wait_ms": (wait_a, wait_g),
            "supervisor_ms_per_step": gate["supervisor_cpu_ms"] / max(1, len(steps)),
            "slowdown_mean_pct": 100 * (m1 - m0) / m0, "offered": offered,
            "idle_s": idle_ns / 1e9, "idle_share": idle_ns / sum(r["end_ns"] - r["start_ns"]
                                                                 for r in steps),
            "outside_ms_per_step": outside_ns / 1e6 / max(1, n),
            "critical_bit_exact": res["critical_digest"] == alone[0],
            "guest_bit_exact": res["guest_digest"] == ref_guest}


def fmt_ms(x):
    return "n/a" if x is None else f"{x:.2f} ms"


def demo(b, out, steps):
    if out.exists():
        shutil.rmtree(out)
    t_start = time.monotonic()
    ch = f"omni-demo-{os.getpid()}"
    log(f"== [1/3] the critical job alone: omni_train, 2 elastic replicas, {steps} steps "
        "(the undisturbed reference), r1 killed and replaced as in the run with the guest")
    kill_at, preempt_at = int(steps * 0.35), int(steps * 0.6)
    alone = run_critical_alone(b, out / "alone", steps, kill_at)
    log(f"== [2/3] the same job publishing its windows (--window-channel {ch}) with a "
        "best-effort guest (colocate_guest) in them;\n   r1 is killed at step "
        f"{kill_at} and replaced, the guest is preempted at step {preempt_at}")
    res = colocated(b, out / "colocated", steps, "gated", ch, demo_hooks(kill_at, preempt_at))
    log(f"== [3/3] the guest alone for its {res['guest_steps']} steps (its undisturbed reference)")
    ref_guest, nominal = guest_reference(b, out / "guest_alone", res["guest_steps"])
    # The steps around the kill wait for the peer timeout and the rejoin, in
    # both runs, each at its own pace: leave the steps around either out.
    def kill_step(steps, marks):
        return next((r["step"] for r in steps if r["end_ns"] >= marks[0][0]), kill_at)
    k0, k1 = kill_step(alone[1][0], alone[3]), kill_step(res["steps"][0], res["marks"])
    s = summary(alone, res, ref_guest, nominal,
                skip=set(range(k0 - 1, k0 + 4)) | set(range(k1 - 1, k1 + 4)))
    if not s["critical_bit_exact"]:
        import numpy as np
        a = np.fromfile(out / "alone" / "r0.bin", dtype="<f4").astype(np.float64)
        c = np.fromfile(out / "colocated" / "r0.bin", dtype="<f4").astype(np.float64)
        s["critical_rel_l2"] = float(np.linalg.norm(a - c) / np.linalg.norm(a))
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
    st = s["stops"]
    cpu, wait = s["cpu_ms"], s["wait_ms"]
    rows = [
        ("critical median step alone / with guest",
         f"{s['alone_ms']:.1f} ms / {s['with_ms']:.1f} ms"),
        ("critical slowdown (step by step, median; of sums)",
         f"{s['paired_pct']:+.2f} %; {s['paired_sum_pct']:+.2f} %"),
        ("  r0's CPU per step alone / with guest", f"{fmt_ms(cpu[0])} / {fmt_ms(cpu[1])}"),
        ("  r0's wait for a core per step alone / with", f"{fmt_ms(wait[0])} / {fmt_ms(wait[1])}"),
        ("critical real idle time (r0's blocked data stalls)",
         f"{s['idle_s']:.2f} s ({100 * s['idle_share']:.1f} % of its steps)"),
        ("harvest (share of it the guest used)",
         f"{s['harvest']:.3f} (its CPU: {s['harvest_cpu'] or 0:.3f})"),
        ("  share in which the guest was running", f"{s['offered'] or 0:.3f}"),
        ("  its unit alone / co-located, warm (harvest by it)",
         f"{nominal / 1e6:.3f} / " + (f"{s['warm_unit_ms']:.3f} ms ({s['harvest_warm']:.3f})"
                                      if s["warm_unit_ms"] else "n/a")),
        ("guest steps done", f"{res['guest_steps']} (in {res['guest_runs']} runs)"),
        ("stops after a close", f"{st['stops']}"),
        ("  supervisor's signal after the close p50 / p99",
         f"{st['signal_p50_ms']:.3f} / {st['signal_p99_ms']:.3f} ms"),
        ("  guest CPU after the close p99 / max (bound)",
         f"{st['cpu_bound_p99_ms']:.3f} / {st['cpu_bound_max_ms']:.3f} ms"),
        ("  stop observed after the close p99 (wall)", f"{st['wall_p99_ms']:.2f} ms"),
        ("deadline misses (guest CPU after a close > 1 ms)", f"{st['misses']}"),
        ("  by wall time (observed stop > 1 ms after the close)", f"{st['wall_misses']}"),
        ("preemptions (guest exit 75, resumed)", "1"),
        ("supervisor CPU per critical step", f"{s['supervisor_ms_per_step']:.3f} ms"),
        ("the guest kept off the host's core by", guest_isolation()),
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
    a drift of the machine does not favour one side. Per pair, the slowdown
    step by step (paired_slowdown: the same step of both runs does the same
    work); the median over the pairs is reported. The noise floor: the same
    comparison between the alone runs of consecutive pairs (the job against
    itself): a slowdown below it is not resolved."""
    if out.exists():
        shutil.rmtree(out)
    t_start = time.monotonic()
    log(f"colocation bench: {pairs} alternating pairs (critical alone, with the gated guest), "
        f"then the guest plain and in SCHED_IDLE ({steps} steps each; cores {PIN or 'unpinned'}; "
        f"load average {os.getloadavg()[0]:.2f})")
    ch = f"omni-bench-{os.getpid()}"
    alone, gated, refs = [], [], []
    for i in range(pairs):
        for mode in (("alone", "gated") if i % 2 == 0 else ("gated", "alone")):
            log(f"  pair {i + 1}/{pairs}: {mode}")
            if mode == "alone":
                alone.append(run_critical_alone(b, out / f"alone{i}", steps))
            else:
                gated.append(colocated(b, out / f"gated{i}", steps, "gated", ch))
                # The guest alone on the same core right after, for as many
                # steps: its digest, and its speed at this time (the
                # machine's speed drifts between pairs by more than a resume
                # costs; one reference for all pairs would read as harvest).
                refs.append(guest_reference(b, out / f"guest_alone{i}", gated[-1]["guest_steps"]))
    results = {}
    for mode in ("plain", "idle"):
        log(f"  guest: {mode}")
        results[mode] = colocated(b, out / mode, steps, mode, ch)
    a_ms = [median_step_ms(a[1][0]) for a in alone]
    per_pair = [summary(alone[i], gated[i], refs[i][0], refs[i][1], alone_ms=a_ms[i])
                for i in range(pairs)]
    noise = [paired_slowdown(alone[i][1][0], alone[i + 1][1][0])[0] for i in range(pairs - 1)]
    # The baselines ran after the last pair: against its alone runs.
    base = {m: summary(alone[-1], r, refs[-1][0], refs[-1][1]) for m, r in results.items()}
    med = statistics.median

    def r(x, n=2):
        return None if x is None else round(x, n)

    def stop_sum(key):
        return sum(sp["stops"][key] for sp in per_pair)
    stops = [sp["stops"] for sp in per_pair]
    line = {
        "benchmark": "colocation", "steps": steps, "replicas": 2, "pairs": pairs,
        "cores": PIN or None, "guest_isolation": guest_isolation(),
        "load_avg_start": r(LOAD_AT_START), "load_avg_end": r(os.getloadavg()[0]),
        "critical_step_ms_alone": r(med(a_ms)),
        "critical_step_ms_with_guest": r(med(sp["with_ms"] for sp in per_pair)),
        "critical_slowdown_pct": r(med(sp["paired_pct"] for sp in per_pair)),
        # With n pairs, [min, max] of the pairs covers the median slowdown with
        # probability 1 - 2^(1-n) (a sign-test interval; 0.97 for 6 pairs).
        "critical_slowdown_pct_range": [r(min(sp["paired_pct"] for sp in per_pair)),
                                        r(max(sp["paired_pct"] for sp in per_pair))],
        "critical_slowdown_pct_pairs": [r(sp["paired_pct"]) for sp in per_pair],
        "critical_slowdown_pct_of_sums_pairs": [r(sp["paired_sum_pct"]) for sp in per_pair],
        "critical_slowdown_pct_of_medians_pairs": [r(sp["slowdown_pct"]) for sp in per_pair],
        "noise_floor_pct": r(med(abs(x) for x in noise)) if noise else None,
        "noise_pairs_pct": [r(x) for x in noise],
        "critical_cpu_ms_per_step": {"alone": r(med(sp["cpu_ms"][0] for sp in per_pair), 3),
                                     "with_guest": r(med(sp["cpu_ms"][1] for sp in per_pair), 3)},
        "critical_wait_ms_per_step": {"alone": r(med(sp["wait_ms"][0] for sp in per_pair), 3),
                                      "with_guest": r(med(sp["wait_ms"][1] for sp in per_pair), 3)},
        "harvest_fraction": r(med(sp["harvest"] for sp in per_pair), 3),
        "harvest_pairs": [r(sp["harvest"], 3) for sp in per_pair],
        "harvest_cpu": r(med(sp["harvest_cpu"] for sp in per_pair), 3),
        "harvest_offered": r(med(sp["offered"] for sp in per_pair), 3),
        "critical_idle_s": r(med(sp["idle_s"] for sp in per_pair)),
        "critical_idle_share": r(med(sp["idle_share"] for sp in per_pair), 4),
        "guest_outside_idle_ms_per_step": r(med(sp["outside_ms_per_step"] for sp in per_pair), 3),
        "guest_unit_ms_alone_pairs": [r(ref[1] / 1e6, 3) for ref in refs],
        # Diagnostics of the harvest: the guest's warm unit inside its runs
        # (co-located, at the same time) and the harvest against it.
        "guest_warm_unit_ms_pairs": [r(sp["warm_unit_ms"], 3) for sp in per_pair],
        "harvest_vs_warm_unit": r(med(hw) if (hw := [sp["harvest_warm"] for sp in per_pair
                                                     if sp["harvest_warm"] is not None])
                                  else None, 3),
        "guest_steps": gated[0]["guest_steps"],
        "guest_yields": stop_sum("stops"),
        "guest_cpu_after_close_p99_ms": r(max(x["cpu_bound_p99_ms"] for x in stops), 3),
        "guest_cpu_after_close_max_ms": r(max(x["cpu_bound_max_ms"] for x in stops), 3),
        "supervisor_signal_p99_ms": r(max(x["signal_p99_ms"] for x in stops), 3),
        "deadline_misses": stop_sum("misses"),
        "guest_yield_p99_ms": r(max(x["wall_p99_ms"] for x in stops)),
        "deadline_misses_wall": stop_sum("wall_misses"),
        "supervisor_cpu_ms_per_critical_step": r(med(sp["supervisor_ms_per_step"]
                                                     for sp in per_pair), 3),
        "critical_bit_exact": all(sp["critical_bit_exact"] for sp in per_pair) and
        len({a[0] for a in alone}) == 1,
        "guest_bit_exact": all(sp["guest_bit_exact"] for sp in per_pair),
        "baselines": {m: {"critical_slowdown_pct": r(base[m]["paired_pct"]),
                          "harvest_fraction": r(base[m]["harvest"], 3),
                          "critical_wait_ms_per_step": r(base[m]["wait_ms"][1], 3),
                          "guest_steps": results[m]["guest_steps"]}
                      for m in ("plain", "idle")},
        "wall_s": r(time.monotonic() - t_start, 1),
    }
    line["baselines"]["sched_idle"] = line["baselines"].pop("idle")
    print(json.dumps(line), flush=True)
    return 0


def main(argv=None, mode="bench"):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default=str(REPO / "build"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=None,
                    help="critical steps per run (demo 120, bench 150)")
    ap.add_argument("--pairs", type=int, default=6, help="bench: alternating pairs (default 6)")
    ap.add_argument("--old-setup", action="store_true",
                    help="every process in this session, the paused trainer in the normal class "
                         "(the setup of the earlier figures)")
    ap.add_argument("--guest-isolation", choices=("cgroup", "autogroup"), default="cgroup",
                    help="the best-effort guest in a cgroup with cpu.idle 1 where one can be made "
                         "(default), or in a session at autogroup nice 19")
    a = ap.parse_args(argv)
    # Stopped from outside: end the children too (they run in sessions of
    # their own, out of reach of a terminal's signals).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    global OLD_SETUP, USE_CGROUP
    OLD_SETUP = a.old_setup
    USE_CGROUP = a.guest_isolation == "cgroup"
    b = pathlib.Path(a.build).resolve() / "bin"
    for exe in ("omni_train", "colocate_guest", "omni"):
        if not (b / exe).exists():
            sys.exit(f"{b / exe} not built")
    out = pathlib.Path(a.out or pathlib.Path(a.build) / mode / "colocation").resolve()
    if mode == "demo":
        return demo(b, out, a.steps or 120)
    return bench(b, out, a.steps or 150, max(1, a.pairs))


if __name__ == "__main__":
    sys.exit(main())
