"""Rolling statistics measured on a fake clock: exact means and percentiles,
warm-up steps left out, checkpoint steps attributed to their own row."""

import math

import omni
import pytest
from conftest import NO_WARMUP, row, run_steps


def test_snapshot_reports_exact_mean_and_percentiles_of_known_durations(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    # compute takes 1, 2, ..., 20 ms; data_wait always 5 ms.
    for i in range(1, 21):
        with tel.step():
            with tel.phase(omni.DATA_WAIT):
                clock.advance(0.005)
            with tel.phase(omni.COMPUTE):
                clock.advance(i / 1000)
    tel.flush()
    snap = tel.snapshot()
    assert snap["schema"] == "omni.stats"
    assert snap["steps_seen"] == 20
    assert snap["warmup_steps"] == 0
    assert snap["warming_up"] is False

    compute = row(snap, "compute")
    assert compute["idle_kind"] == "busy"
    assert compute["count"] == 20
    assert compute["mean_ms"] == 10.5
    assert compute["p50_ms"] == 10.5  # linear interpolation between ranks
    assert compute["p95_ms"] == 19.05
    assert compute["min_ms"] == 1.0
    assert compute["max_ms"] == 20.0
    assert compute["stddev_ms"] == pytest.approx(math.sqrt((20**2 - 1) / 12), abs=1e-6)

    data = row(snap, "data_wait")
    assert data["idle_kind"] == "data_stall"
    assert (data["mean_ms"], data["p50_ms"], data["p95_ms"], data["stddev_ms"]) == (5.0, 5.0, 5.0, 0.0)

    step = row(snap, "step")
    assert step["count"] == 20
    assert step["mean_ms"] == 15.5
    assert step["min_ms"] == 6.0 and step["max_ms"] == 25.0
    assert row(snap, "uncovered")["max_ms"] == 0.0


def test_snapshot_table_is_text_with_one_line_per_row(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    run_steps(tel, clock, 3)
    tel.flush()
    table = tel.snapshot_table()
    assert "step statistics: 3 steps seen" in table
    assert "compute" in table and "data_wait" in table


def test_warmup_steps_are_left_out_of_the_statistics(make_telemetry, clock):
    tel = make_telemetry(warmup_min_steps=0, warmup_max_steps=3)
    # Three slow warm-up steps (JIT, allocator, ...), then steady 20 ms steps.
    run_steps(tel, clock, 3, data_s=0.0, compute_s=0.5)
    run_steps(tel, clock, 10, data_s=0.0, compute_s=0.020)
    tel.flush()
    snap = tel.snapshot()
    assert snap["steps_seen"] == 13
    assert snap["warmup_steps"] == 3
    compute = row(snap, "compute")
    assert compute["count"] == 10
    assert compute["max_ms"] == 20.0


def test_default_warmup_ends_once_a_window_of_steady_steps_was_seen(make_telemetry, clock):
    tel = make_telemetry()
    run_steps(tel, clock, 5)
    tel.flush()
    assert tel.snapshot()["warming_up"] is True
    run_steps(tel, clock, 25)
    tel.flush()
    snap = tel.snapshot()
    assert snap["warming_up"] is False
    assert snap["warmup_steps"] == 10  # the default warm-up window
    assert row(snap, "step")["count"] == 20


def test_checkpoint_step_is_attributed_to_the_checkpoint_row_not_the_step_row(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    run_steps(tel, clock, 10, data_s=0.0, compute_s=0.020)
    with tel.step():
        with tel.phase(omni.COMPUTE):
            clock.advance(0.020)
        with tel.phase(omni.CHECKPOINT):
            clock.advance(0.300)
    run_steps(tel, clock, 2, data_s=0.0, compute_s=0.020)
    tel.flush()
    snap = tel.snapshot()
    step = row(snap, "step")
    assert step["count"] == 12
    assert step["max_ms"] == 20.0
    ckpt_step = row(snap, "step[checkpoint]")
    assert ckpt_step["count"] == 1
    assert ckpt_step["mean_ms"] == 320.0
    ckpt = row(snap, "checkpoint")
    assert ckpt["idle_kind"] == "checkpoint"
    assert ckpt["mean_ms"] == 300.0


def test_record_phase_adds_a_phase_measured_elsewhere(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    for _ in range(4):
        with tel.step():
            clock.advance(0.030)
            tel.record_phase(omni.COMPUTE, 0.025)  # e.g. from CUDA events
    tel.flush()
    snap = tel.snapshot()
    assert row(snap, "compute")["mean_ms"] == 25.0
    assert row(snap, "uncovered")["mean_ms"] == 5.0


def test_end_phase_as_records_a_save_found_abandoned_as_host_side_time(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    tel.register_phase("save_abandoned", idle="host_side")
    for i in range(4):
        with tel.step():
            tel.begin_phase(omni.CHECKPOINT)
            clock.advance(3.0 if i == 2 else 0.015)
            if i == 2:  # another replica died during this save
                tel.end_phase_as(omni.CHECKPOINT, "save_abandoned")
            else:
                tel.end_phase(omni.CHECKPOINT)
    tel.flush()
    snap = tel.snapshot()
    assert (row(snap, "checkpoint")["count"], row(snap, "checkpoint")["max_ms"]) == (3, 15.0)
    assert row(snap, "save_abandoned")["max_ms"] == 3000.0
    assert row(snap, "save_abandoned")["idle_kind"] == "host_side"
    with tel.step():
        tel.begin_phase(omni.CHECKPOINT)
        with pytest.raises(ValueError, match="not registered"):
            tel.end_phase_as(omni.CHECKPOINT, "nope")
        with pytest.raises(ValueError, match="innermost open phase is checkpoint"):
            tel.end_phase_as(omni.COMPUTE, "save_abandoned")
        tel.end_phase(omni.CHECKPOINT)


def test_user_phases_are_registered_by_name_and_used_by_name_or_id(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    loss_id = tel.register_phase("loss_logging", idle="host_side")
    assert loss_id >= omni.NUM_BUILTIN_PHASES
    assert tel.register_phase("loss_logging", "host_side") == loss_id  # idempotent
    assert tel.find_phase("loss_logging") == loss_id
    assert tel.find_phase("compute") == omni.COMPUTE
    assert tel.find_phase("nope") is None
    assert {"id": loss_id, "name": "loss_logging", "idle": "host_side"} in tel.phases
    for _ in range(3):
        with tel.step():
            with tel.phase("compute"):
                clock.advance(0.010)
            with tel.phase("loss_logging"):
                clock.advance(0.002)
            tel.begin_phase(loss_id)
            clock.advance(0.001)
            tel.end_phase("loss_logging")
    tel.flush()
    logging = row(tel.snapshot(), "loss_logging")
    assert logging["idle_kind"] == "host_side"
    assert logging["mean_ms"] == 3.0


def test_register_phase_rejects_bad_names_and_idle_kinds(make_telemetry):
    tel = make_telemetry()
    with pytest.raises(ValueError, match="idle"):
        tel.register_phase("x", idle="sleeping")
    with pytest.raises(ValueError):
        tel.register_phase("has space")
    tel.register_phase("y", idle="busy")
    with pytest.raises(RuntimeError, match="y"):  # AlreadyExists with another kind
        tel.register_phase("y", idle="eval")
