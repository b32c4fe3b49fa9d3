"""Several processes streaming runs into one registry at once: every point arrives exactly once."""
from __future__ import annotations

import multiprocessing as mp

from registry import open_registry

WRITERS, RUNS_EACH, STEPS = 8, 2, 300


def _writer(url: str, worker: int) -> None:
    reg = open_registry(url)
    for r in range(RUNS_EACH):
        run = reg.create_run(f"w{worker}-r{r}", project="load", framework="verl")
        run.flush_points = 50  # many small transactions, interleaved with the other writers
        for step in range(1, STEPS + 1):
            run.log(step, {"critic/score/mean": step * 0.001, "actor/ppo_kl": 1e-3, "actor/entropy": 1.0})
        run.finish()
    reg.close()


def test_eight_processes_lose_nothing(db_url: str):
    open_registry(db_url).close()  # create the schema once, before the writers race
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(db_url, w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    reg = open_registry(db_url)
    rows, total = reg.list_runs(limit=None)
    assert total == WRITERS * RUNS_EACH
    for row in rows:
        assert row["status"] == "finished"
        series = reg.run_detail(row["id"])["series"]
        assert sorted(s["count"] for s in series) == [STEPS] * 3
        assert reg.read_series(row["id"], "critic/score/mean").steps.tolist() == list(range(1, STEPS + 1))
    reg.close()
