"""The co-location guest API from Python: the gate, the loop and the live
window source (docs/colocation.md)."""

import os
import time

import omni
import pytest
from conftest import NO_WARMUP, run_steps

MS = 1_000_000


def window(clock, wid, remaining_ms, confidence=0.95):
    now = clock.now_ns()
    return omni.OpenWindow(open=True, window_id=wid, opened_at_ns=now,
                           remaining_ns=remaining_ms * MS, as_of_ns=now, confidence=confidence)


def test_the_gate_starts_a_unit_only_when_the_remainder_covers_cost_and_guard(clock):
    gate = omni.GuestGate(guard_s=0.001, min_confidence=0.9, clock=clock)
    w = window(clock, 1, 10)
    assert gate.before_unit(w, 0.005) == ("start", 10 * MS)
    gate.unit_done(clock.now_ns())
    assert gate.before_unit(w, 0.0095)[0] == "wait_too_short"  # 9.5 + 1 > 10
    assert gate.before_unit(window(clock, 2, 10, confidence=0.5), 0.001)[0] == \
        "wait_low_confidence"
    assert gate.before_unit(omni.OpenWindow(), 0.001)[0] == "wait_no_window"
    clock.advance(0.004)
    assert gate.before_unit(w, 0.005) == ("start", 6 * MS), "the remainder shrinks with time"
    stats = gate.stats()
    assert stats["units_started"] == 2 and stats["waits"] == 3


def test_the_loop_runs_python_units_in_the_window_until_max_units(clock):
    gate = omni.GuestGate(clock=clock)
    source = omni.ManualWindowSource(gate)
    source.open(window(clock, 1, 100))
    done = []

    def unit():
        clock.advance(0.002)
        done.append(clock.now_ns())

    r = omni.run_guest_loop(gate, source, unit, max_units=3, initial_unit_s=0.002, clock=clock)
    assert r["why"] == "max_units" and r["units"] == 3 and len(done) == 3
    assert r["stats"]["units_started"] == 3 and r["stats"]["deadline_misses"] == 0


def test_a_close_during_a_unit_is_a_yield_and_the_stop_ends_the_loop(clock):
    gate = omni.GuestGate(clock=clock)
    source = omni.ManualWindowSource(gate)
    source.open(window(clock, 7, 100))
    stop = omni.GuestStop()

    def unit():
        clock.advance(0.001)
        source.close(7, clock.now_ns())  # the host is busy again mid-unit
        clock.advance(0.002)
        stop.set()

    r = omni.run_guest_loop(gate, source, unit, stop=stop, initial_unit_s=0.003, clock=clock)
    assert r["why"] == "stop_requested" and r["units"] == 1
    assert r["stats"]["yields"] == 1
    assert r["stats"]["yield_max_ns"] == 2 * MS
    assert r["stats"]["deadline_misses"] == 1
    assert stop.is_set()


def test_an_exception_in_a_unit_stops_the_loop_and_is_raised(clock):
    gate = omni.GuestGate(clock=clock)
    source = omni.ManualWindowSource(gate)
    source.open(window(clock, 1, 100))

    def unit():
        raise KeyError("the unit's own error")

    with pytest.raises(KeyError, match="the unit's own error"):
        omni.run_guest_loop(gate, source, unit, initial_unit_s=0.001, clock=clock)


def test_bad_arguments_raise_clear_errors(clock):
    with pytest.raises(ValueError):
        omni.GuestGate(guard_s=-1.0)
    with pytest.raises(TypeError, match="callable"):
        omni.run_guest_loop(omni.GuestGate(), omni.ManualWindowSource(), 3)
    name = f"omni-pytest-missing-{os.getpid()}"
    with pytest.raises(FileNotFoundError, match=name):
        omni.ChannelWindowSource.open(name)


def wait_until(source, pred, timeout_s=5.0):
    until = time.monotonic() + timeout_s
    while not pred(source.current()):
        if time.monotonic() > until:
            return False
        source.wait_for_change(0.01)
    return True


def test_a_guest_sees_a_python_hosts_live_windows_of_the_kinds_it_uses():
    name = f"omni-pytest-coloc-{os.getpid()}"
    tel = omni.Telemetry(window_channel=name)
    try:
        gate = omni.GuestGate()
        stalls = omni.ChannelWindowSource.open(name, gate, kinds="data_stall")
        evals = omni.ChannelWindowSource.open(name, kinds="eval")
        with pytest.raises(ValueError, match="coffee"):
            omni.ChannelWindowSource.open(name, kinds="coffee")
        assert not stalls.current().open
        with tel.step():
            with tel.phase(omni.DATA_WAIT):
                assert wait_until(stalls, lambda w: w.open), "the host's data stall is a window"
                opened = stalls.current().window_id
                assert wait_until(evals, lambda w: evals.stats()["skipped"] == 1)
                assert not evals.current().open, "a guest of eval windows does not use it"
            with tel.phase(omni.COMPUTE):
                assert wait_until(stalls, lambda w: not w.open), "busy again"
        assert stalls.stats()["opens"] == 1 and stalls.stats()["closes"] == 1
        assert gate.before_unit(stalls.current(), 0.001)[0] == "wait_no_window"
        assert opened > 0
    finally:
        tel.close()
    assert wait_until(stalls, lambda w: stalls.stats()["writer_closed"])


def test_a_guest_sees_the_gap_between_a_python_hosts_steps_as_a_host_side_window():
    # The naive loop: the batch is fetched outside the step hooks.
    name = f"omni-pytest-gap-{os.getpid()}"
    tel = omni.Telemetry(window_channel=name, **NO_WARMUP)
    try:
        gaps = omni.ChannelWindowSource.open(name, kinds="host_side")
        for _ in range(4):
            tel.begin_step()
            tel.end_step()
            time.sleep(0.005)  # the loader's next batch, outside the step
        tel.flush()  # the worker has measured those gaps
        tel.begin_step()
        tel.end_step()
        assert wait_until(gaps, lambda w: w.open), "the gap after the step is a window"
        tel.begin_step()
        assert wait_until(gaps, lambda w: not w.open), "busy again at the next step"
        tel.end_step()
        assert gaps.stats()["opens"] >= 1 and gaps.stats()["closes"] >= 1
    finally:
        tel.close()


def test_a_guest_that_will_not_wait_stops_when_the_host_is_busy_beyond_max_wait(clock):
    gate = omni.GuestGate(clock=clock)
    source = omni.ManualWindowSource(gate)
    source.open(window(clock, 1, 8))  # room for one 5 ms unit and the guard
    busy_until = clock.now_ns() + 10_000 * MS
    assert source.no_window_before_ns() == 0, "no statement yet"

    def unit():
        clock.advance(0.005)
        source.close(1, clock.now_ns())
        source.set_no_window_before(busy_until)  # the host: nothing for 10 s

    r = omni.run_guest_loop(gate, source, unit, initial_unit_s=0.005, max_wait_s=2.0, clock=clock)
    assert r["why"] == "host_busy" and r["units"] == 1
    assert r["no_window_before_ns"] == busy_until and r["waited_ns"] == 0
    # With a statement within max_wait it would wait; with none, a zero
    # max_wait gives up at the first wait.
    r = omni.run_guest_loop(omni.GuestGate(clock=clock), omni.ManualWindowSource(), unit,
                            max_wait_s=0.0, clock=clock)
    assert r["why"] == "waited_too_long" and r["units"] == 0
    assert r["stats"]["too_short_windows"] == 0 and r["unit_bound_ns"] == 50 * MS
    # An open window too short for the unit: counted, with its claim.
    short = omni.ManualWindowSource()
    short.open(window(clock, 2, 3))
    r = omni.run_guest_loop(omni.GuestGate(clock=clock), short, unit, initial_unit_s=0.005,
                            max_wait_s=0.0, clock=clock)
    assert r["why"] == "waited_too_long" and r["units"] == 0
    assert r["stats"]["too_short_windows"] == 1 and r["stats"]["too_short_waits"] == 1
    assert r["stats"]["too_short_longest_ns"] == 3 * MS and r["unit_bound_ns"] == 5 * MS
    # One window refused, no unit measured: nothing to probe.
    assert r["unit_probes"] == 0 and r["unit_forgiven"] == 0
    with pytest.raises(ValueError, match="max_wait_s"):
        omni.run_guest_loop(gate, source, unit, max_wait_s=-1.0, clock=clock)


def test_a_guest_reads_a_python_hosts_outlook_and_leaves_when_it_announces_a_busy_period(
        make_telemetry, clock):
    name = f"omni-pytest-outlook-{os.getpid()}"
    tel = make_telemetry(window_channel=name, horizon_s=1.0, **NO_WARMUP)
    gate = omni.GuestGate()
    source = omni.ChannelWindowSource.open(name, gate, kinds="data_stall")
    assert source.outlook()["state"] == "none" and source.no_window_before_ns() == 0

    run_steps(tel, clock, 20)
    tel.flush()
    out = source.outlook()
    assert out["state"] == "forecast" and out == tel.latest_outlook()
    stall = out["kinds"]["data_stall"]
    assert stall["outlook"] == "next" and stall["last_seen_step"] == 19
    assert out["kinds"]["eval"]["outlook"] == "unknown"
    forecast = tel.latest_forecast()
    assert stall["earliest_start_ns"] == min(
        w["earliest_start_ns"] for w in forecast["windows"] if w["kind"] == "data_stall")
    assert source.no_window_before_ns() == stall["earliest_start_ns"]
    # The forecast's windows a live notice is matched to, by step, phase and
    # ordinal, scaled by how such claims fared: none before a few of them
    # were measured (the worker sees each step after a forecast here).
    assert out["claims"] == []
    for _ in range(5):
        run_steps(tel, clock, 1)
        tel.flush()
    out = source.outlook()
    stall = out["kinds"]["data_stall"]
    forecast = tel.latest_forecast()
    guaranteed = {w["step"]: w["guaranteed_ns"] for w in forecast["windows"]
                  if w["kind"] == "data_stall"}
    claims = out["claims"]
    assert claims and {c["kind"] for c in claims} == {"data_stall"}
    for c in claims:
        assert c["phase"] == 0 and c["ordinal"] == 0
        assert 0 < c["guaranteed_ns"] <= guaranteed[c["step"]]
    assert min(c["step"] for c in claims) == out["last_step"] + 1

    until = clock.now_ns() + 600 * 10**9
    tel.announce_busy(until)
    assert source.outlook()["busy_until_ns"] == until
    assert source.no_window_before_ns() == until
    # The host's times are on its (fake) clock: so is the guest's loop.
    r = omni.run_guest_loop(gate, source, lambda: None, max_wait_s=5.0, clock=clock)
    assert r["why"] == "host_busy" and r["units"] == 0 and r["no_window_before_ns"] == until
    tel.announce_busy(0)
    assert source.no_window_before_ns() == stall["earliest_start_ns"]
    with pytest.raises(ValueError, match="until_ns"):
        tel.announce_busy(-1)


def test_a_guest_on_another_host_reads_the_hosts_windows_and_outlook_from_its_store(
        make_telemetry, clock, tmp_path):
    # The host's telemetry runs on a fake clock, the guest's source on the
    # real one: two machines' clocks, which the source maps one to the other.
    store = omni.open_store(f"file://{tmp_path}/store")
    tel = make_telemetry(horizon_s=1.0, **NO_WARMUP)
    with pytest.raises(ValueError, match="bad prefix"):
        tel.add_store_sink(store, "bad prefix")
    tel.add_store_sink(store, "job/r0")
    gate = omni.GuestGate()
    source = omni.StoreWindowSource.open(store, gate, prefix="job/r0", poll_s=0.001,
                                         kinds="data_stall")
    # A value there at the source's first read is of unknown age and not
    # used: the watcher's first read must come before the host's stall (under
    # load its thread started after the stall was published, and the test
    # waited in vain).
    until = time.monotonic() + 5
    while source.stats()["reads"] == 0:
        assert time.monotonic() < until, "the source's watcher never read the store"
        time.sleep(0.001)
    run_steps(tel, clock, 30)
    tel.flush()
    with tel.step():
        with tel.phase(omni.DATA_WAIT):
            tel.flush()
            assert wait_until(source, lambda w: w.open), "the host's data stall, from its store"
            w = source.current()
            assert 0 < w.remaining_ns <= 5 * MS, "thirty 5 ms stalls measured"
            assert w.as_of_ns <= time.monotonic_ns(), "dated on the guest's clock"
        with tel.phase(omni.COMPUTE):
            tel.flush()
            assert wait_until(source, lambda w: not w.open), "busy again"
    st = source.stats()
    assert st["opens"] == 1 and st["closes"] == 1 and st["errors"] == 0, st
    assert gate.before_unit(source.current(), 0.001)[0] == "wait_no_window"
    tel.announce_busy(clock.now_ns() + 600 * 10**9)
    tel.flush()
    until = time.monotonic() + 5
    while source.no_window_before_ns() < time.monotonic_ns() + 500 * 10**9:
        assert time.monotonic() < until, "the announced busy period did not arrive"
        time.sleep(0.01)
    assert source.outlook()["busy_until_ns"] == source.no_window_before_ns()
