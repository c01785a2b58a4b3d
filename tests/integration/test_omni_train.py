"""Integration tests of the example trainer omni_train (LibTorch build).

Run with Debian's interpreter:
    OMNI_BIN_DIR=build/bin /usr/bin/python3 -m pytest tests/integration -q
OMNI_BIN_DIR defaults to <repo>/build/bin. The tests are skipped when the
binary was not built (a build without LibTorch).
"""

import json
import math
import os
import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("OMNI_BIN_DIR", str(REPO / "build" / "bin")))
TRAINER = BIN_DIR / "omni_train"

FINAL_RE = re.compile(r"^final step=(\d+) params_xxh3=([0-9a-f]{16}) loss=(-?\d+\.\d+)$")

pytestmark = pytest.mark.skipif(
    not TRAINER.exists(), reason=f"{TRAINER} not built (set OMNI_BIN_DIR)")


def run(*args, timeout=60):
    return subprocess.run([str(TRAINER), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_ok(*args, timeout=60):
    proc = run(*args, timeout=timeout)
    assert proc.returncode == 0, f"omni_train {' '.join(map(str, args))} failed:\n{proc.stderr}"
    return proc


def final_line(proc):
    lines = proc.stdout.rstrip("\n").split("\n")
    match = FINAL_RE.match(lines[-1])
    assert match, f"bad final line: {lines[-1]!r}"
    return match


def test_final_line_format_and_determinism():
    a = run_ok("--steps", 80, "--quiet")
    b = run_ok("--steps", 80, "--quiet")
    assert a.stdout == b.stdout
    match = final_line(a)
    assert match.group(1) == "80"
    assert math.isfinite(float(match.group(3)))
    # --quiet prints only the final line.
    assert a.stdout.count("\n") == 1


def test_different_seed_gives_different_digest():
    a = final_line(run_ok("--steps", 60, "--quiet", "--seed", 1))
    b = final_line(run_ok("--steps", 60, "--quiet", "--seed", 2))
    assert a.group(2) != b.group(2)


def test_text_only_is_deterministic_and_stall_scale_changes_timing_only():
    a = final_line(run_ok("--steps", 60, "--quiet", "--text-only"))
    b = final_line(run_ok("--steps", 60, "--quiet", "--text-only"))
    assert a.group(0) == b.group(0)
    # The decode cost never changes the pixels: same parameters without it.
    c = final_line(run_ok("--steps", 60, "--quiet", "--stall-scale", 0))
    d = final_line(run_ok("--steps", 60, "--quiet", "--stall-scale", 2))
    assert c.group(0) == d.group(0)
    assert c.group(2) != a.group(2)  # images do change the model


def load_trace(path):
    """Chrome trace JSON: an array (the closing bracket may be missing) or an
    object with "traceEvents"."""
    text = path.read_text().strip()
    if text.startswith("["):
        if not text.endswith("]"):
            text = text.rstrip().rstrip(",") + "]"
        events = json.loads(text)
    else:
        events = json.loads(text)["traceEvents"]
    assert isinstance(events, list)
    return events


def test_step_log_trace_and_forecast_files(tmp_path):
    steps = 60
    log, trace, forecast = tmp_path / "steps.jsonl", tmp_path / "trace.json", tmp_path / "fc.json"
    proc = run_ok("--steps", steps, "--eval-every", 20, "--log", log, "--trace", trace,
                  "--forecast", forecast)
    assert str(log) in proc.stdout and str(trace) in proc.stdout

    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert records[0]["type"] == "header"
    step_lines = [r for r in records if r.get("type") == "step"]
    assert len(step_lines) == steps

    events = load_trace(trace)
    assert events, "empty trace"
    names = {e.get("name") for e in events if isinstance(e, dict)}
    assert {"data_wait", "compute", "optimizer"} <= names, names

    if forecast.exists():  # published only once the statistics are stationary
        json.loads(forecast.read_text())


def test_loss_goes_down_and_report():
    proc = run_ok("--steps", 300, timeout=120)
    losses = [float(m.group(1)) for m in re.finditer(r"^train step=\d+ loss=(\S+)$",
                                                      proc.stdout, re.M)]
    first = losses[0]
    last = float(final_line(proc).group(3))
    assert first > 3.5  # about ln(64) at initialization
    assert last < 0.6 * first, (first, last)
    assert "data_wait" in proc.stdout  # the statistics table
    assert re.search(r"^eval  step=299 ", proc.stdout, re.M)


@pytest.mark.parametrize("args, flag", [
    (["--bogus"], "--bogus"),
    (["--steps", "abc"], "--steps"),
    (["--steps=0"], "--steps"),
    (["--lr", "-1"], "--lr"),
    (["--stall-scale", "nan"], "--stall-scale"),
    (["--batch"], "--batch"),
    (["--quiet=1"], "--quiet"),
    (["--ckpt-every-s", "0", "--ckpt-dir", "/tmp/unused"], "--ckpt-every-s"),
])
def test_bad_flags_exit_2_and_name_the_flag(args, flag):
    proc = run(*args, timeout=30)
    assert proc.returncode == 2, proc
    assert flag in proc.stderr, proc.stderr
    assert "final step=" not in proc.stdout


def test_checkpoints_by_wall_time_resume_to_the_undisturbed_parameters(tmp_path):
    flags = ["--steps", 100, "--text-only", "--eval-every", 0, "--quiet"]
    ref = final_line(run_ok(*flags))
    ckpt, log = tmp_path / "ckpt", tmp_path / "steps.jsonl"
    run_ok(*flags, "--ckpt-dir", ckpt, "--ckpt-every-s", 0.2, "--keep", 1000, "--log", log)
    saved = sorted(int(p.name[len("step-"):]) for p in ckpt.glob("step-*"))
    assert saved and saved[-1] < 100, saved  # none at the end
    records = [json.loads(line) for line in log.read_text().splitlines()]
    declared = records[0]["events"]["checkpoint"]
    assert (declared["every_steps"], declared["every_ns"]) == (0, 200_000_000), declared
    # Each save ran inside the step before it (the step's checkpoint phase).
    in_steps = [r["step"] for r in records[1:] if r.get("kind") == "checkpoint"]
    assert in_steps == [s - 1 for s in saved], (in_steps, saved)
    # Resumed from the newest, the job ends where the undisturbed one does.
    resumed = run_ok(*flags, "--ckpt-dir", ckpt, "--ckpt-every-s", 0.2)
    assert f"(step {saved[-1]})" in resumed.stderr, resumed.stderr
    assert final_line(resumed).group(2) == ref.group(2)


def test_help():
    proc = run("--help", timeout=30)
    assert proc.returncode == 0
    assert "--stall-scale" in proc.stdout and "--eval-every" in proc.stdout


def test_unwritable_log_path_exits_1(tmp_path):
    proc = run("--steps", 5, "--log", tmp_path / "missing-dir" / "steps.jsonl", timeout=30)
    assert proc.returncode == 1, proc
    assert "missing-dir" in proc.stderr
