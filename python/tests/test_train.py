"""omni.TrainState and omni.ResumableBatchSampler with torch: an LSTM loop
with an LR scheduler, a hidden state carried between batches, dropout (the
torch RNG) and a DataLoader with prefetching workers resumes bit-exactly."""

import random

import numpy as np
import pytest

import omni

torch = pytest.importorskip("torch")

STEPS = 12


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 20, (6,), generator=g)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.lstm = torch.nn.LSTM(8, 8, batch_first=True)
        self.drop = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(8, 20)

    def forward(self, x, hidden):
        y, hidden = self.lstm(self.emb(x), hidden)
        return self.out(self.drop(y)), hidden


def build(workers=2):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    sampler = omni.ResumableBatchSampler(64, global_batch=4, seed=7)
    loader = sampler.data_loader(Tokens(), num_workers=workers)
    ts = omni.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                         carry={"hidden": None})
    return model, opt, sched, sampler, loader, ts


def run(ts, model, opt, sched, sampler, loader, until, seen):
    for batch in loader:
        if ts.step >= until:
            break
        hidden = ts.carry["hidden"]
        logits, hidden = model(batch, hidden)
        noise = random.random() + float(np.random.rand())  # the other RNGs matter too
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 20), batch.reshape(-1))
        opt.zero_grad()
        (loss * (1 + 1e-3 * noise)).backward()
        opt.step()
        sched.step()
        ts.carry["hidden"] = tuple(h.detach() for h in hidden)
        sampler.commit()
        ts.step += 1
        seen.append(batch.clone())


def test_train_state_resumes_an_lstm_loop_with_prefetching_workers_bit_exactly(tmp_path):
    model, opt, sched, sampler, loader, ts = build()
    seen_ref = []
    run(ts, model, opt, sched, sampler, loader, STEPS, seen_ref)
    ref = {k: v.clone() for k, v in model.state_dict().items()}

    model, opt, sched, sampler, loader, ts = build()
    seen = []
    with omni.CheckpointManager(tmp_path) as ckpt:
        assert ts.restore(ckpt) is None
        run(ts, model, opt, sched, sampler, loader, 5, seen)  # workers prefetched beyond 5
        ts.save(ckpt)
    model, opt, sched, sampler, loader, ts = build()
    with omni.CheckpointManager(tmp_path) as ckpt:
        assert ts.restore(ckpt)["step"] == 5
    assert ts.step == 5 and sampler.cursor == (0, 20)
    assert ts.carry["hidden"] is not None and len(ts.carry["hidden"]) == 2
    run(ts, model, opt, sched, sampler, loader, STEPS, seen)

    assert len(seen) == len(seen_ref) == STEPS
    for a, b in zip(seen, seen_ref):
        assert torch.equal(a, b)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert sched.get_last_lr() == pytest.approx([0.5 * 0.5 ** (STEPS // 3)])


def test_train_state_names_its_keys_and_splits_replicated_state():
    _, _, _, _, _, ts = build(workers=0)
    assert ts.keys() == ["model", "optim", "sched", "data", "progress", "carry", "rng/python",
                         "rng/numpy", "rng/torch"]
    assert ts.replicated().names() == ["model", "optim", "sched", "data", "progress"]
    assert ts.per_replica().names() == ["carry", "rng/python", "rng/numpy", "rng/torch"]


def test_the_sampler_serves_each_sample_once_per_epoch_across_replicas():
    sampler = omni.ResumableBatchSampler(10, global_batch=4, seed=1, drop_last=False,
                                         num_replicas=2)
    other = omni.ResumableBatchSampler(10, global_batch=4, seed=1, drop_last=False,
                                       replica=1, num_replicas=2)
    got = [i for b in sampler for i in b] + [i for b in other for i in b]
    assert sorted(got) == list(range(10))
    assert len(sampler) == 3
