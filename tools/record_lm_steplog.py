#!/usr/bin/python3
"""Records the step log of a small PyTorch language-model trainer run by
omni.Runtime, for the forecast corpus (tests/data/lm_microbatch.jsonl; see
tests/data/README.md). Not an example to copy: the loader's costs below are
made to be seen.

    PYTHONPATH=build/python /usr/bin/python3 tools/record_lm_steplog.py \\
        --steps 1500 --ckpt-dir "$(mktemp -d)" --step-log tests/data/lm_microbatch.jsonl

What the log holds, step by step:
  - two micro-batches per optimizer step (gradient accumulation), each a
    data wait then forward and backward of a 1-layer transformer (d 64) on
    a batch of 4 sequences whose length the sampler draws (16-96 tokens:
    the work per step varies with it);
  - the loader: one worker process that "tokenizes" each sample (CPU work
    proportional to its length) and opens a new shard every 500 samples
    (300 ms, an object store's latency): a stall every ~62 steps that the
    worker's prefetch only partly hides;
  - an eval every 60 steps (not declared): 32 tokens generated greedily
    (busy), then scored on the host (idle for the training devices);
  - a checkpoint every 200 steps by omni.Runtime (declared in the log's
    header).
LibTorch on one thread; about 100 ms a step on a 2-core machine.
"""

import argparse
import random
import sys
import time

import torch

import omni

VOCAB, WIDTH = 64, 64
SHARD_SAMPLES = 500
_calls = [0]  # samples made by this (worker) process


class Text(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        g = random.Random(i)
        _calls[0] += 1
        if _calls[0] % SHARD_SAMPLES == 0:
            time.sleep(0.3)  # a new shard opened
        length = g.choice([16, 32, 32, 64, 64, 96])
        tokens = [g.randrange(VOCAB) for _ in range(length + 1)]
        spin = 0
        for _ in range(300 * length):  # tokenizing
            spin += 1
        return torch.tensor(tokens)


def pad(batch):
    out = torch.zeros(len(batch), max(len(t) for t in batch), dtype=torch.long)
    for i, t in enumerate(batch):
        out[i, :len(t)] = t
    return out


class LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 2, 128, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 1)
        self.out = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.out(self.enc(self.emb(x), mask=mask))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--step-log", required=True)
    ap.add_argument("--eval-every", type=int, default=60)
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = LM()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sampler = omni.ResumableBatchSampler(100_000, global_batch=4, seed=1)
    loader = sampler.data_loader(Text(100_000), num_workers=1, collate_fn=pad)
    with omni.Runtime(source="record_lm_steplog", job_id="lm", total_steps=a.steps,
                      ckpt_dir=a.ckpt_dir, ckpt_every=200, step_log=a.step_log) as rt:
        rt.register(omni.TrainState(model=net, optimizer=optimizer, sampler=sampler))
        rt.start()
        batches = iter(loader)
        for step in rt.steps(a.steps):
            optimizer.zero_grad()
            for _ in range(2):
                with rt.phase(omni.DATA_WAIT):
                    x = next(batches)
                with rt.phase(omni.COMPUTE):
                    logits = net(x[:, :-1])
                    torch.nn.functional.cross_entropy(
                        logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1)).backward()
            with rt.phase(omni.OPTIMIZER):
                optimizer.step()
                sampler.commit()  # both micro-batches are consumed
                sampler.commit()
            if (step + 1) % a.eval_every == 0:
                with rt.phase(omni.EVAL), torch.no_grad():
                    context = torch.zeros(1, 8, dtype=torch.long)
                    with rt.phase(omni.COMPUTE):
                        for _ in range(32):
                            nxt = net(context)[:, -1].argmax(-1, keepdim=True)
                            context = torch.cat([context, nxt], 1)
                    spin = 0
                    for _ in range(1_000_000):  # detokenizing and scoring on the host
                        spin += 1
        print(f"done step={rt.step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
