"""Step log and trace files, reading a step log back and evaluating it."""

import json

import omni
import pytest
from conftest import NO_WARMUP, run_steps


def test_step_log_and_trace_files_are_written(make_telemetry, clock, tmp_path):
    log_path = tmp_path / "steps.jsonl"
    trace_path = tmp_path / "trace.json"
    tel = make_telemetry(step_log=log_path, trace=str(trace_path), source="pytest", **NO_WARMUP)
    run_steps(tel, clock, 6)
    tel.close()

    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert lines[0]["type"] == "header"
    assert lines[0]["schema"] == "omni.steplog"
    assert lines[0]["version"] == 1
    assert len(lines) == 7

    trace = json.loads(trace_path.read_text())
    names = [e["name"] for e in trace]
    assert "step 0" in names and "step 5" in names
    assert "data_wait" in names and "compute" in names


def test_read_step_log_summarises_the_log(make_telemetry, clock, tmp_path):
    log_path = tmp_path / "steps.jsonl"
    tel = make_telemetry(step_log=log_path, source="pytest", checkpoint_every=100,
                         eval_every_s=600.0, eval_wall_lag_steps=1, **NO_WARMUP)
    tel.register_phase("loss_logging", "host_side")
    run_steps(tel, clock, 4, first=10)
    tel.close()

    info = omni.read_step_log(log_path)
    assert info["path"] == str(log_path)
    assert info["source"] == "pytest"
    assert info["version"] == 1
    assert info["steps"] == 4
    assert (info["first_step"], info["last_step"]) == (10, 13)
    assert info["duration_s"] == pytest.approx(4 * 0.025)
    assert info["checkpoint"]["every"] == 100
    assert (info["eval"]["every"], info["eval"]["every_s"]) == (0, 600.0)  # by wall time
    assert info["eval"]["wall_lag_steps"] == 1  # one step after the timer's check
    assert {"id": omni.DATA_WAIT, "name": "data_wait", "idle": "data_stall"} in info["phases"]
    assert any(p["name"] == "loss_logging" for p in info["phases"])
    assert info["unfinished_tail_bytes"] == 0


def test_read_step_log_of_a_log_being_written_leaves_out_its_unfinished_line(
        make_telemetry, clock, tmp_path):
    log_path = tmp_path / "steps.jsonl"
    tel = make_telemetry(step_log=log_path, **NO_WARMUP)
    run_steps(tel, clock, 3)
    tel.close()
    with open(log_path, "a") as f:
        f.write('{"type":"step","step":3,"start_')  # the writer's line in progress

    info = omni.read_step_log(log_path)
    assert info["steps"] == 3
    assert info["unfinished_tail_bytes"] == len('{"type":"step","step":3,"start_')


def test_read_step_log_of_a_missing_file_raises_file_not_found_naming_it(tmp_path):
    path = tmp_path / "missing.jsonl"
    with pytest.raises(FileNotFoundError, match=str(path)):
        omni.read_step_log(path)


def test_read_step_log_of_a_malformed_file_raises_value_error_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("this is not json\n")
    with pytest.raises(ValueError, match="bad.jsonl"):
        omni.read_step_log(path)


@pytest.mark.parametrize("bad", [
    '{"type": 5, "step": 0, "start_ns": 0, "end_ns": 10, "spans": []}',
    '{"type": "step", "step": 0, "start_ns": 0, "end_ns": 10, "spans": [1]}',
    '{"type": "step", "step": "zero", "start_ns": 0, "end_ns": 10, "spans": []}',
])
def test_read_step_log_of_a_field_of_the_wrong_type_raises_value_error_naming_file_and_line(
        make_telemetry, tmp_path, bad):
    good = tmp_path / "good.jsonl"
    make_telemetry(step_log=good).close()
    header = good.read_text().splitlines()[0]
    path = tmp_path / "types.jsonl"
    path.write_text(header + "\n" + bad + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: "):
        omni.read_step_log(path)


def test_evaluate_scores_the_forecasts_of_a_step_log(make_telemetry, clock, tmp_path):
    log_path = tmp_path / "steps.jsonl"
    tel = make_telemetry(step_log=log_path, **NO_WARMUP)
    run_steps(tel, clock, 40, data_s=0.010, compute_s=0.020)
    tel.close()

    report = omni.evaluate(log_path, stride=5, k=2.0, horizon_s=0.5)
    assert report["schema"] == "omni.forecast_eval"
    assert report["version"] == 2
    assert report["next_step_coverage"] == 1.0
    assert report["forecasts"] > 0
    assert report["windows"] > 0
    assert report["total"]["precision"] == 1.0  # perfectly regular steps
    assert "data_stall" in report["by_kind"]
    # The live notices a guest would have read, and the union with the windows.
    assert report["notices"]["confidence"] == 0.95
    assert report["notices"]["first_claims"] > 0
    assert report["notices"]["total"]["precision"] == 1.0
    assert report["combined"]["total"]["precision"] == 1.0
    with pytest.raises(ValueError, match="stride"):
        omni.evaluate(log_path, stride=0)
    with pytest.raises(ValueError, match="horizon_s"):
        omni.evaluate(log_path, horizon_s=float("nan"))


def test_unwritable_step_log_path_raises_naming_the_path(clock, tmp_path):
    path = tmp_path / "no_such_dir" / "steps.jsonl"
    with pytest.raises(FileNotFoundError, match=str(path)):
        omni.Telemetry(clock=clock, step_log=path)
