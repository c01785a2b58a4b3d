"""Issue 13, items 5 and 7: elastic replicas whose store fails stop at their
next boundary with a checkpoint (exit 75, resumable) instead of exiting 1
without one, or forking the job.

Real omni_train processes: a FileStore whose files are deleted under the
running job, and a tcp:// store served by the replica that is then killed.
"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("OMNI_BIN_DIR", str(REPO / "build" / "bin")))
TRAINER = BIN_DIR / "omni_train"

pytestmark = pytest.mark.skipif(not TRAINER.exists(), reason=f"{TRAINER} not built")

BASE = ["--seed", "3", "--batch", "8", "--text-only", "--eval-every", "0", "--quiet",
        "--lr", "0.003", "--steps", "100000", "--heartbeat-ms", "50", "--peer-timeout-ms", "600",
        "--min-replicas", "1"]


def launch(tmp, store, rid):
    err = tmp / f"{rid}.err"
    loss = tmp / f"{rid}.loss"
    args = [str(TRAINER), *BASE, "--store", store, "--replica-id", rid, "--ckpt-dir",
            str(tmp / f"ckpt-{rid}"), "--loss-log", str(loss)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(err, "w"))
    return proc, err, loss


def wait_lines(path, proc, n, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, "exited early"
        time.sleep(0.01)
    raise AssertionError(f"{path} did not reach {n} lines")


def assert_saved_and_resumable(proc, err, timeout=60):
    rc = proc.wait(timeout=timeout)
    text = err.read_text()
    assert rc == 75, f"exit {rc}\n{text}"
    assert "store failure" in text, text
    m = re.search(r"saved step (\d+) to (\S+) in [0-9.]+ ms; exiting 75", text)
    assert m, text
    step = int(m.group(1))
    assert step >= 10, text
    assert (pathlib.Path(m.group(2)) / f"step-{step:012d}" / "manifest.json").exists(), text
    return text


def test_store_files_deleted_under_the_job_stop_the_replicas_with_a_checkpoint(tmp_path):
    store = tmp_path / "store"
    reps = [launch(tmp_path, f"file://{store}", rid) for rid in ("r0", "r1")]
    for proc, _, loss in reps:
        wait_lines(loss, proc, 10)
    for entry in store.iterdir():
        if not entry.name.startswith(".lock"):  # the keys, not the lock files
            # A writer's temporary file may be renamed into its key between
            # the listing and the unlink (a heartbeat): gone already is fine.
            entry.unlink(missing_ok=True)
    for proc, err, _ in reps:
        text = assert_saved_and_resumable(proc, err)
        assert "'incarnation'" in text, text


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_survivors_of_the_replica_serving_the_store_stop_with_a_checkpoint(tmp_path):
    port = free_port()
    server = launch(tmp_path, f"tcp://127.0.0.1:{port}?server=1", "r0")
    time.sleep(0.5)
    survivor = launch(tmp_path, f"tcp://127.0.0.1:{port}", "r1")
    wait_lines(survivor[2], survivor[0], 10)
    server[0].send_signal(signal.SIGKILL)
    server[0].wait()
    assert_saved_and_resumable(survivor[0], survivor[1])
