"""One replica of a tiny elastic data-parallel job, for test_elastic.py.

    elastic_worker.py STORE_URI REPLICA_ID STEPS OUT.npz [STEP_DELAY_S]

The "model" is a float64 vector w; the step-s gradient of replica r of n is
a deterministic function of (s, r, n); the replicas average it (allreduce)
and apply w -= 0.1 * g. The loop follows the ElasticGroup contract: a failed
collective commits nothing and the step is redone after recover(). Prints one
line per event ("start ...", "change ...", "recover ...", "done ...").
"""

import sys
import time

import numpy as np

import omni
from omni.state import ArrayState, JsonState

uri, replica_id, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0.02

weights = {"w": np.zeros(8, dtype=np.float64)}
progress = JsonState({"step": 0})
state = omni.StateRegistry()
state.register("model", ArrayState(weights))
state.register("progress", progress)

store = omni.open_store(uri)
with omni.ElasticGroup(store, state, job_id="pytest-elastic", replica_id=replica_id,
                       min_replicas=1, max_replicas=3, heartbeat_s=0.05, peer_timeout_s=0.5,
                       settle_s=0.2, join_timeout_s=60, collective_timeout_s=10,
                       init_timeout_s=5) as group:
    change = group.start(progress["step"])
    print("start", change["generation"]["description"], "completed", change["completed"],
          flush=True)
    while progress["step"] < steps:
        step = progress["step"]
        change = group.at_boundary(step)
        if change is not None:
            print("change", change["generation"]["description"], flush=True)
            step = progress["step"]
        g = np.array([np.sin(step * 0.1 + i) for i in range(8)], dtype=np.float64)
        time.sleep(delay)
        try:
            group.allreduce(g, op="sum")
        except (ConnectionError, TimeoutError, RuntimeError) as e:
            change = group.recover(step)
            print("recover", type(e).__name__, change["generation"]["description"], flush=True)
            continue
        # The sum over the replicas of identical gradients, normalised by the
        # group size: the update is independent of the membership.
        weights["w"] -= 0.1 * g / group.size
        progress["step"] = step + 1
    group.finish()
    np.savez(out, w=weights["w"], step=progress["step"])
    print("done", progress["step"], flush=True)
