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
from colocation_bench import idle_intervals, step_records  # noqa: E402

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


def test_a_gated_guest_starts_steps_only_in_the_hosts_idle_windows(tmp_path):
    channel = f"omni-it-{os.getpid()}"
    host = subprocess.Popen([str(HOST), "--steps", "60", "--eval-every", "10", "--quiet",
                             "--log", str(tmp_path / "host.jsonl"), "--window-channel", channel],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    g = subprocess.Popen(guest(tmp_path, "--channel", channel, "--unit-ms", 5, steps=10**6),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, herr = host.communicate(timeout=240)
    assert host.returncode == 0, herr
    _, gerr = g.communicate(timeout=60)
    assert g.returncode == 75, gerr  # the host finished: saved, resumable
    assert "the host finished" in gerr
    windows = idle_intervals(*step_records(tmp_path / "host.jsonl"))
    done = units(tmp_path)
    assert done, f"the guest never ran: {gerr}"
    # A step starts while a window is open; the watcher reads the channel
    # every 0.5 ms, so a start may trail a close by that poll (plus the
    # scheduler's delay on a loaded machine: 5 ms allowed).
    slack = 5_000_000
    outside = [u for u in done
               if not any(a <= u["start_ns"] < e + slack for a, e, _ in windows)]
    assert not outside, f"{len(outside)} of {len(done)} steps started outside the windows"


def test_a_paused_guest_runs_only_from_a_stalls_open_to_its_close(tmp_path):
    """--pause --until-close beside a host whose data stalls block: the
    supervisor continues the trainer at a stall's open and stops it at the
    close; every run starts inside one of the host's data stalls, and the
    guest saves and exits 75 when the host finishes."""
    channel = f"omni-it-pause-{os.getpid()}"
    host = subprocess.Popen([str(HOST), "--steps", "40", "--eval-every", "10", "--quiet",
                             "--stall-io", "--stall-scale", "4",
                             "--log", str(tmp_path / "host.jsonl"), "--window-channel", channel],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs_log = tmp_path / "runs.jsonl"
    g = subprocess.Popen([str(GUEST), "--pause", "--until-close",
                          *guest(tmp_path, "--channel", channel, "--kinds", "data_stall",
                                 "--poll-ms", 20, "--runs-log", runs_log, steps=10**6)[1:]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
