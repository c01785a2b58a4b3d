"""examples/dcgan: PyTorch's C++ DCGAN example (two models, two optimizers)
ported to omni::Runtime. The port stays small (counted against the upstream
file), and a run stopped with SIGTERM and started again ends with training
state bit-identical to a run that was never stopped. The MNIST files are
generated here in the real IDX format (LibTorch's reader wants the 60,000
training images); OMNI_TOTAL_STEPS keeps the runs a few steps long."""

import os
import pathlib
import re
import json
import subprocess

import numpy as np
import pytest
from first_checkpoint import sigterm_after_first_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("OMNI_BIN_DIR", str(REPO / "build" / "bin")))
DCGAN = BIN_DIR / "dcgan"
FINAL_RE = re.compile(r"^final step=(\d+) state_xxh3=([0-9a-f]{16})$", re.M)
EXIT_PREEMPTED = 75
STEPS = 8
PORT_LIMIT = 30


def test_the_port_changes_at_most_thirty_lines_of_the_upstream_example():
    out = subprocess.run(["bash", str(REPO / "scripts" / "dcgan_port_lines.sh"), str(PORT_LIMIT)],
                         capture_output=True, text=True, check=False)
    m = re.search(r"dcgan_port_changed_lines (\d+)", out.stdout)
    assert m, out.stdout + out.stderr
    print(out.stdout.strip())
    assert 0 < int(m.group(1)) <= PORT_LIMIT, out.stdout + out.stderr
    assert out.returncode == 0, out.stderr


def write_idx(path, magic, array):
    with open(path, "wb") as f:
        f.write(np.array([magic, *array.shape], dtype=">i4").tobytes())
        f.write(array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    d = tmp_path_factory.mktemp("mnist")
    rng = np.random.default_rng(5)
    write_idx(d / "train-images-idx3-ubyte", 2051,
              rng.integers(0, 256, size=(60000, 28, 28), dtype=np.uint8))
    write_idx(d / "train-labels-idx1-ubyte", 2049,
              rng.integers(0, 10, size=(60000,), dtype=np.uint8))
    return d


def run_dir(base, mnist):
    base.mkdir()
    (base / "data").symlink_to(mnist)  # the example reads ./data
    return base


def env(d, **extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("OMNI_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    e.update({"OMNI_CKPT_DIR": str(d / "ckpt"), "OMNI_CKPT_EVERY": "2",
              "OMNI_TOTAL_STEPS": str(STEPS), "OMNI_STEP_LOG": str(d / "steps.jsonl"),
              "OMP_NUM_THREADS": "1"})
    e.update(extra)
    return e


def final(stdout):
    m = FINAL_RE.search(stdout)
    assert m, f"no final line in {stdout!r}"
    return m.group(0)


@pytest.mark.skipif(not DCGAN.exists(), reason=f"{DCGAN} not built")
def test_sigterm_then_resume_ends_bit_identical_to_an_unstopped_run(tmp_path, mnist):
    ref_dir = run_dir(tmp_path / "ref", mnist)
    ref = subprocess.run([str(DCGAN), "--epochs", "1"], cwd=ref_dir, env=env(ref_dir),
                         capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr
    ref_final = final(ref.stdout)
    assert ref_final.startswith(f"final step={STEPS} "), ref_final

    # The grace covers the step under way and a save, not the rest of the
    # run: three times the slowest step of the reference run.
    steps = [json.loads(l) for l in (ref_dir / "steps.jsonl").read_text().splitlines()[1:]]
    slowest_s = max(s["end_ns"] - s["start_ns"] for s in steps) / 1e9
    d = run_dir(tmp_path / "run", mnist)
    code, out, err = sigterm_after_first_checkpoint(
        [DCGAN, "--epochs", "1"], d / "ckpt", cwd=d,
        env=env(d, OMNI_PREEMPT_GRACE_S=f"{3 * slowest_s:.3f}"))
    assert code == EXIT_PREEMPTED, err
    saved = int(re.search(r"saved step (\d+) to ", err).group(1))
    assert 0 < saved < STEPS, err
    assert not FINAL_RE.search(out), out

    # The digest tells states apart: the saved state's is not the final one.
    at_saved = subprocess.run([str(DCGAN), "--epochs", "1"], cwd=d,
                              env=env(d, OMNI_TOTAL_STEPS=str(saved)),
                              capture_output=True, text=True, timeout=600)
    assert at_saved.returncode == 0, at_saved.stderr
    assert final(at_saved.stdout).startswith(f"final step={saved} "), at_saved.stdout
    assert final(at_saved.stdout).split()[2] != ref_final.split()[2]

    resumed = subprocess.run([str(DCGAN), "--epochs", "1"], cwd=d, env=env(d),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"(step {saved})" in resumed.stderr, resumed.stderr
    assert final(resumed.stdout) == ref_final
