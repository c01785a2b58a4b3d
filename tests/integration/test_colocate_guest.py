"""colocate_guest: real processes. It resumes bit-exactly after a preemption
(SIGTERM or a scheduler's notice), and, attached to a real omni_train host's
window channel, it starts its steps only inside the host's idle windows."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("OMNI_BIN_DIR", str(REPO / "build" / "bin")))
GUEST = BIN_DIR / "colocate_guest"
HOST = BIN_DIR / "omni_train"
FINAL_RE = re.compile(r"^final step=(\d+) params_xxh3=([0-9a-f]{16}) loss=(-?\d+\.\d+)$")
sys.path.insert(0, str(REPO / "benchmarks"))
from colocation_bench import idle_intervals, step_records, trainer_ready  # noqa: E402

pytestmark = pytest.mark.skipif(not (GUEST.exists() and HOST.exists()),
                                reason=f"{GUEST} or {HOST} not built")
STEPS = 400


def guest(d, *extra, steps=STEPS):
    return [str(GUEST), "--ckpt-dir", str(d / "ckpt"), "--steps", str(steps), "--hidden", "64",
            "--batch", "32", "--log", str(d / "units.jsonl"), *map(str, extra)]


def final(stdout):
    m = FINAL_RE.match(stdout.rstrip("\n").split("\n")[-1])
    assert m, f"no final line in {stdout!r}"
    return int(m.group(1)), m.group(2)


def units(d):
    f = d / "units.jsonl"
    # Whole lines only: the guest may be writing the last one.
    return [json.loads(x) for x in f.read_text().split("\n")[:-1]] if f.exists() else []


@pytest.fixture
def reaped():
    """Registers processes started by a test; those still running when it
    ends (a failed assertion) are killed, not left to their --attach-s."""
    procs = []

    def register(p):
        procs.append(p)
        return p

    yield register
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    p = subprocess.run(guest(d), capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    return final(p.stdout)


def started_with_a_notice_file(d):
    """An ungated guest reading d/notice.json, once it has done 50 steps."""
    p = subprocess.Popen(guest(d, "--notice-file", d / "notice.json"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(units(d)) < 50:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1]
        time.sleep(0.01)
    return p, d / "notice.json"


def write_notice(path, text):
    """As a scheduler does: a temporary file renamed into place."""
    (path.parent / "n.tmp").write_text(text)
    (path.parent / "n.tmp").rename(path)


@pytest.mark.parametrize("how", ["sigterm", "notice"])
def test_a_preempted_guest_saves_exits_75_and_resumes_bit_exactly(tmp_path, reference, how):
    p, notice = started_with_a_notice_file(tmp_path)
    if how == "sigterm":
        p.send_signal(signal.SIGTERM)
    else:
        write_notice(notice, '{"yield_in_s": 10}')
    out, err = p.communicate(timeout=60)
    assert p.returncode == 75, err
    saved = int(re.search(r"saved step=(\d+)", err).group(1))
    assert 50 <= saved < STEPS, err
    assert out == "", "no final line when preempted"
    if notice.exists():
        notice.unlink()  # the scheduler withdraws it before starting the guest again
    again = subprocess.run(guest(tmp_path), capture_output=True, text=True, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert f"resumed at step {saved}" in again.stderr
    assert final(again.stdout) == reference
    assert [u["step"] for u in units(tmp_path)] == list(range(STEPS)), "no step lost or repeated"


def test_a_notice_to_leave_now_exits_76_without_a_save_and_the_work_is_redone(tmp_path, reference):
    """{"yield_in_s": 0} (the policy's "now, without a save"): no checkpoint
    is written; started again, the guest redoes the steps from its last
    checkpoint (none here: from the start) and still ends bit-identical."""
    p, notice = started_with_a_notice_file(tmp_path)
    write_notice(notice, '{"yield_in_s": 0}')
    _, err = p.communicate(timeout=60)
    assert p.returncode == 76, err
    assert "no time to save" in err and "saved step=" not in err, err
    assert not list((tmp_path / "ckpt").glob("step-*")), "nothing saved"
    notice.unlink()
    again = subprocess.run(guest(tmp_path), capture_output=True, text=True, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert "resumed at step" not in again.stderr
    assert final(again.stdout) == reference


def assert_steps_started_in_windows(d, gerr, slack_ns):
    """Every guest step (d/units.jsonl) started inside one of the host's idle
    windows (d/host.jsonl), or at most slack_ns after its close."""
    windows = idle_intervals(*step_records(d / "host.jsonl"))
    done = units(d)
    assert done, f"the guest never ran: {gerr}"
    outside = [u for u in done
               if not any(a <= u["start_ns"] < e + slack_ns for a, e, _ in windows)]
    assert not outside, f"{len(outside)} of {len(done)} steps started outside the windows"


def test_a_gated_guest_starts_steps_only_in_the_hosts_idle_windows(tmp_path, reaped):
    channel = f"omni-it-{os.getpid()}"
    gerr_path = tmp_path / "guest.err"
    with gerr_path.open("w") as gerr_file:
        g = reaped(subprocess.Popen(guest(tmp_path, "--channel", channel, "--unit-ms", 5,
                                          "--attach-s", 120, steps=10**6),
                                    stdout=subprocess.PIPE, stderr=gerr_file, text=True))

    def waits_for_its_host():
        assert g.poll() is None, f"the guest exited {g.returncode}: {gerr_path.read_text()}"
        return "waiting up to" in gerr_path.read_text()

    # Its start (LibTorch, its model) can outlast the host on a loaded
    # machine: the host starts once the guest waits for it.
    wait_for(waits_for_its_host, "the guest waiting for its host", 120)
    # An eval every 5 steps: a loaded machine lengthens the host's warm-up
    # (16-26 steps), whose steps its tables leave out, and an eval's claim
    # grows with the evals measured after it.
    host = reaped(subprocess.Popen([str(HOST), "--steps", "80", "--eval-every", "5", "--quiet",
                                    "--log", str(tmp_path / "host.jsonl"),
                                    "--window-channel", channel],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    _, herr = host.communicate(timeout=240)
    assert host.returncode == 0, herr
    g.communicate(timeout=60)
    gerr = gerr_path.read_text()
    assert g.returncode == 75, gerr  # the host finished: saved, resumable
    assert "the host finished" in gerr
    # A step starts while a window is open; the watcher reads the channel
    # every 0.5 ms, so a start may trail a close by that poll (plus the
    # scheduler's delay on a loaded machine: 5 ms allowed).
    assert_steps_started_in_windows(tmp_path, gerr, slack_ns=5_000_000)


def test_a_paused_guest_runs_only_from_a_stalls_open_to_its_close(tmp_path, reaped):
    """--pause --until-close beside a host whose data stalls block: the
    supervisor continues the trainer at a stall's open and stops it at the
    close; every run starts inside one of the host's data stalls, and the
    guest saves and exits 75 when the host finishes."""
    channel = f"omni-it-pause-{os.getpid()}"
    runs_log = tmp_path / "runs.jsonl"
    g = reaped(subprocess.Popen([str(GUEST), "--pause", "--until-close",
                                 *guest(tmp_path, "--channel", channel, "--kinds", "data_stall",
                                        "--poll-ms", 20, "--runs-log", runs_log,
                                        "--attach-s", 120, steps=10**6)[1:]],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    # The trainer starts in the idle class: on a loaded machine its start can
    # outlast a host started beside it (the guest then never runs). The host
    # starts once the trainer is ready, as a scheduler's guest would be.
    wait_for(lambda: trainer_ready(g.pid), "the trainer stopped for its supervisor", 120, g)
    host = reaped(subprocess.Popen([str(HOST), "--steps", "40", "--eval-every", "10", "--quiet",
                                    "--stall-io", "--stall-scale", "4",
                                    "--log", str(tmp_path / "host.jsonl"),
                                    "--window-channel", channel],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    _, herr = host.communicate(timeout=240)
    assert host.returncode == 0, herr
    _, gerr = g.communicate(timeout=60)
    assert g.returncode == 75, gerr
    steps, idle = step_records(tmp_path / "host.jsonl")
    stalls = idle_intervals(steps, idle, {"data_wait"})
    runs = [json.loads(x) for x in runs_log.read_text().splitlines() if x.strip()]
    assert runs, f"the guest never ran: {gerr}"
    # A run starts after a stall opened and before it closed (the doorbell
    # wakes the supervisor; 5 ms allowed for a loaded machine's scheduler).
    slack = 5_000_000
    outside = [r for r in runs
               if not any(a <= r["resume_ns"] < e + slack for a, e, _ in stalls)]
    assert not outside, f"{len(outside)} of {len(runs)} runs began outside the host's stalls"
    assert all(r["stop_ns"] >= r["resume_ns"] for r in runs)
    assert "supervisor resumes=" in gerr


def test_a_paused_guest_told_to_yield_while_it_waits_for_its_host_saves_and_exits_75(tmp_path):
    """--pause with no host yet (or one that finished while the guest was
    starting): the supervisor waits for the channel to appear (--attach-s);
    a SIGTERM meanwhile is a preemption, not an error. Before: the wait
    ignored the signal and, after --attach-s, the guest failed with exit 1
    ("window channel ... does not exist"), as the demo's restarted guest did
    when the host ended first."""
    g = subprocess.Popen([str(GUEST), "--pause", "--until-close",
                          *guest(tmp_path, "--channel", f"omni-it-nohost-{os.getpid()}",
                                 "--attach-s", 60, steps=10**6)[1:]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: trainer_ready(g.pid), "the trainer stopped for its supervisor", 60, g)
    started = time.monotonic()
    g.send_signal(signal.SIGTERM)
    _, err = g.communicate(timeout=30)
    assert g.returncode == 75, err
    assert time.monotonic() - started < 10, "it waited out --attach-s"
    assert "does not exist" not in err


# ---- a host busy for longer than the guest will wait (--max-wait-s):
# the guest saves, exits 75 and, started again, resumes bit-exactly.

def import_omni():
    """The Python module of this build (<build>/python), for a Python host."""
    sys.path.insert(0, str(BIN_DIR.parent / "python"))
    try:
        import omni  # noqa: PLC0415
    except ImportError as e:
        pytest.skip(f"no omni Python module in {BIN_DIR.parent / 'python'}: {e}")
    return omni


def wait_for(pred, what, timeout_s, proc=None):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert proc is None or proc.poll() is None, f"exited before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.005)


def resumed_bit_exactly(d, saved, reference):
    """Started again, ungated: it resumes at `saved` and ends as an
    uninterrupted run, no step lost or repeated."""
    again = subprocess.run(guest(d), capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    assert f"resumed at step {saved}" in again.stderr or saved == 0, again.stderr
    assert final(again.stdout) == reference
    assert [u["step"] for u in units(d)] == list(range(STEPS)), "no step lost or repeated"


@pytest.mark.parametrize("mode", ["gated", "pause"])
def test_a_guest_whose_host_announces_a_long_busy_period_saves_exits_75_and_resumes(
        tmp_path, reference, mode):
    """A Python host (this process) with 30 ms data stalls; once the guest has
    done 20 steps in them it announces 10 minutes without idle time
    (Telemetry.announce_busy) and computes on. A guest that waits at most
    30 s leaves at once (not after 30 s), by the announcement: it saves,
    exits 75, and started again resumes bit-exactly. --pause: the supervisor
    decides while the trainer is stopped and tells it with SIGUSR2."""
    omni = import_omni()
    import threading  # noqa: PLC0415
    channel = f"omni-it-busy-{mode}-{os.getpid()}"
    tel = omni.Telemetry(window_channel=channel, warmup_min_steps=0, warmup_max_steps=0,
                         publish_interval_s=0.0)
    idle, stop = threading.Event(), threading.Event()
    idle.set()

    def host():
        while not stop.is_set():
            with tel.step():
                if idle.is_set():
                    with tel.phase(omni.DATA_WAIT):
                        time.sleep(0.03)
                with tel.phase(omni.COMPUTE):
                    time.sleep(0.01)

    trainer = threading.Thread(target=host)
    trainer.start()
    g = None
    try:
        pause = ["--pause"] if mode == "pause" else []
        g = subprocess.Popen([str(GUEST), *pause,
                              *guest(tmp_path, "--channel", channel, "--kinds", "data_stall",
                                     "--unit-ms", 5, "--max-wait-s", 30)[1:]],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(units(tmp_path)) >= 20, "20 guest steps", 120, g)
        tel.announce_busy(time.monotonic_ns() + 600 * 10**9)
        idle.clear()  # its busy period: compute only
        announced = time.monotonic()
        out, err = g.communicate(timeout=60)
        left_after_s = time.monotonic() - announced
    finally:
        if g is not None and g.poll() is None:
            g.kill()
        stop.set()
        trainer.join()
        tel.close()
    assert g.returncode == 75, err
    assert out == "", "no final line when it leaves"
    m = re.search(r"the host is busy for at least (\d+\.\d) s \(it announced a busy period", err)
    assert m, err
    assert 500 < float(m.group(1)) <= 600, err
    assert left_after_s < 30, "it left on the announcement, not after waiting --max-wait-s"
    saved = int(re.search(r"saved step=(\d+)", err).group(1))
    assert 20 <= saved < STEPS, err
    assert len(units(tmp_path)) == saved, "it saved every step it did"
    resumed_bit_exactly(tmp_path, saved, reference)


def host_steps(path):
    """The steps an omni_train host's step log has recorded so far."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # whole lines only
    return [r["step"] for r in map(json.loads, lines) if r.get("type") == "step"]


def test_a_guest_of_evals_leaves_when_the_hosts_forecast_has_none_within_max_wait(
        tmp_path, reference):
    """An omni_train host evaluating every 200 steps (about 4 s apart on this
    trainer) publishes with each forecast when its next eval can start. A
    guest of eval windows that waits at most 0.5 s, started after the host's
    first eval, reads that the next one is seconds away and leaves at its
    first wait: it saves, exits 75 naming the forecast, and started again
    resumes bit-exactly."""
    channel = f"omni-it-outlook-{os.getpid()}"
    log = tmp_path / "host.jsonl"
    host = subprocess.Popen([str(HOST), "--steps", "600", "--eval-every", "200", "--quiet",
                             "--log", str(log), "--window-channel", channel],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(s >= 200 for s in host_steps(log)), "host eval", 240, host)
        g = subprocess.run(guest(tmp_path, "--channel", channel, "--kinds", "eval",
                                 "--max-wait-s", 0.5),
                           capture_output=True, text=True, timeout=120, check=False)
        at_exit = max(host_steps(log))
    finally:
        host.kill()
        host.communicate()
    assert g.returncode == 75, g.stderr
    assert at_exit < 399, f"the host reached its next eval ({at_exit}) first: load too high?"
    m = re.search(r"the host is busy for at least (\d+\.\d) s \(its forecast lists no window of "
                  r"the kinds before then; kinds eval", g.stderr)
    assert m, g.stderr
    assert 0.5 < float(m.group(1)) < 60, g.stderr
    saved = int(re.search(r"saved step=(\d+)", g.stderr).group(1))
    assert saved == len(units(tmp_path)), "it saved every step it did"
    resumed_bit_exactly(tmp_path, saved, reference)


def test_a_guest_on_another_host_reads_the_hosts_windows_from_its_store(tmp_path):
    # The host publishes under a prefix of its elastic store (--publish-prefix);
    # the guest reads the store keys, as a guest on another machine would
    # through a shared file system or the host's TCP store.
    # An eval every 5 steps: 16 windows, most of them claimed once 3 were
    # measured, so that a loaded machine (the store's reads and the host's
    # worker delayed) still leaves the guest windows to use.
    store = f"file://{tmp_path / 'store'}"
    host = subprocess.Popen([str(HOST), "--steps", "80", "--eval-every", "5", "--quiet",
                             "--store", store, "--replica-id", "r0", "--min-replicas", "1",
                             "--max-replicas", "1", "--publish-prefix", "omni/telemetry/r0",
                             "--log", str(tmp_path / "host.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    g = subprocess.Popen(guest(tmp_path, "--store", store, "--store-prefix", "omni/telemetry/r0",
                               "--unit-ms", 5, steps=10**6),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, herr = host.communicate(timeout=240)
    assert host.returncode == 0, herr
    _, gerr = g.communicate(timeout=60)
    assert g.returncode == 75, gerr  # the host finished (its outlook's last copy says so)
    assert "the host finished" in gerr
    # A close reaches the guest one store poll (5 ms) after the host's worker
    # published it (up to 2 ms after the close), plus the scheduler's delay
    # on a loaded machine: 20 ms allowed.
    assert_steps_started_in_windows(tmp_path, gerr, slack_ns=20_000_000)
