"""torch state objects (skipped when torch does not import)."""

import numpy as np
import omni
import pytest
from omni.state import TorchModuleState, TorchOptimizerState, TorchRngState

torch = pytest.importorskip("torch")


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    reg = omni.StateRegistry()
    reg.register("model", TorchModuleState(model))
    reg.register("optim", TorchOptimizerState(opt))
    reg.register("rng/torch", TorchRngState())
    return model, opt, reg


def train(model, opt, n):
    for _ in range(n):
        x = torch.randn(8, 6)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_module_state_dict_round_trip_is_bit_exact(tmp_path):
    model, _, _ = make(0)
    model[1].running_mean += 3  # a buffer
    other, _, _ = make(1)
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"model": TorchModuleState(model)})
        ckpt.restore({"model": TorchModuleState(other)})
    a, b = model.state_dict(), other.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype
        assert a[key].numpy().tobytes() == b[key].numpy().tobytes(), key


def test_a_module_of_other_shapes_is_refused_untouched(tmp_path):
    model, _, _ = make(0)
    other = torch.nn.Sequential(torch.nn.Linear(6, 4))
    before = other[0].weight.detach().clone()
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"model": TorchModuleState(torch.nn.Sequential(torch.nn.Linear(6, 5)))})
        with pytest.raises(ValueError, match="0.weight"):
            ckpt.restore({"model": TorchModuleState(other)})
    assert torch.equal(other[0].weight, before)


def test_training_with_adam_resumes_bit_identically(tmp_path):
    model, opt, _ = make(0)
    train(model, opt, 10)
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    model, opt, reg = make(0)
    train(model, opt, 4)
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(3, reg)
        model2, opt2, reg2 = make(123)
        assert ckpt.restore(reg2)["step"] == 3
    train(model2, opt2, 6)
    for key, value in reference.items():
        assert model2.state_dict()[key].numpy().tobytes() == value.numpy().tobytes(), key


def test_torch_rng_state_is_restored(tmp_path):
    torch.manual_seed(5)
    with omni.CheckpointManager(tmp_path) as ckpt:
        ckpt.save(0, {"rng": TorchRngState()})
        expected = torch.rand(4)
        torch.manual_seed(6)
        ckpt.restore({"rng": TorchRngState()})
    assert np.array_equal(torch.rand(4).numpy(), expected.numpy())
