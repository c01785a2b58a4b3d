"""The example examples/python/train_images.py as a user runs it: a DataLoader
with worker processes, evals and checkpoints through omni.Runtime. Stopped by
SIGTERM in the middle of an epoch and started again, it ends on the same
parameters as a run that was never stopped; its step log marks the data
waits and the evals that the forecasts are about."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_images.py")
FINAL = re.compile(r"^final step=(\d+) params_xxh3=([0-9a-f]{16}) accuracy=(\S+)$", re.M)
# 16 batches an epoch: a stop lands mid-epoch 15 times in 16.
SMALL = ["--steps", "120", "--samples", "512", "--batch", "32", "--workers", "1",
         "--eval-every", "40", "--ckpt-every", "50"]


def _run(args, env=None):
    full = dict(os.environ)
    for key in ("OMNI_CKPT_DIR", "OMNI_STORE", "OMNI_REPLICA_ID", "RANK", "WORLD_SIZE"):
        full.pop(key, None)
    full.update(env or {})
    return subprocess.Popen([sys.executable, EXAMPLE, *map(str, args)], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _steps_logged(path):
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if '"type":"step"' in line)


@pytest.mark.slow
def test_the_image_example_resumes_bit_exactly_after_sigterm_mid_epoch(tmp_path):
    pytest.importorskip("torch")
    ref = _run(SMALL + ["--ckpt-dir", tmp_path / "ref"])
    out, _ = ref.communicate(timeout=180)
    assert ref.returncode == 0, out
    want = FINAL.findall(out)
    assert len(want) == 1 and want[0][0] == "120", out

    log = str(tmp_path / "steps.jsonl")
    ckpt = tmp_path / "ckpt"
    # A grace shorter than the rest of the run: it stops at a step boundary
    # with a save instead of finishing.
    proc = _run(SMALL + ["--ckpt-dir", ckpt, "--step-log", log],
                env={"OMNI_PREEMPT_GRACE_S": "0.3"})
    deadline = time.monotonic() + 120
    while _steps_logged(log) < 40 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    stopped = re.search(r"saved step (\d+)", out)
    assert stopped is not None and 40 <= int(stopped.group(1)) < 120, out

    again = _run(SMALL + ["--ckpt-dir", ckpt])
    out2, _ = again.communicate(timeout=180)
    assert again.returncode == 0, out2
    assert f"(step {stopped.group(1)})" in out2, out2
    assert FINAL.findall(out2) == want, (out, out2)

    with open(log) as f:
        records = [json.loads(line) for line in f]
    steps = [r for r in records if r.get("type") == "step"]
    phases = {s["phase"] for r in steps for s in r["spans"]}
    assert {"data_wait", "compute", "optimizer", "eval"} <= phases, phases
    assert [r["step"] for r in steps if r["kind"] == "eval"][:1] == [39]
