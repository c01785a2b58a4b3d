"""For the examples' SIGTERM tests: a job started and stopped with SIGTERM
as soon as its first checkpoint is on disk (real process, real signal)."""

import signal
import subprocess
import time


def sigterm_after_first_checkpoint(cmd, ckpt_dir, timeout_s=300, **popen):
    """Runs `cmd` (Popen keywords in `popen`: env, cwd) until a `step-*`
    directory appears in `ckpt_dir`, then sends SIGTERM and waits for the
    exit. Returns (returncode, stdout, stderr); fails the test when the job
    exits before its first checkpoint."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, **popen)
    deadline = time.monotonic() + timeout_s
    while not any(ckpt_dir.glob("step-*")) and time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()
        time.sleep(0.005)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=timeout_s)
    return p.returncode, out, err
