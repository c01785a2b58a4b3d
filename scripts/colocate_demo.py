"""make demo, co-location part: the critical omni_train job (2 elastic
replicas, its window notices on a shared-memory channel) and a best-effort
colocate_guest in its idle windows; a replica is killed and replaced, the
guest is preempted once and resumes. The code is shared with the colocation
benchmark (benchmarks/colocation_bench.py)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import colocation_bench  # noqa: E402

if __name__ == "__main__":
    sys.exit(colocation_bench.main(sys.argv[1:], mode="demo"))
