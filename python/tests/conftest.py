"""Shared fixtures. The package under test is the one built into
<build>/python (run with PYTHONPATH=<build>/python)."""

import sys

import pytest

sys.dont_write_bytecode = True

try:
    import omni
except ImportError as e:  # pragma: no cover - a setup problem, not a test failure
    raise pytest.UsageError(
        f"cannot import omni ({e}); build the omni_python target and run with "
        "PYTHONPATH=<build>/python /usr/bin/python3 -m pytest python/tests"
    )

# Options that make the statistics deterministic in tests: no warm-up, a
# forecast after every step.
NO_WARMUP = dict(warmup_min_steps=0, warmup_max_steps=0, publish_interval_s=0.0)


@pytest.fixture
def clock():
    return omni.FakeClock()


@pytest.fixture
def make_telemetry(clock):
    """Creates telemetries on the fake clock and closes them after the test."""
    created = []

    def make(**options):
        options.setdefault("clock", clock)
        tel = omni.Telemetry(**options)
        created.append(tel)
        return tel

    yield make
    for tel in created:
        try:
            tel.close()
        except RuntimeError:
            pass  # export errors some tests provoke on purpose


def run_steps(tel, clock, n, data_s=0.005, compute_s=0.020, first=None):
    """n steps of data_wait then compute, with the given durations."""
    for i in range(n):
        with tel.step(None if first is None else first + i):
            with tel.phase(omni.DATA_WAIT):
                clock.advance(data_s)
            with tel.phase(omni.COMPUTE):
                clock.advance(compute_s)


def row(snapshot, name):
    rows = [r for r in snapshot["rows"] if r["name"] == name]
    assert rows, f"no row {name!r} in {[r['name'] for r in snapshot['rows']]}"
    return rows[0]

