"""The README's Python snippet (telemetry, bit-exact preemption, elastic DP)
runs as written, in one replica over a file:// store."""

import os
import re
import types

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snippet():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("Telemetry, bit-exact preemption and elastic data parallelism")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_readme_snippet_trains_and_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _snippet().replace("file:///shared/job/store", f"file://{tmp_path}/store")
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
        args=types.SimpleNamespace(lr=0.1, batch=64), rid="r0", steps=12,
        collate=lambda idx: data[idx],
    )
    exec(compile(code, "README.md", "exec"), names)
    assert names["ts"].step == 12
    assert os.path.exists(tmp_path / "steps.jsonl")
