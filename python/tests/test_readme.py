"""The README's Python snippet (telemetry, bit-exact preemption, elastic DP)
runs as written, in one replica over a file:// store."""

import os
import re
import types

import pytest

import omni

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snippet():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("Telemetry, bit-exact preemption and elastic data parallelism")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def _run(code, steps):
    """Executes the snippet on a fresh model (seed 0); returns its namespace."""
    torch.manual_seed(0)

    class LossModel(torch.nn.Module):  # model(batch) is the loss in the snippet
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, batch):
            return (self.lin(batch) - 1).pow(2).mean()

    model = LossModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(256, 4)
    names = dict(
        dataset=data, model=model, opt=opt,
        sched=torch.optim.lr_scheduler.StepLR(opt, step_size=5),
        rid="r0", steps=steps, collate=lambda idx: data[idx],
    )
    exec(compile(code, "README.md", "exec"), names)
    return names


def test_the_readme_snippet_trains_and_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _snippet().replace("file:///shared/job/store", f"file://{tmp_path}/store")
    code = code.replace("ckpt_every=100", "ckpt_every=5")
    first = _run(code, 12)
    assert first["ts"].step == 12 and first["rt"].closed
    assert os.path.exists(tmp_path / "steps.jsonl")
    assert os.path.isdir(tmp_path / "ckpt" / "r0" / "step-000000000010")
    # A finished job's store refuses new replicas: the longer run is a new job
    # (store) that resumes from the checkpoint of step 10 (steps 10..14).
    resumed = _run(code.replace(f"file://{tmp_path}/store", f"file://{tmp_path}/store1"), 15)
    assert resumed["ts"].step == 15
    monkeypatch.chdir(tmp_path / "ckpt")  # a fresh checkpoint directory
    straight = _run(code.replace(f"file://{tmp_path}/store", f"file://{tmp_path}/store2"), 15)
    assert omni.params_xxh3(resumed["model"]) == omni.params_xxh3(straight["model"])
