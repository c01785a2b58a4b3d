"""omni.Runtime (the C++ omni::Runtime bound) and tcp:// stores through the
user's torch: options from the environment, registered Python state,
checkpoints, and the example examples/python/train.py under torchrun, after
SIGTERM, and as elastic replicas with a SIGKILL and a join."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import omni
from omni.state import ArrayState, JsonState

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train.py")
FINAL = re.compile(r"^final step=(\d+) params_xxh3=([0-9a-f]{16}) loss=(\S+)$", re.M)


def _runtime(**options):
    options.setdefault("environment", False)
    options.setdefault("handle_preemption", False)
    return omni.Runtime(**options)


# ---------------------------------------------------------------- the Runtime in-process


def _train(tmp_path, steps, lines):
    """A numpy "model" trained through the Runtime; returns its weights."""
    w = {"w": np.zeros(4, dtype=np.float64)}
    seen = JsonState({"batches": []})
    with _runtime(ckpt_dir=str(tmp_path / "ckpt"), ckpt_every=3, dataset_size=40, global_batch=8,
                  job_id="t", log=lines.append) as rt:
        rt.register("model", ArrayState(w))
        rt.register("seen", seen, scope="per_replica")
        for step in rt.steps(steps):
            batch = rt.local_batch()
            seen["batches"] = seen["batches"] + [batch]
            g = np.array([np.sin(step + i) for i in range(4)]) * len(batch)
            assert rt.allreduce(g)  # no group: untouched, True
            w["w"] -= 0.1 * g
        assert rt.step == steps
    return w["w"], seen["batches"]


def test_a_runtime_commits_saves_and_resumes_where_it_stopped(tmp_path):
    lines = []
    w_first, _ = _train(tmp_path, 7, lines)
    saved = sorted(n for n in os.listdir(tmp_path / "ckpt") if n.startswith("step-"))
    assert saved == ["step-000000000003", "step-000000000006"]
    w_resumed, batches = _train(tmp_path, 10, lines)
    assert any("resumed from" in line and "(step 6)" in line for line in lines), lines
    shutil.rmtree(tmp_path / "ckpt")
    w_straight, straight_batches = _train(tmp_path, 10, [])
    np.testing.assert_array_equal(w_resumed, w_straight)
    # the sampler's cursor came back too: steps 6..9 saw the same batches
    assert batches[-4:] == straight_batches[-4:]


def test_the_decision_loop_by_hand_and_the_telemetry_view(tmp_path):
    with _runtime(step_log=str(tmp_path / "steps.jsonl")) as rt:
        assert rt.start() == 0
        rt.begin_step()
        with rt.phase(omni.COMPUTE):
            pass
        d = rt.end_step()
        assert d == omni.Decision("continue", 0, 1, 0, -1, "")
        assert rt.step == 1 and rt.rank == 0 and rt.size == 1 and not rt.elastic
        with pytest.raises(RuntimeError, match="no step is open"):
            rt.end_step()
        with pytest.raises(RuntimeError, match="before Start"):
            _runtime().begin_step()
        tel = rt.telemetry
        rt.finish()
        assert "step statistics" in tel.snapshot_table()
    with pytest.raises(RuntimeError, match="Runtime that owned this telemetry is closed"):
        tel.counters()
    assert (tmp_path / "steps.jsonl").stat().st_size > 0


def test_yield_now_saves_between_steps_and_a_new_runtime_resumes_there(tmp_path):
    w = {"w": np.zeros(2, dtype=np.float64)}
    with _runtime(ckpt_dir=str(tmp_path / "ckpt"), job_id="y") as rt:
        rt.register("model", ArrayState(w))
        rt.start()
        for _ in range(3):
            rt.begin_step()
            w["w"] += 1
            assert rt.end_step().kind == "continue"
        d = rt.yield_now("the host finished")
        assert (d.kind, d.exit_code, d.saved_step, d.reason) == ("save_and_exit", 75, 3,
                                                                 "the host finished")
        with pytest.raises(RuntimeError, match="stopped already"):
            rt.yield_now()
        rt.finish()
    w2 = {"w": np.zeros(2, dtype=np.float64)}
    with _runtime(ckpt_dir=str(tmp_path / "ckpt"), job_id="y") as rt:
        rt.register("model", ArrayState(w2))
        assert rt.start() == 3
        np.testing.assert_array_equal(w2["w"], w["w"])


def test_registration_is_checked_and_only_before_start(tmp_path):
    with _runtime(dataset_size=8, global_batch=2) as rt:
        with pytest.raises(TypeError, match="save\\(writer\\) and load"):
            rt.register("x", object())
        with pytest.raises(ValueError, match="data"):
            rt.register("data", JsonState({}))  # the Runtime's sampler
        with pytest.raises(ValueError, match="scope"):
            rt.register("y", JsonState({}), scope="everywhere")
        rt.start()
        with pytest.raises(RuntimeError, match="before start"):
            rt.register("z", JsonState({}))


def test_options_come_from_the_environment_and_keywords_win(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("OMNI_STEP_LOG", str(tmp_path / "env-steps.jsonl"))
    with omni.Runtime(handle_preemption=False) as rt:
        assert (rt.rank, rt.size) == (1, 2)
        rt.start()
        rt.begin_step()
        rt.end_step()
        rt.finish()
    assert (tmp_path / "env-steps.jsonl").stat().st_size > 0
    monkeypatch.setenv("OMNI_CKPT_DIR", str(tmp_path / "env-ckpt"))
    monkeypatch.setenv("OMNI_CKPT_EVERY", "1")
    with omni.Runtime(handle_preemption=False, rank=0, world_size=1) as rt:
        assert (rt.rank, rt.size) == (0, 1)
        rt.start()
        rt.begin_step()
        rt.end_step()
    assert "step-000000000001" in os.listdir(tmp_path / "env-ckpt")
    monkeypatch.setenv("OMNI_CKPT_EVERY", "often")
    with pytest.raises(ValueError, match="OMNI_CKPT_EVERY"):
        omni.Runtime(handle_preemption=False)
    with pytest.raises(TypeError, match="no_such_option"):
        _runtime(no_such_option=1)
    with pytest.raises(TypeError, match="telemetry=.*windw"):
        _runtime(telemetry={"windw": 3})


def test_a_train_state_registers_every_key_and_reads_the_runtime_step(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ts = omni.TrainState(model=model, optimizer=opt)
    with _runtime(ckpt_dir=str(tmp_path / "ckpt"), ckpt_every=2) as rt:
        rt.register(ts)
        for _ in rt.steps(2):
            model(torch.ones(1, 3)).sum().backward()
            assert rt.allreduce_gradients(model.parameters(), average=True)
            opt.step()
        assert ts.step == 2
        with pytest.raises(AttributeError, match="Runtime"):
            ts.step = 5
    info = omni.describe_checkpoint(str(tmp_path / "ckpt" / "step-000000000002"))
    keys = info  # the description lists every entry's key
    for key in ("runtime/step", "model/", "optim/", "progress/", "rng/python/", "rng/torch/"):
        assert key in keys, keys


def test_a_checkpoint_by_wall_time_comes_at_the_first_boundary_its_interval_passed(tmp_path,
                                                                                   clock):
    w = {"w": np.zeros(2)}
    with _runtime(ckpt_dir=str(tmp_path / "ckpt"), ckpt_every_s=0.1, keep_last=10,
                  clock=clock) as rt:
        rt.register("model", ArrayState(w))
        for step in rt.steps(12):
            clock.advance(0.03 if step < 6 else 0.045)  # the step's work
            w["w"] += 1.0
    saved = sorted(int(n[5:]) for n in os.listdir(tmp_path / "ckpt") if n.startswith("step-"))
    assert saved == [4, 7, 10], saved  # 120 ms, 30 + 30 + 45, 135 ms; then 90 ms to the end
    with pytest.raises(ValueError, match="both set"):
        _runtime(ckpt_dir=str(tmp_path / "c2"), ckpt_every=5, ckpt_every_s=60)


# ---------------------------------------------------------------- tcp:// through torch


def _torch_server():
    dist = pytest.importorskip("torch.distributed")
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_a_tcp_store_served_by_torch_has_omni_store_semantics():
    server = _torch_server()
    served = omni.open_store(server)  # torch's own store object, as it is
    client = omni.open_store(f"tcp://127.0.0.1:{server.port}?timeout=10s")
    client.set("a/b", "text")
    assert served.get("a/b") == b"text"
    assert client.try_get("missing") is None
    assert client.add("n") == 1 and served.add("n", 41) == 42
    assert client.compare_set("c", b"", b"1") == b"1"  # created
    assert client.compare_set("c", b"", b"2") == b"1"  # exists: not swapped
    assert client.compare_set("c", b"0", b"2") == b"1"
    assert client.compare_set("c", b"1", b"3") == b"3"
    with pytest.raises(FileNotFoundError, match="missing key 'd'"):
        client.compare_set("d", b"x", b"y")
    client.set("empty", b"")
    assert client.get("empty") == b""
    assert client.delete("c") is True and client.delete("c") is False
    client.set("s", "abc")
    with pytest.raises(ValueError, match="not a counter"):
        client.add("s")
    with pytest.raises(TimeoutError, match="never"):
        client.get("never", timeout_s=0.05)
    client.wait(["a/b", "n"], timeout_s=1)
    client.prefix("gen/1").set("k", b"\x00\xff")
    assert served.get("gen/1/k") == b"\x00\xff"


def test_tcp_uris_are_checked_naming_the_problem(monkeypatch):
    for uri, why in [("tcp://127.0.0.1", "no port"), ("tcp://:5", "no host"),
                     ("tcp://h:1?colour=red", "unknown option 'colour'"),
                     ("tcp://h:0", "port 0"), ("tcp://h:99999", "port '99999'")]:
        with pytest.raises(ValueError, match=why):
            omni.open_store(uri)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        omni.open_store("env://")


_READER_SCRIPT = """
import sys, threading, time
import omni
store = omni.open_store(sys.argv[1])
store.set("hb/peer", b"session:1")
stop = time.monotonic() + float(sys.argv[2])
rounds = []
def reader():  # the elastic heartbeats: reads, first reads of absent keys, compare-and-set
    n = 0
    while time.monotonic() < stop:
        assert store.try_get("hb/peer") == b"session:1"
        assert store.try_get(f"absent/{n}") is None
        seen = store.compare_set("cas", b"", b"0")
        assert store.compare_set("cas", seen, str(int(seen) + 1).encode()) == str(n + 1).encode()
        n += 1
    rounds.append(n)
t = threading.Thread(target=reader)
t.start()
while time.monotonic() < stop:  # the training thread: Python that allocates
    junk = [bytes(i % 200) for i in range(2000)]
t.join()
print("rounds", rounds[0])
"""


def test_tcp_stores_use_cpp_client_where_the_torch_is_the_libtorch_omni_links():
    pytest.importorskip("torch.distributed")
    from omni import _torch_store

    api, why = _torch_store.native_api()
    if api is None and "no omni._torch_C" in why:
        pytest.skip(why)  # a build without LibTorch (pip install .)
    assert api is not None, why


def test_a_process_whose_torch_is_not_omnis_libtorch_keeps_the_binding_and_warns(monkeypatch):
    pytest.importorskip("torch.distributed")
    from omni import _torch_store

    try:
        from omni import _torch_build
    except ImportError:
        pytest.skip("a build without LibTorch has no omni._torch_C to choose")
    monkeypatch.setattr(_torch_store, "_native", None)  # choose again, once
    monkeypatch.setattr(_torch_build, "LIBTORCH_CPU", "/elsewhere/libtorch_cpu.so")
    server = _torch_server()
    with pytest.warns(RuntimeWarning, match="not the LibTorch .* omni._torch_C links "
                                            r"\(/elsewhere/libtorch_cpu.so\)"):
        client = omni.open_store(f"tcp://127.0.0.1:{server.port}?timeout=10s")
    client.set("k", b"v")
    assert server.get("k") == b"v"
    assert _torch_store.native_api()[0] is None  # the choice is kept for the process


def test_a_tcp_store_used_from_one_thread_while_another_runs_python_does_not_crash():
    # torch < 2.4's TCPStore.compare_set builds its bytes result without the
    # GIL (PyTorch #125990). Through torch's Python binding, a process whose
    # reader thread (the elastic heartbeats) made first reads of absent keys
    # or compare-and-sets while another thread ran Python crashed with
    # SIGSEGV, here within a second (3 of 3 runs). tcp:// now goes through
    # c10d's C++ client (omni._torch_C) where the process's torch allows it.
    server = _torch_server()
    p = subprocess.run([sys.executable, "-c", _READER_SCRIPT,
                        f"tcp://127.0.0.1:{server.port}?timeout=10s", "3"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}"
    assert int(p.stdout.split()[-1]) > 10, p.stdout  # the reader ran (~60 rounds a second here)


_RANK_SCRIPT = """
import sys
import numpy as np
import omni
r = int(sys.argv[2])
store = omni.open_store(sys.argv[1])
with omni.Communicator(store.prefix("comm"), rank=r, size=2, timeout_s=20) as c:
    a = np.full(5, r + 1.0, dtype=np.float32)
    c.allreduce(a)
print(" ".join(str(x) for x in a))
"""


def test_two_ranks_reduce_over_gloo_with_a_tcp_store():
    # One rank per process, as in a job. (As threads of one process they
    # crashed once in a loaded run: torch 1.13's TCPStore.compare_set builds
    # its bytes result without the GIL, PyTorch #125990, fixed in 2.4 by
    # #128212; docs/python.md.)
    server = _torch_server()
    uri = f"tcp://127.0.0.1:{server.port}"
    ranks = [subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, uri, str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for r, p in enumerate(ranks):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, f"rank {r}: exit {p.returncode}\n{err}"
        assert out.split() == ["3.0"] * 5, out


# ---------------------------------------------------------------- the example, as processes


def _example(*args, env=None):
    full = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMNI_STORE",
                "OMNI_CKPT_DIR", "OMNI_REPLICA_ID"):
        full.pop(key, None)
    full.update(env or {})
    return subprocess.Popen([sys.executable, EXAMPLE, *map(str, args)], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(proc, text, lines, timeout=60):
    """Reads proc's output until a line contains `text` (or one read before does)."""
    for line in lines:
        if text in line:
            return line
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r}; output so far: {lines}")


def _finish(proc, lines, timeout=120):
    rest, _ = proc.communicate(timeout=timeout)
    lines += rest.splitlines()
    return proc.returncode


def _final(lines):
    found = FINAL.findall("\n".join(lines))
    assert len(found) == 1, lines
    return found[0]


@pytest.mark.slow
def test_the_example_resumes_bit_exactly_after_sigterm(tmp_path):
    pytest.importorskip("torch")
    steps = 150
    ckpt = tmp_path / "ckpt"
    lines = []
    # A grace shorter than the rest of the run: the runtime stops at the
    # last boundary where a step and a save still fit before the deadline.
    proc = _example("--steps", steps, "--ckpt-dir", ckpt, "--step-sleep-s", 0.02,
                    env={"OMNI_PREEMPT_GRACE_S": "0.5"})
    try:
        _wait_for(proc, "started step=0", lines)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert _finish(proc, lines) == omni.EXIT_PREEMPTED, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not FINAL.search("\n".join(lines)), lines
    saved = [line for line in lines if "saved step" in line]
    assert saved, lines
    resumed_lines = []
    resumed = _example("--steps", steps, "--ckpt-dir", ckpt)
    assert _finish(resumed, resumed_lines) == 0, resumed_lines
    first = int(re.search(r"started step=(\d+)", "\n".join(resumed_lines)).group(1))
    assert 0 < first < steps, resumed_lines
    straight_lines = []
    straight = _example("--steps", steps)
    assert _finish(straight, straight_lines) == 0, straight_lines
    assert _final(resumed_lines) == _final(straight_lines)


@pytest.mark.slow
def test_the_example_trains_two_replicas_under_torchrun(tmp_path):
    pytest.importorskip("torch.distributed")
    torchrun = shutil.which("torchrun") or "/usr/bin/torchrun"
    if not os.path.exists(torchrun):
        pytest.skip("no torchrun")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "OMNI_STORE", "OMNI_CKPT_DIR", "OMNI_REPLICA_ID"):
        env.pop(key, None)
    # The first generation waits for both processes (torchrun starts them together).
    env["OMNI_MIN_REPLICAS"] = "2"
    # --redirects/--tee: torch 1.13's defaults do not parse on Python 3.11.
    out = subprocess.run(
        [torchrun, "--nproc_per_node=2", f"--master_port={port}", "--redirects", "1", "--tee", "1",
         "--log_dir", str(tmp_path / "logs"), EXAMPLE, "--steps", "60"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert out.returncode == 0, out.stdout
    assert out.stdout.count("generation 1 (initial): 2 replicas") == 2, out.stdout
    finals = re.findall(r"\]:final step=(\d+) params_xxh3=(\w+) loss=(\S+)", out.stdout)
    assert len(finals) == 2 and finals[0] == finals[1], out.stdout
    assert finals[0][0] == "60"


@pytest.mark.slow
def test_two_example_replicas_survive_a_sigkill_and_admit_a_joiner(tmp_path):
    pytest.importorskip("torch")
    steps = 300
    common = ["--steps", steps, "--store", f"file://{tmp_path}/store", "--min-replicas", 1,
              "--max-replicas", 3, "--peer-timeout-s", 0.5, "--step-sleep-s", 0.02]
    a = _example(*common, "--replica-id", "a")
    b = _example(*common, "--replica-id", "b")
    c = None
    a_lines, b_lines, c_lines = [], [], []
    try:
        _wait_for(a, "started", a_lines)
        _wait_for(b, "started", b_lines)
        _wait_for(a, "2 replicas", a_lines)  # b is in (formed together, or admitted)
        time.sleep(1.0)
        b.send_signal(signal.SIGKILL)
        b.wait(10)
        _wait_for(a, "elastic: recovered", a_lines)
        c = _example(*common, "--replica-id", "c")
        _wait_for(c, "started", c_lines)
        assert _finish(a, a_lines) == 0, "\n".join(a_lines)
        assert _finish(c, c_lines) == 0, c_lines
    finally:
        for p in (a, b, c):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert any("recovered" in line and "left b" in line for line in a_lines), a_lines
    assert any("changed" in line and "joined c" in line for line in a_lines), a_lines
    started = int(re.search(r"started step=(\d+)", "\n".join(c_lines)).group(1))
    assert started > 0, c_lines  # c received a's state
    assert _final(a_lines) == _final(c_lines)
    assert _final(a_lines)[0] == str(steps)
