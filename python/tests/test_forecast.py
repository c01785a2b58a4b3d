"""Idle-window forecasts and where they go: latest_forecast(), the file sink
and Python callback sinks."""

import json
import threading

import omni
import pytest
from conftest import NO_WARMUP, run_steps


def test_no_forecast_before_the_steps_are_stationary(make_telemetry, clock):
    tel = make_telemetry(publish_interval_s=0.0)
    assert tel.latest_forecast() is None
    run_steps(tel, clock, 3)
    tel.flush()
    assert tel.latest_forecast() is None


def test_forecast_after_stationary_steps_has_data_stall_windows_where_data_wait_was_long(
    make_telemetry, clock
):
    tel = make_telemetry(publish_interval_s=0.0, horizon_s=1.0)
    run_steps(tel, clock, 30, data_s=0.050, compute_s=0.020)
    tel.flush()
    f = tel.latest_forecast()
    assert f is not None
    assert f["schema"] == "omni.forecast" and f["version"] == 2
    assert f["last_step"] == 29
    assert f["steps_observed"] == 30  # the forecaster's own regime: all 30 steps
    assert f["k"] == 2.0
    windows = f["windows"]
    assert windows, f
    assert {w["kind"] for w in windows} == {"data_stall"}
    # Steady durations (sigma 0): each window is exactly the 50 ms data wait,
    # one per 70 ms step, starting now.
    assert [w["duration_ms"] for w in windows[:3]] == [50.0, 50.0, 50.0]
    assert [w["start_in_ms"] for w in windows[:3]] == [0.0, 70.0, 140.0]
    assert [w["step"] for w in windows[:3]] == [30, 31, 32]
    assert all(0.95 < w["confidence"] < 0.96 for w in windows)  # k = 2
    assert f["devices_needed_in_ms"] == 50.0
    assert tel.counters()["forecasts_published"] >= 1


def test_a_declared_checkpoint_missing_twice_in_a_row_is_not_forecast(make_telemetry, clock):
    tel = make_telemetry(
        publish_interval_s=0.0, checkpoint_every=10, checkpoint_offset=5, checkpoint_expected_s=0.3
    )
    run_steps(tel, clock, 16, data_s=0.0, compute_s=0.020)  # steps 5 and 15 saved nothing
    tel.flush()
    assert not [w for w in tel.latest_forecast()["windows"] if w["kind"] == "checkpoint"]


def test_forecast_declares_checkpoint_windows_from_options(make_telemetry, clock):
    tel = make_telemetry(
        publish_interval_s=0.0, checkpoint_every=10, checkpoint_offset=5, checkpoint_expected_s=0.3
    )
    # Steps 0-9: the declared step 5 had no checkpoint, once (twice in a row
    # sets the declaration aside: the test above).
    run_steps(tel, clock, 10, data_s=0.0, compute_s=0.020)
    tel.flush()
    f = tel.latest_forecast()
    ckpt = [w for w in f["windows"] if w["kind"] == "checkpoint"]
    assert ckpt and ckpt[0]["step"] == 15
    # Not measured yet: 80 % of the declared 300 ms from the window's open,
    # nothing by the clock (where its idle time begins is not known yet).
    assert ckpt[0]["guaranteed_ms"] == 240.0
    assert ckpt[0]["duration_ms"] == 0.0
    assert tel.forecast_options["checkpoint"] == {"every": 10, "offset": 5, "expected_s": 0.3,
                                                 "every_s": 0.0, "wall_lag_steps": 0}


def test_forecasting_off_gives_no_forecast(make_telemetry, clock):
    tel = make_telemetry(forecast=False, **NO_WARMUP)
    run_steps(tel, clock, 5)
    tel.flush()
    assert tel.latest_forecast() is None
    assert tel.counters()["forecasts_published"] == 0


def test_file_sink_writes_a_versioned_forecast_json_file(make_telemetry, clock, tmp_path):
    path = tmp_path / "forecast.json"
    tel = make_telemetry(forecast_file=path, **NO_WARMUP)
    run_steps(tel, clock, 5)
    tel.flush()
    doc = json.loads(path.read_text())
    assert doc["schema"] == "omni.forecast"
    assert doc["version"] == 2
    assert doc["last_step"] == 4
    assert doc["windows"] and doc["windows"][0]["kind"] == "data_stall"
    assert [p.name for p in tmp_path.iterdir()] == ["forecast.json"]  # no temp files left


def test_unwritable_forecast_file_raises_and_names_the_path(clock, tmp_path):
    path = tmp_path / "no_such_dir" / "forecast.json"
    with pytest.raises(FileNotFoundError, match=str(path)):
        omni.Telemetry(clock=clock, forecast_file=str(path))


def test_callback_sink_receives_forecast_dicts_on_the_worker_thread(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    received = []
    threads = set()

    def on_forecast(forecast):
        received.append(forecast)
        threads.add(threading.get_ident())

    tel.add_callback_sink(on_forecast)
    run_steps(tel, clock, 5)
    tel.flush()
    assert received
    assert all(isinstance(f, dict) and f["schema"] == "omni.forecast" for f in received)
    assert received[-1]["last_step"] == 4
    assert threading.get_ident() not in threads
    assert tel.counters()["export_errors"] == 0


def test_callback_sink_exception_is_counted_not_raised_into_training(make_telemetry, clock):
    tel = make_telemetry(**NO_WARMUP)
    calls = []

    def broken(forecast):
        calls.append(forecast["last_step"])
        raise ValueError("boom in the callback")

    tel.add_callback_sink(broken, name="broken")
    ok = []
    tel.add_callback_sink(ok.append)  # later sinks still get the forecast
    run_steps(tel, clock, 5)  # the forecaster publishes from the 5th step on
    tel.flush()
    run_steps(tel, clock, 3)
    tel.flush()
    assert len(calls) >= 2 and ok
    counters = tel.counters()
    assert counters["export_errors"] == len(calls)
    assert "boom in the callback" in counters["last_error"]
    assert "broken" in counters["last_error"]
    # close() reports the first export error.
    with pytest.raises(RuntimeError, match="boom in the callback"):
        tel.close()


def test_callback_sink_must_be_callable(make_telemetry):
    tel = make_telemetry()
    with pytest.raises(TypeError, match="callable"):
        tel.add_callback_sink(42)


def test_pipeline_bubble_fraction_is_p_minus_one_over_m_plus_p_minus_one():
    assert omni.pipeline_bubble_fraction(4, 12) == 3 / 15
    assert omni.pipeline_bubble_fraction(1, 8) == 0.0
    with pytest.raises(ValueError, match="stages"):
        omni.pipeline_bubble_fraction(0, 8)
    with pytest.raises(ValueError, match="micro_batches"):
        omni.pipeline_bubble_fraction(4, 0)
