"""Per-cell overhead of ``--executor ray`` against local execution: the same ``parity check`` of the same models,
side by side in one run, each repeated; prints the medians, seconds per cell and their ratio. Then the choice the
executor made, measured: the same cells as Ray tasks (what ``--executor ray`` does) against one Ray actor per
framework group that runs its group's cells one after another, in one Ray session.

    python scripts/ray_overhead.py [--model mlp ...] [--repeats 2]

The Ray run starts a Ray of this machine's own (its start-up is counted); the export cache is warm for both
(a first, untimed local run fills it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _check(models: list[str], executor: str, out: Path) -> tuple[float, int]:
    args = [
        sys.executable,
        "-m",
        "parity",
        "check",
        "--workspace",
        str(REPO),
        "--no-store",
        "--json",
        str(out),
        "--executor",
        executor,
    ]
    for model in models:
        args += ["--model", model]
    started = time.perf_counter()
    subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    cells = sum(1 for r in json.loads(out.read_text())["results"] if r["verdict"] != "skip")
    return seconds, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    models = args.model or ["mlp"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        _check(models, "local", out)  # fills the export cache
        times = {"local": [], "ray": []}
        cells = 0
        for _ in range(args.repeats):
            for executor in ("local", "ray"):  # alternated, so a drift of the machine falls on both
                seconds, cells = _check(models, executor, out)
                times[executor].append(seconds)
    local, ray = statistics.median(times["local"]), statistics.median(times["ray"])
    print(f"models {', '.join(models)}: {cells} cells, {args.repeats} runs each, medians")
    print(f"local {local:7.1f} s  ({local / cells:5.2f} s per cell)")
    print(f"ray   {ray:7.1f} s  ({ray / cells:5.2f} s per cell)")
    print(f"ray/local {ray / local:.2f}; overhead per cell {(ray - local) / cells:+.2f} s")
    tasks, actors = _tasks_and_actors(models, args.repeats)
    print(
        f"in one Ray session: tasks {tasks:.1f} s, actors per group {actors:.1f} s, actors/tasks {actors / tasks:.2f}"
    )


def _tasks_and_actors(models: list[str], repeats: int) -> tuple[float, float]:
    """Medians of the same cells run one at a time as tasks and as calls of one actor per framework group (the
    first round of each warms its processes; alternated after that)."""
    import ray

    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate, ray_executor
    from parity.pipeline.bundle import pack
    from parity.run import stacks

    ray.init(logging_level="ERROR", log_to_driver=False, include_dashboard=False, resources=stacks.advertised())
    try:
        ws = Workspace(REPO)
        options = orchestrate.Options(threads=1, diagnose=None)
        plan = orchestrate.Run(ws, options)._plan(models)
        bundle = ray.put(pack(ws.root, models))
        task = ray.remote(ray_executor.run_cell)

        @ray.remote
        class Group:
            def run(self, model, path_id):
                return ray_executor.run_cell(ray.get(bundle), model, path_id, options)

        # actors hold no CPU (five of them would not fit two cores): both ways run one cell at a time
        actors = {g: Group.options(num_cpus=0).remote() for g in {path.runtime.group for _, _, path in plan}}

        def as_tasks():
            for spec, _, path in plan:
                ray.get(task.options(num_cpus=1).remote(bundle, spec.name, path.id, options))

        def as_actors():
            for spec, _, path in plan:
                ray.get(actors[path.runtime.group].run.remote(spec.name, path.id))

        as_tasks(), as_actors()  # warm both
        times = {"tasks": [], "actors": []}
        for _ in range(repeats):
            for name, fn in (("tasks", as_tasks), ("actors", as_actors)):
                started = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - started)
        return statistics.median(times["tasks"]), statistics.median(times["actors"])
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
