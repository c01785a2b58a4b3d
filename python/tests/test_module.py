"""The module surface: version, constants, options, FakeClock, lifetime rules
and the GIL / thread behaviour of callbacks."""

import ast
import gc
import math
import os
import subprocess
import sys
import textwrap
import weakref

import omni
import pytest


def test_version_matches_the_native_library():
    assert omni.version() == omni.__version__
    assert omni.version().count(".") == 2
    assert omni.version() in omni.build_info()


def test_builtin_phase_ids_and_idle_kind_names_are_exported():
    ids = [omni.DATA_WAIT, omni.COMPUTE, omni.COMM, omni.OPTIMIZER, omni.CHECKPOINT, omni.EVAL,
           omni.PIPELINE_BUBBLE, omni.HOST]
    assert ids == list(range(8)) and omni.NUM_BUILTIN_PHASES == 8
    assert omni.IDLE_KINDS == ("busy", "data_stall", "checkpoint", "eval", "pipeline_bubble",
                               "host_side")
    assert omni.STEP_KINDS == ("normal", "checkpoint", "eval")


def test_builtin_phases_are_registered_with_their_idle_kinds(clock):
    with omni.Telemetry(clock=clock) as tel:
        phases = {p["name"]: (p["id"], p["idle"]) for p in tel.phases}
    assert phases["data_wait"] == (omni.DATA_WAIT, "data_stall")
    assert phases["compute"] == (omni.COMPUTE, "busy")
    assert phases["checkpoint"] == (omni.CHECKPOINT, "checkpoint")
    assert phases["host"] == (omni.HOST, "host_side")


def test_default_options_list_every_option_the_constructor_takes():
    defaults = omni.default_telemetry_options()
    assert defaults["window"] == 200
    assert defaults["k"] == 2.0
    assert defaults["horizon_s"] == 300.0
    assert defaults["step_log"] is None and defaults["clock"] is None
    # Every listed option is accepted with its default value.
    options = {k: v for k, v in defaults.items()}
    with omni.Telemetry(**options) as tel:
        assert not tel.closed
    assert tel.closed


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(window=0), "window"),
        (dict(window=-3), "window"),
        (dict(k=math.nan), "forecast k"),
        (dict(k=-1.0), "forecast k"),
        (dict(ring_capacity=3), "ring_capacity"),
        (dict(warmup_window=1), "warm-up window"),
        (dict(warmup_max_drift=math.inf), "max_drift"),
        (dict(horizon_s=-1.0), "horizon_s"),
        (dict(horizon_s=math.nan), "horizon_s"),
        (dict(publish_interval_s=math.inf), "publish_interval_s"),
        (dict(pipeline_stages=2, pipeline_stage=2), "stage"),
        (dict(checkpoint_every=10, checkpoint_offset=10), "offset"),
        (dict(checkpoint_every=10, checkpoint_offset=9, checkpoint_every_s=60.0),
         "by steps or by wall time"),
        (dict(eval_every_s=-1.0), "eval_every_s"),
        (dict(checkpoint_wall_lag_steps=1), "wall_lag_steps 1 without every_ns"),
        (dict(eval_every_s=60.0, eval_wall_lag_steps=9), "wall_lag_steps must be in"),
    ],
)
def test_bad_options_raise_value_error_naming_the_option(clock, options, message):
    with pytest.raises(ValueError, match=message):
        omni.Telemetry(clock=clock, **options)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(windows=10), "unexpected keyword argument 'windows'"),
        (dict(window="10"), "window must be an int"),
        (dict(window=10.0), "window must be an int"),
        (dict(k="2"), "k must be a float"),
        (dict(forecast=1), "forecast must be a bool"),
        (dict(step_log=3), "step_log must be a str or os.PathLike"),
        (dict(clock=object()), "clock must be None or omni.FakeClock"),
    ],
)
def test_options_of_the_wrong_name_or_type_raise_type_error(options, message):
    with pytest.raises(TypeError, match=message):
        omni.Telemetry(**options)


def test_fake_clock_moves_only_when_told():
    c = omni.FakeClock(start_ns=5)
    assert c.now_ns() == 5
    c.advance(0.25)
    assert c.now_ns() == 250_000_005
    c.advance_ns(10)
    assert c.now_ns() == 250_000_015
    c.set_ns(1)
    assert c.now_ns() == 1
    with pytest.raises(ValueError, match="seconds"):
        c.advance(-1.0)
    with pytest.raises(ValueError, match="seconds"):
        c.advance(math.nan)


def test_telemetry_keeps_its_fake_clock_alive():
    clock = omni.FakeClock()
    ref = weakref.ref(clock)
    tel = omni.Telemetry(clock=clock)
    del clock
    gc.collect()
    assert ref() is not None
    tel.begin_step()
    tel.end_step()
    tel.close()
    del tel
    gc.collect()
    assert ref() is None


def test_flush_rejects_a_non_finite_timeout(clock):
    with omni.Telemetry(clock=clock) as tel:
        with pytest.raises(ValueError, match="timeout_s"):
            tel.flush(math.inf)
        tel.flush(0.5)


def test_close_through_the_context_manager_closes_the_telemetry(clock):
    with omni.Telemetry(clock=clock) as tel:
        tel.begin_step()
        tel.end_step()
    assert tel.closed
    assert "closed" in repr(tel)


def test_probe_nccl_returns_a_dict_or_raises_runtime_error():
    try:
        info = omni.probe_nccl()
    except RuntimeError as e:
        assert str(e)  # no NCCL build, or no usable device: the reason is named
        return
    assert info["cuda_devices"] >= 1
    assert info["runtime_version"] > 0
    assert set(info) == {"compiled_version", "runtime_version", "cuda_devices", "supports_shrink"}


def _run_python(code, timeout=30):
    env = dict(os.environ)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_failing_hook_while_a_python_callback_runs_does_not_deadlock():
    # The worker holds the telemetry lock while it publishes; a failing hook
    # takes that lock. With the GIL held by the hook this would deadlock.
    result = _run_python("""
        import threading, time, omni
        clock = omni.FakeClock()
        tel = omni.Telemetry(clock=clock, warmup_min_steps=0, warmup_max_steps=0,
                             publish_interval_s=0.0)
        in_callback = threading.Event()
        def slow(forecast):
            in_callback.set()
            time.sleep(0.3)
        tel.add_callback_sink(slow)
        while not in_callback.is_set():
            with tel.step():
                with tel.phase(omni.COMPUTE):
                    clock.advance(0.01)
            time.sleep(0.001)
        try:
            tel.end_step()
        except RuntimeError as e:
            print("raised:", e)
        tel.close()
        print("done")
    """)
    assert result.returncode == 0, result.stderr
    assert "raised: EndStep() with no open step" in result.stdout
    assert "done" in result.stdout


def test_interpreter_exit_with_an_open_telemetry_and_callback_is_clean():
    result = _run_python("""
        import omni
        clock = omni.FakeClock()
        tel = omni.Telemetry(clock=clock, warmup_min_steps=0, warmup_max_steps=0,
                             publish_interval_s=0.0)
        tel.add_callback_sink(lambda f: None)
        for _ in range(100):
            with tel.step():
                clock.advance(0.01)
        print("exiting")
    """)
    assert result.returncode == 0, result.stderr
    assert "exiting" in result.stdout



def _stub():
    path = os.path.join(os.path.dirname(omni._C.__file__), "_C.pyi")
    with open(path) as f:
        return ast.parse(f.read())


def test_stub_declares_every_public_name_of_the_native_module():
    declared = set()
    for node in _stub().body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            declared.add(node.target.id)
    public = {n for n in dir(omni._C) if not n.startswith("_")} | {"__version__"}
    assert declared == public


def test_stub_lists_exactly_the_telemetry_options_and_methods():
    telemetry = next(n for n in _stub().body if isinstance(n, ast.ClassDef) and n.name == "Telemetry")
    init = next(n for n in telemetry.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert {a.arg for a in init.args.kwonlyargs} == set(omni.default_telemetry_options())
    methods = {n.name for n in telemetry.body if isinstance(n, ast.FunctionDef)} - {"__init__"}
    assert methods == {n for n in dir(omni._C.Telemetry) if not n.startswith("_")}


def test_stub_lists_exactly_the_options_of_every_keyword_constructor():
    classes = {n.name: n for n in _stub().body if isinstance(n, ast.ClassDef)}
    for cls, defaults in [("CheckpointManager", omni._C.default_checkpoint_options()),
                          ("PreemptionMonitor", omni._C.default_preemption_options()),
                          ("DistributedSampler", omni._C.default_sampler_options()),
                          ("Communicator", omni._C.default_comm_options()),
                          ("ElasticGroup", omni._C.default_elastic_options())]:
        init = next(n for n in classes[cls].body
                    if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        assert {a.arg for a in init.args.kwonlyargs} == set(defaults), cls


def test_keyword_constructors_refuse_unknown_and_positional_options(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'keep_lst'"):
        omni._C.CheckpointManager(tmp_path, keep_lst=2)
    with pytest.raises(TypeError):
        omni._C.CheckpointManager(tmp_path, 0, 1)
    with pytest.raises(TypeError, match="seed must be an int"):
        omni.DistributedSampler(10, seed="1")
