"""The minimal loop of examples/minimal, in Python: a PyTorch training loop
with telemetry, bit-exact checkpoints, graceful preemption and elastic data
parallelism, all through omni.Runtime.

    python3 examples/python/train.py --steps 500 --ckpt-dir /tmp/ckpt
    torchrun --nproc-per-node=2 examples/python/train.py --steps 500   # rendezvous via torchrun's store
    python3 examples/python/train.py --store file:///shared/store --replica-id r0   # one replica of many

SIGTERM saves at a step boundary and exits 75 (resumable: run it again).
Options not given here come from the environment (torchrun, Slurm, OMNI_*:
see omni.runtime). Ends with ``final step=N params_xxh3=... loss=...``.
"""

import argparse
import sys
import time

import numpy as np
import torch

import omni
from omni.state import ArrayState

SAMPLES, FEATURES, BATCH = 4096, 16, 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--store", help="store URI (file:///dir, tcp://host:port); "
                                    "default: OMNI_STORE, else torchrun's MASTER_ADDR:MASTER_PORT")
    ap.add_argument("--replica-id", help="default: OMNI_REPLICA_ID, else rank-<RANK>")
    ap.add_argument("--min-replicas", type=int)
    ap.add_argument("--max-replicas", type=int)
    ap.add_argument("--ckpt-dir", help="default: OMNI_CKPT_DIR (none: no checkpoints)")
    ap.add_argument("--ckpt-every", type=int)
    ap.add_argument("--step-log")
    ap.add_argument("--peer-timeout-s", type=float,
                    help="a silent replica is dead after this (heartbeats 10x as often)")
    ap.add_argument("--step-sleep-s", type=float, default=0.0,
                    help="extra time per step (to watch it, or to signal it mid-run)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same data and initial model in every process
    x = torch.randn(SAMPLES, FEATURES)
    y = torch.sin(x.sum(1, keepdim=True))
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    # ---- the runtime: options from the launcher's environment, then ours
    options = dict(source="train", job_id="minimal", total_steps=args.steps,
                   dataset_size=SAMPLES, global_batch=BATCH)
    for key in ("store", "replica_id", "min_replicas", "max_replicas", "ckpt_dir", "ckpt_every",
                "step_log"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    if args.peer_timeout_s is not None:
        options["elastic"] = dict(peer_timeout_s=args.peer_timeout_s,
                                  heartbeat_s=args.peer_timeout_s / 10, settle_s=0.2,
                                  init_timeout_s=5, collective_timeout_s=10)
    loss = np.zeros(1, dtype=np.float32)  # the last step's loss, saved with the rest
    state = omni.TrainState(model=net, optimizer=optimizer, extra={"loss": ArrayState({"value": loss})})

    with omni.Runtime(**options) as rt:
        rt.register(state)
        first = rt.start()  # restores, joins the group
        print(f"started step={first} rank={rt.rank} size={rt.size}", flush=True)
        for _ in rt.steps(args.steps):  # SIGTERM: saved, SystemExit(75)
            with rt.phase(omni.DATA_WAIT):
                index = torch.tensor(rt.local_batch(), dtype=torch.long)  # this replica's share
                bx, by = x.index_select(0, index), y.index_select(0, index)
            with rt.phase(omni.COMPUTE):
                optimizer.zero_grad()
                # Mean over the global batch: each replica weighs its share.
                step_loss = torch.nn.functional.mse_loss(net(bx), by) * (len(index) / BATCH)
                step_loss.backward()
                local = np.array([step_loss.item()], dtype=np.float32)
            with rt.phase(omni.COMM):
                reduced = rt.allreduce_gradients(net.parameters()) and rt.allreduce(local)
            if reduced:  # otherwise the step is redone after the group recovers
                with rt.phase(omni.OPTIMIZER):
                    optimizer.step()
                    loss[0] = local[0]
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
        print(f"final step={rt.step} params_xxh3={omni.params_xxh3(net)} loss={loss[0]:.6f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
