"""The preemption monitor, and a real preempted training process that resumes
to the same result as an uninterrupted run."""

import signal
import subprocess
import sys
import textwrap

import omni
import pytest


def test_exit_codes():
    assert (omni.EXIT_PREEMPTED, omni.EXIT_PREEMPTED_NO_SAVE) == (75, 76)


def test_notice_turns_into_continue_then_save_then_exit_without_save():
    clock = omni.FakeClock()
    with omni.PreemptionMonitor(signals=[], clock=clock, apply_environment=False) as pm:
        assert pm.at_boundary(1.0, 0.0, 2.0, 0.0) == ("continue", "", 0)
        assert not pm.pending
        deadline = pm.now_ns() + 10 * 1_000_000_000
        pm.notice(deadline)
        assert pm.pending
        d = pm.at_boundary(1.0, 0.0, 2.0, 0.0)  # 1 s step + 2 s save fit in 10 s
        assert d.action == "continue" and d.deadline_ns == deadline
        clock.advance(8.0)  # 2 s left: only the save fits
        d = pm.at_boundary(1.0, 0.0, 2.0, 0.0)
        assert d.action == "save_and_exit" and d.reason
        clock.advance(1.5)  # 0.5 s left: not even the save
        assert pm.at_boundary(1.0, 0.0, 2.0, 0.0).action == "exit_without_save"
    assert pm.closed


def test_only_one_monitor_per_process():
    with omni.PreemptionMonitor(signals=[], apply_environment=False):
        with pytest.raises(RuntimeError):
            omni.PreemptionMonitor(signals=[], apply_environment=False)
    omni.PreemptionMonitor(signals=[], apply_environment=False).close()


def test_grace_comes_from_the_environment_when_asked(monkeypatch):
    monkeypatch.setenv("OMNI_PREEMPT_GRACE_S", "7.5")
    with omni.PreemptionMonitor(signals=[], grace_s=30) as pm:
        assert pm.grace_s == 7.5
    with omni.PreemptionMonitor(signals=[], grace_s=30, apply_environment=False) as pm:
        assert pm.grace_s == 30
    monkeypatch.setenv("OMNI_PREEMPT_GRACE_S", "soon")
    with pytest.raises(ValueError, match="OMNI_PREEMPT_GRACE_S"):
        omni.PreemptionMonitor(signals=[])


def test_a_signal_replaces_the_python_handler_while_the_monitor_lives():
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    try:
        with omni.PreemptionMonitor(signals=[signal.SIGUSR1], apply_environment=False) as pm:
            signal.raise_signal(signal.SIGUSR1)  # delivered to this thread before it returns
            assert pm.pending and pm.signals_received == 1
            assert pm.at_boundary(0.0, 0.0, 0.0, 0.0).deadline_ns > 0
        assert got == []  # Python's handler did not run
        signal.raise_signal(signal.SIGUSR1)  # restored on close
        assert got == [1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_bad_notice_file_is_reported_and_ignored(tmp_path):
    notice = tmp_path / "notice.json"
    notice.write_text("{not json")
    import time

    with omni.PreemptionMonitor(
        signals=[], notice_file=notice, notice_poll_s=0.01, apply_environment=False
    ) as pm:
        for _ in range(500):
            if pm.last_notice_error is not None:
                break
            time.sleep(0.01)
        assert "notice.json" in pm.last_notice_error
        assert not pm.pending


TRAINER = textwrap.dedent(
    """
    import random, sys, time
    import numpy as np
    import omni
    from omni.state import ArrayState, JsonState, NumpyRandomState, PythonRandomState

    ckpt_dir, out_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    random.seed(11)
    np.random.seed(12)
    true_w = np.linspace(-1.0, 1.0, 8)
    arrays = {"w": np.zeros(8), "m": np.zeros(8)}
    progress = JsonState({"loss_sum": 0.0})
    state = omni.StateRegistry()
    state.register("model", ArrayState(arrays))
    state.register("progress", progress)
    state.register("rng/python", PythonRandomState())
    state.register("rng/numpy", NumpyRandomState())

    with omni.CheckpointManager(ckpt_dir) as ckpt, omni.PreemptionMonitor(
        grace_s=1.0, apply_environment=False
    ) as monitor:
        restored = ckpt.restore(state)
        first = 0 if restored is None else restored["step"] + 1
        print("start", first, flush=True)
        for step in range(first, steps):
            x = np.random.randn(16, 8)
            y = x @ true_w + np.random.normal(0.0, 0.1, 16)
            err = x @ arrays["w"] - y
            arrays["m"] *= 0.9
            arrays["m"] += x.T @ err / 16
            arrays["w"] -= 0.05 * (1.0 + 0.1 * random.random()) * arrays["m"]
            progress["loss_sum"] += float((err ** 2).mean())
            time.sleep(0.01)
            print("step", step, flush=True)
            decision = monitor.at_boundary(0.05, 0.0, 0.2, 0.0)
            if decision.action == "save_and_exit":
                ckpt.save(step, state)
                print("preempted", step, decision.reason, flush=True)
                sys.exit(omni.EXIT_PREEMPTED)
            if decision.action == "exit_without_save":
                sys.exit(omni.EXIT_PREEMPTED_NO_SAVE)
    np.save(out_path, np.concatenate([arrays["w"], arrays["m"], [progress["loss_sum"]]]))
    print("done", flush=True)
    """
)


def test_sigterm_saves_exits_75_and_the_rerun_finishes_with_the_uninterrupted_result(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    steps = 300

    def run(ckpt, out):
        return [sys.executable, str(script), str(tmp_path / ckpt), str(tmp_path / out), str(steps)]

    ref = subprocess.run(run("ref_ckpt", "ref.npy"), capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr
    assert "start 0" in ref.stdout

    proc = subprocess.Popen(run("ckpt", "out.npy"), stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 20"):
                proc.send_signal(signal.SIGTERM)
                break
        lines.extend(proc.stdout)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == omni.EXIT_PREEMPTED, "".join(lines)
    preempted = [l for l in lines if l.startswith("preempted")]
    assert preempted, "".join(lines)
    saved_step = int(preempted[0].split()[1])
    assert 20 <= saved_step < steps - 1
    assert not (tmp_path / "out.npy").exists()
    assert [c["step"] for c in omni.list_checkpoints(tmp_path / "ckpt")] == [saved_step]

    rerun = subprocess.run(run("ckpt", "out.npy"), capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"start {saved_step + 1}" in rerun.stdout
    assert (tmp_path / "out.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()


def test_decide_takes_step_and_save_costs_from_the_runtime(tmp_path, clock):
    tel = omni.Telemetry(clock=clock)  # default warm-up: the statistics are still empty
    for seconds in (0.5, 2.0, 1.0):
        with tel.step():
            clock.advance(seconds)
    assert tel.worst_step_s == pytest.approx(2.0)
    with omni.CheckpointManager(tmp_path) as ckpt, omni.PreemptionMonitor(
            signals=[], clock=clock, apply_environment=False, grace_s=30) as pm:
        ckpt.save(0, {"p": omni.state.JsonState({"x": 1})})
        assert len(ckpt.save_times_s) == 1
        assert pm.decide(tel, ckpt).action == "continue"  # nothing pending
        pm.notice(clock.now_ns() + int(4e9))  # a step (2 s), a save and the slack fit
        assert pm.decide(tel, ckpt).action == "continue"
        pm.notice(clock.now_ns() + int(1.5e9))  # the worst step no longer fits, the save does
        assert pm.decide(tel, ckpt).action == "save_and_exit"
    tel.close()


def test_a_notice_written_to_a_store_key_is_seen(tmp_path):
    import time

    store = omni.open_store(f"file://{tmp_path}/store")
    with omni.PreemptionMonitor(signals=[], apply_environment=False, notice_store=store,
                                notice_key="job/notice", notice_poll_s=0.01) as pm:
        assert not pm.pending
        store.set("job/notice", '{"yield_in_s": 60}')
        deadline = time.monotonic() + 10
        while not pm.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pm.pending, pm.last_notice_error
        assert pm.at_boundary(0.1).action == "continue"  # 60 s left
