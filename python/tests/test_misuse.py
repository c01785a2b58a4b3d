"""Hook misuse raises ValueError / RuntimeError with the core's message, is
counted, and leaves telemetry working."""

import math

import omni
import pytest
from conftest import NO_WARMUP, row, run_steps


def test_end_step_twice_raises_runtime_error_and_telemetry_keeps_working(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    tel.begin_step()
    clock.advance(0.010)
    tel.end_step()
    with pytest.raises(RuntimeError, match="no open step"):
        tel.end_step()
    run_steps(tel, clock, 3)
    tel.flush()
    counters = tel.counters()
    assert counters["misuse_errors"] == 1
    assert "no open step" in counters["last_error"]
    assert counters["steps_recorded"] == 4
    assert row(tel.snapshot(), "step")["count"] == 4


def test_begin_step_while_a_step_is_open_raises_and_keeps_the_open_step(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    tel.begin_step(7)
    with pytest.raises(RuntimeError, match="still open"):
        tel.begin_step(8)
    clock.advance(0.010)
    tel.end_step()
    with pytest.raises(ValueError, match="not after the last step 7"):
        tel.begin_step(7)
    tel.begin_step(8)
    tel.end_step()


def test_phases_that_do_not_nest_raise_value_error_and_leave_phases_open(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    tel.begin_step()
    tel.begin_phase(omni.COMPUTE)
    tel.begin_phase(omni.COMM)
    with pytest.raises(ValueError, match="must nest"):
        tel.end_phase(omni.COMPUTE)
    clock.advance(0.004)
    tel.end_phase(omni.COMM)  # still open: the failed call changed nothing
    tel.end_phase(omni.COMPUTE)
    tel.end_step()
    run_steps(tel, clock, 2)
    tel.flush()
    assert tel.counters()["misuse_errors"] == 1
    assert row(tel.snapshot(), "comm")["mean_ms"] == 4.0


def test_end_step_with_open_phases_closes_them_and_raises(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    tel.begin_step()
    tel.begin_phase(omni.COMPUTE)
    clock.advance(0.010)
    with pytest.raises(RuntimeError, match="still open"):
        tel.end_step()
    tel.flush()
    assert row(tel.snapshot(), "compute")["mean_ms"] == 10.0
    run_steps(tel, clock, 1)


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -0.001])
def test_record_phase_with_a_non_finite_or_negative_duration_raises_value_error(
    make_telemetry, clock, seconds
):
    tel = make_telemetry(**NO_WARMUP)
    tel.begin_step()
    clock.advance(0.010)
    with pytest.raises(ValueError, match="finite and >= 0"):
        tel.record_phase(omni.COMPUTE, seconds)
    tel.record_phase(omni.COMPUTE, 0.005)
    tel.end_step()
    assert tel.counters()["misuse_errors"] == 1


def test_record_phase_longer_than_the_step_so_far_raises_value_error(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    tel.begin_step()
    clock.advance(0.010)
    with pytest.raises(ValueError, match="longer than"):
        tel.record_phase(omni.COMPUTE, 0.5)
    tel.end_step()


def test_phase_hooks_outside_a_step_raise_runtime_error(make_telemetry):
    tel = make_telemetry()
    with pytest.raises(RuntimeError, match="outside a step"):
        tel.begin_phase(omni.COMPUTE)
    with pytest.raises(RuntimeError, match="outside a step"):
        tel.record_phase("compute", 0.0)


def test_unknown_phases_raise_value_error(make_telemetry):
    tel = make_telemetry()
    tel.begin_step()
    with pytest.raises(ValueError, match="no_such_phase"):
        tel.begin_phase("no_such_phase")
    with pytest.raises(ValueError, match="unknown phase id 30"):
        tel.begin_phase(30)
    with pytest.raises(ValueError, match="unknown phase id 1000"):
        tel.begin_phase(1000)
    with pytest.raises(ValueError, match="unknown phase id -1"):
        tel.begin_phase(-1)
    with pytest.raises(TypeError, match="int id or a str name"):
        tel.begin_phase(1.5)
    with pytest.raises(ValueError, match="unknown phase"):
        tel.phase("no_such_phase")
    tel.end_step()


def test_hooks_after_close_raise_runtime_error(make_telemetry):
    tel = make_telemetry()
    tel.close()
    assert tel.closed
    tel.close()  # idempotent
    with pytest.raises(RuntimeError, match="after Close"):
        tel.begin_step()


def test_step_context_manager_ends_the_step_when_the_body_raises(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    with pytest.raises(KeyError):
        with tel.step():
            with tel.phase(omni.COMPUTE):
                clock.advance(0.010)
                raise KeyError("from the training loop")
    tel.flush()
    assert tel.counters()["steps_recorded"] == 1
    assert tel.counters()["misuse_errors"] == 0
    assert row(tel.snapshot(), "compute")["mean_ms"] == 10.0


def test_nested_step_context_manager_raises_on_entry(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    with tel.step():
        with pytest.raises(RuntimeError, match="still open"):
            with tel.step():
                pass  # pragma: no cover
        clock.advance(0.010)
    tel.flush()
    assert tel.counters()["steps_recorded"] == 1


def test_phase_context_manager_does_not_hide_an_error_ending_the_phase(make_telemetry):
    tel = make_telemetry(**NO_WARMUP)
    with tel.step():
        with pytest.raises(ValueError, match="no phase is open"):
            with tel.phase(omni.COMPUTE):
                tel.end_phase(omni.COMPUTE)  # ended by hand: the scope's end fails


def test_an_error_ending_the_step_is_noted_on_the_body_error_not_raised_instead(make_telemetry):
    tel = make_telemetry(**NO_WARMUP)
    with pytest.raises(KeyError) as info:
        with tel.step():
            tel.end_step()  # the scope's own end_step will fail
            raise KeyError("body")
    notes = getattr(info.value, "__notes__", [])
    assert any("ending the step also failed" in n for n in notes)
