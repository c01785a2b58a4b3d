"""omni.open_store, omni.Communicator and omni.ElasticGroup with real
processes over a file:// store and real Gloo."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import omni

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_worker.py")


def test_a_file_store_round_trips_values_counters_and_compare_set(tmp_path):
    store = omni.open_store(f"file://{tmp_path}/store")
    store.set("a/b", "text")
    assert store.get("a/b") == b"text"
    assert store.try_get("missing") is None
    assert store.add("n") == 1 and store.add("n", 41) == 42
    assert store.compare_set("c", b"", b"1") == b"1"  # created
    assert store.compare_set("c", b"0", b"2") == b"1"  # not swapped
    assert store.delete("c") is True and store.delete("c") is False
    view = store.prefix("gen/1")
    view.set("k", b"\x00\xff")
    assert store.get("gen/1/k") == b"\x00\xff"
    store.wait(["a/b", "n"], timeout_s=1)


def test_store_waits_are_bounded_and_name_the_key(tmp_path):
    store = omni.open_store(f"file://{tmp_path}")
    with pytest.raises(TimeoutError, match="never"):
        store.get("never", timeout_s=0.05)
    with pytest.raises(TimeoutError, match="never"):
        store.wait(["never"], timeout_s=0.05)
    with pytest.raises(ValueError, match="bad key"):
        store.set("bad key", b"")


def test_a_relative_or_unknown_store_uri_is_refused():
    with pytest.raises(ValueError):
        omni.open_store("file://relative/dir")
    with pytest.raises(ValueError, match="gopher"):
        omni.open_store("gopher://127.0.0.1:29500")
    with pytest.raises(ValueError, match="no port"):
        omni.open_store("tcp://127.0.0.1")


def test_two_ranks_allreduce_broadcast_allgather_in_place(tmp_path):
    store = omni.open_store(f"file://{tmp_path}")
    results = [None, None]
    errors = []

    def rank(r):
        try:
            with omni.Communicator(store.prefix("comm"), rank=r, size=2, timeout_s=20) as c:
                a = np.full(5, r + 1.0, dtype=np.float32)
                c.allreduce(a)
                m = np.array([r * 10], dtype=np.int64)
                c.allreduce(m, op="max")
                b = np.arange(4, dtype=np.float64) * (r + 1)
                c.broadcast(b, root=1)
                out = np.zeros((2, 3), dtype=np.int32)
                c.allgather(np.full(3, r, dtype=np.int32), out)
                c.barrier()
                results[r] = (a, m, b, out)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for a, m, b, out in results:
        np.testing.assert_array_equal(a, np.full(5, 3.0, dtype=np.float32))
        assert m[0] == 10
        np.testing.assert_array_equal(b, np.arange(4) * 2.0)
        np.testing.assert_array_equal(out, [[0, 0, 0], [1, 1, 1]])


def test_a_torch_cpu_tensor_is_reduced_in_place(tmp_path):
    torch = pytest.importorskip("torch")
    store = omni.open_store(f"file://{tmp_path}")
    with omni.Communicator(store, rank=0, size=1) as c:
        t = torch.arange(4, dtype=torch.float32)
        assert c.allreduce(t, op="sum") is t
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(ValueError, match="contiguous"):
            c.allreduce(torch.zeros(4, 4).t())


def test_unsupported_buffers_and_ops_are_refused_naming_them(tmp_path):
    store = omni.open_store(f"file://{tmp_path}")
    with omni.Communicator(store, rank=0, size=1) as c:
        with pytest.raises(ValueError, match="op must be"):
            c.allreduce(np.zeros(2, dtype=np.float32), op="prod")
        with pytest.raises(ValueError, match="float16"):
            c.allreduce(np.zeros(2, dtype=np.float16))
        with pytest.raises(TypeError, match="buffer protocol"):
            c.allreduce([1.0, 2.0])
        with pytest.raises(ValueError, match="writable"):
            a = np.zeros(2, dtype=np.float32)
            a.flags.writeable = False
            c.allreduce(a)


def _spawn(uri, replica, steps, out, delay=0.02):
    env = dict(os.environ)
    return subprocess.Popen(
        [sys.executable, WORKER, uri, replica, str(steps), str(out), str(delay)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _reference(steps):
    w = np.zeros(8, dtype=np.float64)
    for s in range(steps):
        g = np.array([np.sin(s * 0.1 + i) for i in range(8)], dtype=np.float64)
        w -= 0.1 * g
    return w


def _wait_for_line(proc, prefix, lines, timeout=60):
    """Reads proc's output until a line starts with `prefix`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no '{prefix}' line; output so far: {lines}")


@pytest.mark.slow
def test_two_processes_survive_a_sigkill_and_admit_a_joiner_bit_exactly(tmp_path):
    steps = 300
    uri = f"file://{tmp_path}/store"
    a = _spawn(uri, "a", steps, tmp_path / "a.npz")
    b = _spawn(uri, "b", steps, tmp_path / "b.npz")
    c = None
    a_lines, b_lines, c_lines = [], [], []
    try:
        _wait_for_line(a, "start", a_lines)
        _wait_for_line(b, "start", b_lines)
        time.sleep(1.0)  # some steps together
        b.send_signal(signal.SIGKILL)
        b.wait(10)
        _wait_for_line(a, "recover", a_lines)
        c = _spawn(uri, "c", steps, tmp_path / "c.npz")
        _wait_for_line(c, "start", c_lines)
        a_rest, _ = a.communicate(timeout=120)
        c_rest, _ = c.communicate(timeout=120)
        a_lines += a_rest.splitlines()
        c_lines += c_rest.splitlines()
    finally:
        for p in (a, b, c):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert a.returncode == 0, a_lines
    assert c.returncode == 0, c_lines
    # a recovered without b, then admitted c, which received the state.
    assert any(line.startswith("recover") and "left b" in line for line in a_lines), a_lines
    assert any(line.startswith("change") and "joined c" in line for line in a_lines), a_lines
    started = [line for line in c_lines if line.startswith("start")][0]
    assert int(started.split()[-1]) > 0, c_lines  # completed steps taken from a
    want = _reference(steps)
    for name in ("a", "c"):
        got = np.load(tmp_path / f"{name}.npz")
        assert int(got["step"]) == steps
        np.testing.assert_array_equal(got["w"], want)
