"""Checkpoints of Python state: numpy arrays, Python's and numpy's RNGs, the
sampler; verification and fallback; errors."""

import random

import numpy as np
import omni
import pytest
from omni.state import ArrayState, JsonState, NumpyRandomState, PythonRandomState

TRUE_W = np.linspace(-1.0, 1.0, 8)


class LinearRegression:
    """A tiny SGD-with-momentum linear regression whose data and learning
    rate come from numpy's global RNG and Python's `random`."""

    def __init__(self):
        self.arrays = {"w": np.zeros(8), "b": np.zeros(1), "m_w": np.zeros(8), "m_b": np.zeros(1)}
        self.progress = JsonState({"losses": []})

    def registry(self):
        reg = omni.StateRegistry()
        reg.register("model", ArrayState(self.arrays))
        reg.register("progress", self.progress)
        reg.register("rng/python", PythonRandomState())
        reg.register("rng/numpy", NumpyRandomState())
        return reg

    def step(self):
        a = self.arrays
        x = np.random.randn(16, 8)
        y = x @ TRUE_W + 0.5 + np.random.normal(0.0, 0.1, 16) + random.gauss(0.0, 0.01)
        err = x @ a["w"] + a["b"] - y
        lr = 0.05 * (1.0 + 0.1 * random.random())
        a["m_w"] *= 0.9
        a["m_w"] += x.T @ err / 16
        a["m_b"] *= 0.9
        a["m_b"] += err.mean()
        a["w"] -= lr * a["m_w"]
        a["b"] -= lr * a["m_b"]
        self.progress["losses"].append(float((err**2).mean()))


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)


def test_training_loop_restored_from_a_checkpoint_continues_bit_identically(tmp_path):
    steps, k = 40, 17
    seed_all(1234)
    reference = LinearRegression()
    for _ in range(steps):
        reference.step()

    seed_all(1234)
    first = LinearRegression()
    with omni.CheckpointManager(tmp_path / "ckpt") as ckpt:
        reg = first.registry()
        for step in range(k):
            first.step()
        ckpt.save(k - 1, reg, metadata={"note": "k"})

    seed_all(999)  # a fresh process: other RNG states, fresh objects
    resumed = LinearRegression()
    with omni.CheckpointManager(tmp_path / "ckpt") as ckpt:
        info = ckpt.restore(resumed.registry())
        assert info["step"] == k - 1
        assert info["metadata"] == {"note": "k"}
        assert info["skipped"] == []
        for _ in range(info["step"] + 1, steps):
            resumed.step()

    for name, array in reference.arrays.items():
        assert resumed.arrays[name].tobytes() == array.tobytes(), name
    assert resumed.progress["losses"] == reference.progress["losses"]


def test_python_and_numpy_random_states_are_restored_exactly(tmp_path):
    seed_all(7)
    random.gauss(0, 1)  # leaves a cached gauss_next
    np.random.standard_normal()  # leaves a cached gaussian
    gen = np.random.default_rng(42)
    gen.random(3)
    py_rng = random.Random(5)
    reg = omni.StateRegistry()
    reg.register("python", PythonRandomState())
    reg.register("python_instance", PythonRandomState(py_rng))
    reg.register("numpy", NumpyRandomState())
    reg.register("generator", NumpyRandomState(gen))
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, reg)
        expected = (
            random.getstate(),
            [random.gauss(0, 1) for _ in range(3)],
            [np.random.standard_normal() for _ in range(3)],
            gen.random(4).tolist(),
            py_rng.random(),
        )
        seed_all(8)
        gen.random(10)
        py_rng.seed(0)
        assert ckpt.restore(reg)["step"] == 0
        got = (
            random.getstate(),
            [random.gauss(0, 1) for _ in range(3)],
            [np.random.standard_normal() for _ in range(3)],
            gen.random(4).tolist(),
            py_rng.random(),
        )
    assert got == expected


def test_restore_returns_none_in_an_empty_directory(tmp_path):
    with omni.CheckpointManager(tmp_path / "empty") as ckpt:
        assert ckpt.restore({"progress": JsonState()}) is None
        assert ckpt.list() == []
    assert omni.list_checkpoints(tmp_path / "empty") == []


def test_only_invalid_checkpoints_raise_naming_them_unless_opened_to_start_fresh(tmp_path):
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(3, {"progress": JsonState({"a": 1})})
    shard = next((tmp_path / "step-000000000003").glob("*.safetensors"))
    with open(shard, "r+b") as f:
        f.truncate(10)
    with omni.CheckpointManager(tmp_path) as ckpt:
        with pytest.raises(RuntimeError, match="step-000000000003.*start fresh"):
            ckpt.restore({"progress": JsonState()})
    with omni.CheckpointManager(tmp_path, start_fresh=True) as ckpt:
        assert ckpt.restore({"progress": JsonState()}) is None


def test_restore_of_a_missing_step_raises_file_not_found(tmp_path):
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(3, {"progress": JsonState({"a": 1})})
        with pytest.raises(FileNotFoundError):
            ckpt.restore({"progress": JsonState()}, step=4)


def test_a_corrupted_shard_makes_restore_fall_back_to_the_previous_checkpoint(tmp_path):
    arrays = {"w": np.arange(64, dtype=np.float32)}
    reg = omni.StateRegistry()
    reg.register("model", ArrayState(arrays))
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(1, reg)
        arrays["w"] += 1
        ckpt.save(2, reg)
        shard = tmp_path / "step-000000000002" / "rank-00000.safetensors"
        data = bytearray(shard.read_bytes())
        data[-3] ^= 0x01  # inside w's bytes
        shard.write_bytes(bytes(data))
        with pytest.raises(RuntimeError, match="rank-00000.safetensors"):
            omni.verify_checkpoint(tmp_path / "step-000000000002")
        omni.verify_checkpoint(tmp_path / "step-000000000001")

        arrays["w"][:] = -5
        info = ckpt.restore(reg)
    assert info["step"] == 1
    assert len(info["skipped"]) == 1
    assert "step-000000000002" in info["skipped"][0]
    assert "model/w" in info["skipped"][0]
    assert np.array_equal(arrays["w"], np.arange(64, dtype=np.float32))


def test_read_tensor_into_with_another_dtype_or_shape_raises_value_error_naming_the_key(tmp_path):
    class Holder:
        def __init__(self, out):
            self.out = out

        def save(self, writer):
            writer.put_tensor("weights", np.zeros((2, 3), dtype=np.float32))

        def load(self, reader):
            reader.read_tensor_into("weights", self.out)

    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"h": Holder(None)})
        for out in (np.zeros((2, 3), dtype=np.float64), np.zeros((3, 2), dtype=np.float32)):
            with pytest.raises(ValueError, match="weights"):
                ckpt.restore({"h": Holder(out)})
        ok = np.ones((2, 3), dtype=np.float32)
        ckpt.restore({"h": Holder(ok)})
        assert not ok.any()
        # Read-only and non-contiguous outputs are refused, naming the key.
        ro = np.ones((2, 3), dtype=np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="weights"):
            ckpt.restore({"h": Holder(ro)})
        with pytest.raises(ValueError, match="weights"):
            ckpt.restore({"h": Holder(np.ones((3, 2), dtype=np.float32).T)})


def test_array_state_checks_every_array_before_changing_any(tmp_path):
    arrays = {"a": np.ones(3), "b": np.ones(2)}
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"m": ArrayState(arrays)})
        other = {"a": np.zeros(3), "b": np.zeros(5)}
        with pytest.raises(ValueError, match="'b'"):
            ckpt.restore({"m": ArrayState(other)})
        assert not other["a"].any()  # untouched


def test_every_supported_dtype_round_trips_and_others_are_refused(tmp_path):
    dtypes = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
    src = {d: (np.arange(12) % 3).astype(d).reshape(3, 4) for d in dtypes}
    src["scalar"] = np.array(2.5)
    src["strided"] = np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2]  # copied on save
    seen = {}

    class All:
        def save(self, writer):
            for key, array in src.items():
                writer.put_tensor(key, array)
            writer.put_bytes("blob", b"\x00hello")
            writer.put_tensor("from_bytes", b"abc")

        def load(self, reader):
            seen["keys"] = reader.keys()
            seen["find"] = {key: reader.find(key) for key in src}
            seen["arrays"] = {key: reader.read_tensor(key) for key in src}
            seen["blob"] = reader.read_bytes("blob")
            seen["contains"] = ("blob" in reader, "nope" in reader)
            with pytest.raises(KeyError, match="nope"):
                reader.find("nope")

    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"all": All()})
        ckpt.restore({"all": All()})
    assert seen["keys"] == sorted(list(src) + ["blob", "from_bytes"])
    for key, array in src.items():
        assert seen["find"][key] == (array.dtype.name, array.shape)
        got = seen["arrays"][key]
        assert got.dtype == array.dtype and got.shape == array.shape
        assert np.array_equal(got, array)
    assert seen["blob"] == b"\x00hello"
    assert seen["contains"] == (True, False)

    class Bad:
        def __init__(self, value):
            self.value = value

        def save(self, writer):
            writer.put_tensor("x", self.value)

        def load(self, reader):
            pass

    with omni.CheckpointManager(tmp_path / "bad") as ckpt:
        with pytest.raises(ValueError, match="'x'.*uint16|uint16.*'x'|x.*unsupported"):
            ckpt.save(0, {"bad": Bad(np.zeros(3, dtype=np.uint16))})
        with pytest.raises(TypeError, match="x"):
            ckpt.save(0, {"bad": Bad(3.5)})
        assert ckpt.list() == []


def test_an_exception_raised_by_a_state_object_propagates_unchanged(tmp_path):
    class Boom(Exception):
        pass

    class Fails:
        def save(self, writer):
            writer.put_bytes("x", b"1")

        def load(self, reader):
            raise Boom("no way")

    class SaveFails:
        def save(self, writer):
            raise Boom("not today")

        def load(self, reader):
            pass

    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"f": Fails()})
        with pytest.raises(Boom, match="no way"):
            ckpt.restore({"f": Fails()})
        with pytest.raises(Boom, match="not today"):
            ckpt.save(1, {"f": SaveFails()})
        with pytest.raises(Boom, match="not today"):
            ckpt.save_async(1, {"f": SaveFails()})
        assert [c["step"] for c in ckpt.list()] == [0]


def test_writer_and_reader_are_invalid_outside_save_and_load(tmp_path):
    kept = {}

    class Keeps:
        def save(self, writer):
            kept["writer"] = writer
            writer.put_bytes("x", b"1")

        def load(self, reader):
            kept["reader"] = reader

    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"k": Keeps()})
        ckpt.restore({"k": Keeps()})
    with pytest.raises(RuntimeError, match="no longer valid"):
        kept["writer"].put_bytes("y", b"2")
    with pytest.raises(RuntimeError, match="no longer valid"):
        kept["reader"].keys()


def test_registry_refuses_objects_without_save_and_load_and_duplicate_names():
    reg = omni.StateRegistry()
    with pytest.raises(TypeError, match="save"):
        reg.register("x", object())
    state = JsonState()
    assert reg.register("x", state) is state
    with pytest.raises(ValueError, match="x"):
        reg.register("x", JsonState())
    with pytest.raises(ValueError, match="rng"):
        reg.register("x/rng", JsonState())  # "x" is a path prefix of it
    assert reg.names() == ["x"] and "x" in reg and reg["x"] is state and len(reg) == 1


def test_save_async_retention_and_tools(tmp_path):
    values = JsonState({"n": 0})
    with omni.CheckpointManager(
        tmp_path, keep_last=2, keep_every=10, keep_snapshot_memory=False
    ) as ckpt:
        for step in range(1, 13):
            values["n"] = step
            stats = ckpt.save_async(step, {"v": values})
            assert stats["background"] and not stats["skipped"]
        ckpt.wait_for_pending(timeout_s=30)
        assert [c["step"] for c in ckpt.list()] == [12, 11, 10]
    assert [c["step"] for c in omni.list_checkpoints(tmp_path)] == [12, 11, 10]
    scanned = omni.scan_checkpoints(tmp_path)
    assert all(s["valid"] and s["error"] is None for s in scanned)
    text = omni.describe_checkpoint(tmp_path / "step-000000000011")
    assert "v/json" in text
    with omni.CheckpointManager(tmp_path) as ckpt:
        values["n"] = -1
        assert ckpt.restore({"v": values}, step=10)["step"] == 10
        assert values["n"] == 10


def test_a_second_manager_on_the_same_directory_is_refused_until_the_first_closes(tmp_path):
    first = omni.CheckpointManager(tmp_path)
    # The writer lock is an flock: a second open in the same process is a
    # second open file description, so it is refused too.
    with pytest.raises(RuntimeError, match=str(tmp_path)):
        omni.CheckpointManager(tmp_path)
    first.close()
    assert first.closed
    with pytest.raises(RuntimeError, match="closed"):
        first.list()
    omni.CheckpointManager(tmp_path).close()


def test_sampler_cursor_is_saved_and_restored(tmp_path):
    sampler = omni.DistributedSampler(100, global_batch=10, seed=3)
    assert sampler.batches_per_epoch == 10
    assert sorted(sampler.index_at(0, i) for i in range(100)) == list(range(100))
    b = sampler.batch(0, 2) + sampler.batch(1, 2)
    assert b == [sampler.index_at(0, i) for i in range(10)]
    for _ in range(13):
        sampler.commit()
    assert sampler.cursor == (1, 30)
    expected = sampler.batch()
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(13, {"data": sampler})
        fresh = omni.DistributedSampler(100, global_batch=10, seed=3)
        ckpt.restore({"data": fresh})
        assert fresh.cursor == (1, 30) and fresh.batch() == expected
        other_seed = omni.DistributedSampler(100, global_batch=10, seed=4)
        with pytest.raises(ValueError, match="seed"):
            ckpt.restore({"data": other_seed})
        assert other_seed.cursor == (0, 0)
    with pytest.raises(ValueError):
        sampler.index_at(0, 100)
    with pytest.raises(ValueError):
        sampler.index_at(-1, 0)
    with pytest.raises(ValueError):
        sampler.batch(2, 2)
    with pytest.raises(ValueError, match="dataset_size"):
        omni.DistributedSampler(0)


def test_restore_with_an_object_the_checkpoint_lacks_raises_naming_it_and_loads_nothing(tmp_path):
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"a": JsonState({"x": 1})})
        a = JsonState({"x": 0})
        with pytest.raises(FileNotFoundError, match="extra"):
            ckpt.restore({"a": a, "extra": JsonState()})
        assert a["x"] == 0
        with pytest.raises(ValueError, match="timeout_s"):
            ckpt.wait_for_pending(timeout_s=-1.0)
        with pytest.raises(TypeError, match="mapping"):
            ckpt.save(1, [JsonState()])


def _tree(root):
    """Every entry under root: its kind, and for files their bytes and mtime."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            out[str(path)] = ("file", path.read_bytes(), st.st_mtime_ns)
        else:
            out[str(path)] = ("dir" if path.is_dir() else "other", None, st.st_mtime_ns)
    out[str(root)] = ("dir", None, root.stat().st_mtime_ns)
    return out


def test_a_read_only_manager_restores_beside_a_live_writer_and_leaves_the_directory_byte_identical(
    tmp_path,
):
    ckpt_dir = tmp_path / "ckpt"
    arrays = {"w": np.arange(8.0)}
    writer = omni.CheckpointManager(ckpt_dir, keep_last=3)
    for step in (1, 2, 3):
        arrays["w"][:] = step
        writer.save(step, {"model": ArrayState(arrays)})
    # What a crashed writer leaves, which a writable Open would remove.
    (ckpt_dir / ".tmp-step-000000000004").mkdir()
    (ckpt_dir / ".tmp-step-000000000004" / "rank-00000.safetensors").write_bytes(b"half")
    before = _tree(ckpt_dir)
    try:
        # The writer's lock is held: only a read-only manager may open.
        with pytest.raises(RuntimeError, match="in use"):
            omni.CheckpointManager(ckpt_dir)
        # keep_last=1 would delete steps 1 and 2 at a writer's next save.
        with omni.CheckpointManager(ckpt_dir, read_only=True, keep_last=1) as reader:
            assert [info["step"] for info in reader.list()] == [3, 2, 1]
            back = {"w": np.zeros(8)}
            assert reader.restore({"model": ArrayState(back)})["step"] == 3
            assert back["w"].tolist() == [3.0] * 8
            assert reader.restore({"model": ArrayState(back)}, step=1)["step"] == 1
            assert back["w"].tolist() == [1.0] * 8
            with pytest.raises(RuntimeError, match="read-only"):
                reader.save(5, {"model": ArrayState(back)})
            with pytest.raises(RuntimeError, match="read-only"):
                reader.save_async(5, {"model": ArrayState(back)})
        for step in (1, 2, 3):
            omni.verify_checkpoint(ckpt_dir / f"step-{step:012d}")
        assert _tree(ckpt_dir) == before
    finally:
        writer.close()


def test_a_read_only_manager_of_a_missing_directory_raises_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        omni.CheckpointManager(tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()
