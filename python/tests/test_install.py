"""`pip install .` from the repository root, offline, into a venv made with
--system-site-packages and --no-build-isolation: `import omni` then works
from outside the source tree without PYTHONPATH."""

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow


def _build_dir():
    """The configured build directory the tests run against (OMNI_BIN_DIR's
    parent), reused so that the install builds only the module."""
    bin_dir = os.environ.get("OMNI_BIN_DIR")
    if bin_dir and os.path.exists(os.path.join(bin_dir, "..", "CMakeCache.txt")):
        return os.path.abspath(os.path.join(bin_dir, ".."))
    return None


def test_pip_install_from_the_root_gives_an_importable_package(tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("pip is not installed (apt-get install python3-pip)")
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot make a venv (apt-get install python3-venv): {made.stderr}")
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INDEX"] = "1"  # offline
    env["OMNI_BUILD_JOBS"] = "2"
    if _build_dir():
        env["OMNI_CMAKE_BUILD_DIR"] = _build_dir()
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", ROOT],
        env=env, capture_output=True, text=True, timeout=1800)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    code = (
        "import os, numpy as np, omni\n"
        "print(omni.__file__)\n"
        "store = omni.open_store('file://' + os.path.abspath('store'))\n"
        "with omni.Communicator(store, rank=0, size=1) as c:\n"
        "    a = np.ones(3, dtype=np.float32); c.allreduce(a)\n"
        "with omni.CheckpointManager('ckpt') as ckpt:\n"
        "    state = {'progress': omni.state.JsonState({'step': 7})}\n"
        "    ckpt.save(7, state)\n"
        "    print(ckpt.restore(state)['step'])\n"
        "from omni import _torch_store\n"
        "try:\n"
        "    import torch.distributed\n"
        "    api, why = _torch_store.native_api()\n"
        "    print(api is not None)\n"
        "except ImportError:\n"
        "    print('no-torch')\n"
    )
    ran = subprocess.run([python, "-c", code], cwd=outside, env=env, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    path, step, native = ran.stdout.split()
    assert path.startswith(str(venv)), path  # the installed copy, not the source tree
    assert step == "7"
    # Where the build has omni._torch_C (LibTorch found: the build tree the
    # tests run against, or build-pip/ beside a torch before 2.4), the
    # installed package carries it and serves tcp:// stores with c10d's C++
    # client, not torch's binding that can crash before torch 2.4.
    bin_dir = os.environ.get("OMNI_BIN_DIR")
    built = bin_dir and glob.glob(os.path.join(bin_dir, "..", "python", "omni", "_torch_C*.so"))
    if _build_dir() and native != "no-torch":
        assert native == ("True" if built else "False"), (native, ran.stderr)
