"""What a resumed run meets: a changed configuration named field by field,
an existing step id refused, the previous attempt's step log and trace kept,
and a trace cut by SIGKILL still readable."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import omni
from conftest import NO_WARMUP, run_steps
from omni.state import JsonState


def test_a_changed_configuration_is_refused_naming_the_fields(tmp_path):
    config = {"lr": 0.1, "model": {"layers": 2, "width": 64}, "seed": 1}
    with omni.CheckpointManager(tmp_path, config=config) as ckpt:
        ckpt.save(3, {"p": JsonState({"step": 3})})
    changed = {"lr": 0.2, "model": {"layers": 2, "width": 64}, "batch": 8, "seed": 1}
    with omni.CheckpointManager(tmp_path, config=changed) as ckpt:
        with pytest.raises(ValueError) as e:
            ckpt.restore({"p": JsonState()})
    message = str(e.value)
    assert "lr: 0.1 in the checkpoint, 0.2 in this run" in message
    assert "batch: not in the checkpoint, 8 in this run" in message
    assert "model.width" not in message and "seed" not in message
    with omni.CheckpointManager(tmp_path, config=config) as ckpt:  # the same: accepted
        p = JsonState()
        assert ckpt.restore({"p": p})["step"] == 3 and p["step"] == 3


def test_saving_an_existing_step_is_refused_unless_overwrite(tmp_path):
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(5, {"p": JsonState({"v": 1})})
    with omni.CheckpointManager(tmp_path) as ckpt:  # a later run
        with pytest.raises(FileExistsError, match="step 5 already exists"):
            ckpt.save(5, {"p": JsonState({"v": 2})})
        with pytest.raises(FileExistsError):
            ckpt.save_async(5, {"p": JsonState({"v": 2})})
        ckpt.save(5, {"p": JsonState({"v": 3})}, overwrite=True)
        p = JsonState()
        ckpt.restore({"p": p})
        assert p["v"] == 3


def test_a_resumed_telemetry_keeps_the_previous_attempts_files(tmp_path, clock):
    log, trace = tmp_path / "steps.jsonl", tmp_path / "trace.json"
    for attempt in range(3):
        tel = omni.Telemetry(clock=clock, step_log=log, trace=trace, **NO_WARMUP)
        run_steps(tel, clock, 2, first=attempt * 2)
        tel.close()
        assert len(tel.rotated) == (0 if attempt == 0 else 2)
    assert omni.read_step_log(f"{log}.1")["first_step"] == 0
    assert omni.read_step_log(f"{log}.2")["first_step"] == 2
    assert omni.read_step_log(log)["first_step"] == 4
    assert os.path.exists(f"{trace}.2")
    tel = omni.Telemetry(clock=clock, step_log=log, on_existing="truncate", **NO_WARMUP)
    tel.close()
    assert not os.path.exists(f"{log}.3")


def test_a_resumed_telemetry_forecasts_from_the_previous_attempts_steps(tmp_path, clock):
    log = tmp_path / "steps.jsonl"
    tel = omni.Telemetry(clock=clock, step_log=log, **NO_WARMUP)
    run_steps(tel, clock, 40)
    tel.close()
    # Resumed from a checkpoint of step 29: steps 0-29 of the first attempt
    # are learned (the default), or none.
    for learn, learned in ((None, 30), (0, 0)):
        options = {} if learn is None else {"learn_previous_steps": learn}
        tel = omni.Telemetry(clock=clock, step_log=log, **options, **NO_WARMUP)
        run_steps(tel, clock, 1, first=30)
        tel.flush()
        counters = tel.counters()
        assert counters["previous_steps_learned"] == learned
        assert counters["previous_log_status"] == ""
        assert (tel.latest_forecast() is not None) == (learned > 0)
        tel.close()


def test_evaluate_scores_a_resumed_log_after_the_previous_attempts_steps(tmp_path, clock):
    log = tmp_path / "steps.jsonl"
    for first, n in ((0, 60), (40, 30)):  # resumed from a checkpoint of step 39
        tel = omni.Telemetry(clock=clock, step_log=log, **NO_WARMUP)
        run_steps(tel, clock, n, first=first)
        tel.close()
    cold = omni.evaluate(log)
    warm = omni.evaluate(log, previous=f"{log}.1")
    assert warm["next_step_steps"] == 30 > cold["next_step_steps"]
    with pytest.raises(FileNotFoundError, match="steps.jsonl.9"):
        omni.evaluate(log, previous=f"{log}.9")


def test_a_trace_cut_mid_event_is_read_up_to_the_last_whole_event(tmp_path, clock):
    trace = tmp_path / "trace.json"
    tel = omni.Telemetry(clock=clock, trace=trace, **NO_WARMUP)
    run_steps(tel, clock, 3)
    tel.close()
    whole = omni.read_trace(trace)
    assert sum(1 for e in whole if e.get("cat") == "step") == 3
    text = trace.read_text()
    lines = text.rstrip().split("\n")  # the last is "]"
    trace.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:20])  # no ']', half an event
    assert omni.read_trace(trace) == whole[:-1]
    trace.write_text(text.replace("\n{", "\n{broken", 1))
    with pytest.raises(ValueError, match="trace.json:"):
        omni.read_trace(trace)


@pytest.mark.slow
def test_a_trace_of_a_sigkilled_process_is_readable(tmp_path):
    trace = tmp_path / "trace.json"
    code = textwrap.dedent(f"""
        import os, signal, omni
        tel = omni.Telemetry(trace={str(trace)!r}, warmup_min_steps=0, warmup_max_steps=0)
        for i in range(50):
            with tel.step():
                with tel.phase(omni.COMPUTE):
                    pass
        tel.flush()
        print("flushed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "flushed" in done.stdout
    assert not trace.read_text().rstrip().endswith("]")
    steps = [e["args"]["step"] for e in omni.read_trace(trace) if e.get("cat") == "step"]
    # What reached the file (the writer buffers) is a readable prefix.
    assert steps == list(range(len(steps)))
