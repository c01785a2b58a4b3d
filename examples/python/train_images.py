"""A PyTorch image classifier fed by a DataLoader with worker processes,
evaluated every N steps and checkpointed by omni.Runtime: the shape most
training loops have, with each phase marked so that the runtime's forecasts
know where the devices wait (the loader, the eval's host-side scoring).

    python3 examples/python/train_images.py --steps 600 --ckpt-dir /tmp/img --step-log steps.jsonl
    omni eval steps.jsonl          # how well the forecasts held on this run

SIGTERM saves at a step boundary and exits 75; run it again with the same
--ckpt-dir and it resumes where it stopped, on the same batches
(omni.ResumableBatchSampler: the batches the loader's workers had prefetched
but the loop had not consumed are served again). Ends with
``final step=N params_xxh3=... accuracy=...``.
"""

import argparse
import sys

import torch

import omni

IMAGE, CLASSES = 32, 10


class Shapes(torch.utils.data.Dataset):
    """Synthetic images made on the fly (the loader's CPU work): a class's
    pattern, shifted, blurred and with noise."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        label = int(torch.randint(0, CLASSES, (1,), generator=g))
        freq = 1.0 + label
        xs = torch.linspace(0, 3.14159, IMAGE + 8)
        pattern = torch.sin(freq * xs)[:, None] * torch.cos((CLASSES - label) * xs)[None, :]
        img = pattern[None].repeat(3, 1, 1) + 0.5 * torch.randn(3, IMAGE + 8, IMAGE + 8, generator=g)
        blur = torch.ones(3, 1, 3, 3) / 9
        img = torch.nn.functional.conv2d(img[None], blur, padding=1, groups=3)[0]
        dx, dy = (int(v) for v in torch.randint(0, 9, (2,), generator=g))
        return img[:, dy:dy + IMAGE, dx:dx + IMAGE].contiguous(), label


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--ckpt-every-s", type=float, default=0,
                    help="checkpoint by wall time instead (seconds; 0: by steps)")
    ap.add_argument("--step-log")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * (IMAGE // 4) ** 2, CLASSES))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    train_set, val_set = Shapes(args.samples, seed=1), Shapes(256, seed=2)
    val = torch.utils.data.DataLoader(val_set, batch_size=64)
    # The batch order is a function of (seed, epoch); the cursor moves on
    # commit() only, and is saved with the rest.
    sampler = omni.ResumableBatchSampler(len(train_set), global_batch=args.batch, seed=1)
    loader = sampler.data_loader(train_set, num_workers=args.workers)

    options = dict(source="train_images", job_id="train_images", total_steps=args.steps,
                   ckpt_dir=args.ckpt_dir)
    if args.ckpt_every_s > 0:
        options["ckpt_every_s"] = args.ckpt_every_s
    else:
        options["ckpt_every"] = args.ckpt_every
    if args.step_log:
        options["step_log"] = args.step_log
    accuracy = 0.0
    with omni.Runtime(**options) as rt:
        rt.register(omni.TrainState(model=net, optimizer=optimizer, sampler=sampler))
        rt.start()  # restores the model, the optimizer, the sampler's cursor and the step
        batches = iter(loader)
        for step in rt.steps(args.steps):  # SIGTERM: saved, SystemExit(75)
            with rt.phase(omni.DATA_WAIT):
                try:
                    x, y = next(batches)
                except StopIteration:  # an epoch ends: new workers for the next
                    batches = iter(loader)
                    x, y = next(batches)
            with rt.phase(omni.COMPUTE):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
            with rt.phase(omni.OPTIMIZER):
                optimizer.step()
                sampler.commit()  # this batch is consumed
            if (step + 1) % args.eval_every == 0:
                with rt.phase(omni.EVAL), torch.no_grad():
                    right = sum(int((net(vx).argmax(1) == vy).sum()) for vx, vy in val)
                    accuracy = right / len(val_set)
        print(f"final step={rt.step} params_xxh3={omni.params_xxh3(net)} accuracy={accuracy:.4f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
