"""Job-level checkpoints (issue 10): real omni_train replicas of an elastic
job share one --ckpt-dir. SIGTERM to one of two replicas stops both at one
agreed boundary with one checkpoint that both wrote (each about half of the
replicated state, its own RNG part); two replicas resume from it bit-exactly
(compared to a run that was never stopped), one replica resumes from it and
the step continues. `omni ckpt ls|verify|show` read it.
"""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("OMNI_BIN_DIR", str(REPO / "build" / "bin")))
TRAINER = BIN_DIR / "omni_train"
OMNI = BIN_DIR / "omni"
FINAL_RE = re.compile(r"^final step=(\d+) params_xxh3=([0-9a-f]{16}) loss=(-?\d+\.\d+)$")

pytestmark = pytest.mark.skipif(not TRAINER.exists() or not OMNI.exists(),
                                reason=f"{TRAINER} or {OMNI} not built")

STEPS = 120
BASE = ["--steps", STEPS, "--seed", 3, "--batch", 8, "--text-only", "--eval-every", 0,
        "--quiet", "--lr", "0.003", "--heartbeat-ms", 50, "--peer-timeout-ms", 600,
        "--max-replicas", 2]


def final(stdout):
    m = FINAL_RE.match(stdout.rstrip("\n").split("\n")[-1])
    assert m, f"no final line in {stdout!r}"
    return int(m.group(1)), m.group(2)


class Replica:
    def __init__(self, tmp, store, rid, *extra, env=None):
        self.rid = rid
        self.loss = tmp / f"{rid}.loss"
        self.err = tmp / f"{rid}.err"
        self.out = tmp / f"{rid}.out"
        args = [str(TRAINER), *map(str, BASE), "--store", f"file://{store}", "--replica-id", rid,
                "--loss-log", str(self.loss), *map(str, extra)]
        self.proc = subprocess.Popen(args, stdout=open(self.out, "w"), stderr=open(self.err, "w"),
                                     env=env)

    def steps(self):
        return len(self.loss.read_text().splitlines()) if self.loss.exists() else 0

    def wait(self, timeout=300):
        rc = self.proc.wait(timeout=timeout)
        return rc, self.out.read_text(), self.err.read_text()


def group(tmp, store, n, *extra, env=None):
    return [Replica(tmp, store, f"r{i}", "--min-replicas", n, *extra, env=env) for i in range(n)]


def omni(*args):
    return subprocess.run([str(OMNI), *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


def test_two_replicas_share_one_dir_resume_bit_exactly_with_two_and_go_on_with_one(tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref_dir.mkdir()
    run_dir.mkdir()
    ref = set()
    for r in group(ref_dir, ref_dir / "store", 2):
        rc, out, err = r.wait()
        assert rc == 0, err
        ref.add(final(out))
    assert len(ref) == 1
    ref_final = ref.pop()

    ckpt = run_dir / "ckpt"
    env = dict(os.environ, OMNI_PREEMPT_GRACE_S="1.0")  # room for the save under load
    reps = group(run_dir, run_dir / "store1", 2, "--ckpt-dir", ckpt, env=env)
    deadline = time.monotonic() + 120
    while reps[1].steps() < 20:
        assert time.monotonic() < deadline and reps[1].proc.poll() is None, reps[1].err.read_text()
        time.sleep(0.005)
    # Only r1 is told. Twice: the first signal lets the job use its grace
    # for progress, and the remaining 100 steps fit in 1 s on a fast
    # machine (the job then finished, or stopped at its last step: this
    # test failed 1 run in 4 on 2026-12-04); the second saves at the next
    # boundary (docs/preemption.md).
    reps[1].proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    reps[1].proc.send_signal(signal.SIGTERM)
    saved = set()
    for r in reps:
        rc, _, err = r.wait(timeout=120)
        assert rc == 75, f"{r.rid}: exit {rc}\n{err}"
        m = re.search(r"saved step (\d+) to ", err)
        assert m, err
        saved.add(int(m.group(1)))
    assert len(saved) == 1, saved
    step = saved.pop()
    assert 20 < step < STEPS
    step_dir = ckpt / f"step-{step:012d}"
    assert sorted(p.name for p in step_dir.iterdir()) == [
        "manifest.json", "part-00000.safetensors", "part-00001.safetensors"]
    assert not list(ckpt.glob(".tmp-*")), list(ckpt.iterdir())

    ls = omni("ckpt", "ls", ckpt)
    assert ls.returncode == 0, ls.stderr
    assert re.search(rf"^{step}\s+job\s+2\s+\d+\s+\S+\s+yes$", ls.stdout, re.M), ls.stdout
    shares = [int(x) for x in re.findall(r"replica r[01]\s+\d+ bytes: replicated (\d+)", ls.stdout)]
    assert len(shares) == 2 and abs(shares[0] - shares[1]) <= 8, ls.stdout
    verify = omni("ckpt", "verify", ckpt)
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stdout + verify.stderr
    show = omni("ckpt", "show", step_dir)
    assert show.returncode == 0, show.stderr
    for want in ("job-level", "rank 0  r0", "rank 1  r1", "model/", "per replica, part 1", "rng"):
        assert want in show.stdout, show.stdout

    alone_ckpt = run_dir / "ckpt-copy"
    shutil.copytree(ckpt, alone_ckpt, ignore=shutil.ignore_patterns(".lock-*"))

    resumed = group(run_dir, run_dir / "store2", 2, "--ckpt-dir", ckpt)
    for r in resumed:
        rc, out, err = r.wait()
        assert rc == 0, f"{r.rid}: exit {rc}\n{err}"
        assert f"(step {step})" in err, err
        assert final(out) == ref_final, f"{r.rid}: {final(out)} != {ref_final}"

    one_dir = tmp_path / "one"  # its own loss log
    one_dir.mkdir()
    one = Replica(one_dir, one_dir / "store", "r0", "--min-replicas", 1, "--ckpt-dir",
                  alone_ckpt)
    rc, out, err = one.wait()
    assert rc == 0, err
    assert f"(step {step})" in err, err
    assert final(out)[0] == STEPS
    logged = [int(m) for m in re.findall(r"^step=(\d+) ", one.loss.read_text(), re.M)]
    assert logged[0] == step, logged[:3]  # it went on from the saved step


def test_a_second_job_on_the_directory_is_refused_naming_both_jobs(tmp_path):
    ckpt = tmp_path / "ckpt"
    # 1500 steps (~15 s alone): the first job still holds the directory when
    # the second, started on a loaded machine, gets to its lock (with 120
    # steps, ~1 s, a second job slowed by the suite found it free).
    first = Replica(tmp_path, tmp_path / "store", "r0", "--min-replicas", 1, "--ckpt-dir", ckpt,
                    "--steps", 1500)
    deadline = time.monotonic() + 120
    while first.steps() < 2:
        assert time.monotonic() < deadline and first.proc.poll() is None, first.err.read_text()
        time.sleep(0.005)
    other = subprocess.run(
        [str(TRAINER), *map(str, BASE[:-2]), "--seed", "4", "--store",
         f"file://{tmp_path / 'store-b'}", "--replica-id", "q0", "--ckpt-dir", str(ckpt)],
        capture_output=True, text=True, timeout=120, check=False)
    assert other.returncode == 1, other.stderr
    assert "in use by another job" in other.stderr, other.stderr
    rc, _, err = first.wait()
    assert rc == 0, err
