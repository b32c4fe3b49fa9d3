"""StreamingRun (what every integration writes through) against a real registry server that is
stopped mid-run: training never sees an error, one warning, the spool carries the rest, and every
point arrives exactly once."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.integrations import spool as spool_io
from registry.integrations.stream import StreamingRun
from registry.integrations.targets import LocalTarget
from test_client import Server


@pytest.fixture
def server(tmp_path):
    url = f"sqlite:///{tmp_path / 'server.db'}"
    reg = open_registry(url)
    create_user(reg, "trainer", "streaming-pass")
    token = create_token(reg, "trainer", "cluster")
    srv = Server(url, tmp_path)
    srv.start()
    yield srv, token, reg
    srv.stop()
    reg.close()


def metrics(step: int) -> dict[str, float]:
    return {"loss": 1.0 / step, "reward": step / 10.0, "grad_norm": math.nan if step == 7 else 0.5,
            "note": "text values are skipped"}


def test_remote_stream_with_server_down_mid_run_loses_and_duplicates_nothing(server, tmp_path, caplog):
    srv, token, reg = server
    run = StreamingRun("remote-run", framework="trl", params={"lr": 1e-6, "path": tmp_path}, url=srv.url,
                       token=token, flush_points=30, flush_seconds=3600, retry_limit=2, retry_seconds=0.3,
                       spool_dir=tmp_path / "spool")
    for step in range(1, 21):
        run.log(step, metrics(step))
    run.flush()
    assert not run.pending and run.spool_path is None
    srv.kill()
    with caplog.at_level(logging.WARNING, logger="registry.integrations"):
        for step in range(21, 61):
            run.log(step, metrics(step))   # the sender flushes every 10 steps into a dead server: never raises
        run.set_outcome(scores={"final_reward": 6.0})
        for _ in range(run.retry_limit):
            run.flush()                    # whatever the sender thread managed, the limit is reached now
        assert run.spool_path is not None and run.spool_path.exists()
        srv.start()
        run.finish()                       # uploads the spool now that the server is back
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(down) == 1
    assert not run.spool_path.exists()

    detail = reg.run_detail(run.id)
    assert detail["status"] == "finished" and detail["scores"] == {"final_reward": 6.0}
    assert detail["params"]["lr"] == 1e-6 and detail["params"]["path"] == str(tmp_path)
    assert {s["key"] for s in detail["series"]} == {"loss", "reward", "grad_norm"}
    loss = reg.read_series(run.id, "loss")
    assert list(loss.steps) == list(range(1, 61))
    assert np.allclose(loss.values, [1.0 / s for s in range(1, 61)])
    grad = reg.read_series(run.id, "grad_norm")
    assert int(np.isnan(grad.values).sum()) == 1


def test_spool_replay_twice_adds_nothing_and_a_cut_last_line_is_ignored(tmp_path):
    run = StreamingRun("spooled", db=f"sqlite:///{tmp_path / 'nodir' / 'x' / 'reg.db'}",
                       spool_dir=tmp_path / "spool", flush_points=10)
    for step in range(1, 31):
        run.log(step, {"loss": float(step)})
    run.finish()
    path = run.spool_path
    with open(path, "a") as handle:
        handle.write('{"kind":"batch","batch_id":"cut","poin')   # the process died mid-write
    target = LocalTarget(f"sqlite:///{tmp_path / 'reg.db'}")
    first = spool_io.replay(path, target)
    second = spool_io.replay(path, target)
    assert first["points"] == second["points"] == 30
    data = target.registry.read_series(run.id, "loss")
    assert list(data.steps) == list(range(1, 31))
    assert target.registry.run_detail(run.id)["status"] == "finished"


def test_bad_line_in_the_middle_of_a_spool_names_it(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text('{"kind":"run","target":null,"spec":{"name":"x","run_id":"abc"}}\nnot json\n'
                    '{"kind":"status","status":"finished"}\n')
    from registry.core.errors import InputError

    with pytest.raises(InputError, match=r"run.jsonl, line 2"):
        spool_io.replay(path, LocalTarget(f"sqlite:///{tmp_path / 'reg.db'}"))


def test_points_before_the_last_step_are_skipped_with_one_warning(tmp_path, caplog):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    run = StreamingRun("restart", db=db, spool_dir=tmp_path / "spool")
    with caplog.at_level(logging.WARNING, logger="registry.integrations"):
        for step in (1, 2, 3, 2, 3, 4):
            run.log(step, {"loss": float(step)})
        run.finish()
    assert sum("before step" in r.getMessage() for r in caplog.records) == 1
    with open_registry(db) as reg:
        assert list(reg.read_series(run.id, "loss").steps) == [1, 2, 3, 3, 4]


def test_the_next_run_against_the_same_registry_uploads_a_finished_spool(tmp_path):
    db_dir = tmp_path / "not-mounted-yet"
    db = f"sqlite:///{db_dir / 'reg.db'}"
    first = StreamingRun("first", db=db, spool_dir=tmp_path / "spool")
    for step in range(1, 11):
        first.log(step, {"loss": float(step)})
    first.finish()
    assert first.spool_path.exists()
    db_dir.mkdir()
    second = StreamingRun("second", db=db, spool_dir=tmp_path / "spool")
    second.log(1, {"loss": 1.0})
    second.finish()
    assert not first.spool_path.exists()
    with open_registry(db) as reg:
        assert reg.run_detail(first.id)["status"] == "finished"
        assert list(reg.read_series(first.id, "loss").steps) == list(range(1, 11))
        assert reg.list_runs()[1] == 2
