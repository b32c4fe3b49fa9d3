"""Trackers' stores go through the path every format takes: ``Registry.register`` / ``register_all``
with detection, ``rlreg register`` with a database URL (SQLite and PostgreSQL), and ``POST
/api/uploads``; one registry run per tracker run, a second import registers nothing new, and a
damaged store is an error naming the file and what was registered. The stores are written by the
real mlflow, trackio and wandb clients."""
from __future__ import annotations

import io
import json
import shutil
import sqlite3
import uuid
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import _PG_SERVER_URL
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from test_importers_history import MLFLOW_SCRIPT, TRACKIO_SCRIPT, WANDB_SCRIPT, check_mlflow_runs, run_script

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.cli.main import cli
from registry.core.errors import AlreadyRegisteredError, InputError, UnknownFormatError
from registry.importers import FORMATS, open_source
from registry.importers.detect import detect_format
from registry.store.tracker_runs import PartialImportError


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """An MLflow database (3 runs), a trackio database (2 runs) and a W&B offline run, each written by its client."""
    for package in ("mlflow", "trackio", "wandb"):
        pytest.importorskip(package)
    where = tmp_path_factory.mktemp("stores")
    run_script(MLFLOW_SCRIPT.format(uri=f"sqlite:///{where / 'mlflow.db'}"), where)
    run_script(TRACKIO_SCRIPT, where, TRACKIO_DIR=str(where / "trackio"))
    run_script(WANDB_SCRIPT, where, WANDB_MODE="offline", WANDB_DIR=str(where), WANDB_SILENT="true")
    (wandb_run,) = (where / "wandb").glob("offline-run-*")
    return {"mlflow": where / "mlflow.db", "trackio": where / "trackio" / "cartpole.db", "wandb": wandb_run}


def test_detection_names_every_store_format(stores, tmp_path):
    for fmt, path in stores.items():
        assert detect_format(path, FORMATS) == fmt
    assert detect_format(stores["wandb"].parent, FORMATS) == "wandb"     # the wandb/ folder of runs
    with pytest.raises(UnknownFormatError, match="tracker's runs"):
        open_source(stores["mlflow"])                                    # not one log: register/register_all


def test_register_and_register_all_take_each_store(stores, tmp_path):
    with open_registry(f"sqlite:///{tmp_path / 'reg.db'}") as reg:
        # One run: Registry.register, detected; the second time AlreadyRegisteredError, as for any file.
        result = reg.register(stores["wandb"], tags=["imported"])
        assert result.source_format == "wandb" and result.name == "grpo-w" and result.point_count > 0
        assert reg.run_detail(result.run_id)["tags"] == ["imported", "x"]
        with pytest.raises(AlreadyRegisteredError):
            reg.register(stores["wandb"])
        # Several runs: register says so; register_all registers each once, then nothing new.
        with pytest.raises(InputError, match="holds 3 runs"):
            reg.register(stores["mlflow"])
        first = reg.register_all(stores["mlflow"], project="team")
        assert sorted(r.name for r in first) == ["oom", "plain-ppo", "verl-grpo"] and first.skipped == []
        assert {reg.run_detail(r.run_id)["project"] for r in first} == {"team"}
        again = reg.register_all(stores["mlflow"], format="mlflow")
        assert list(again) == [] and len(again.skipped) == 3
        assert {run_id for run_id, _ in again.present} == {r.run_id for r in first}
        trackio = reg.register_all(stores["trackio"])
        assert sorted(r.name for r in trackio) == ["ppo-s0", "ppo-s1"]
        assert reg.list_runs(limit=100)[1] == 6
        # A name is for one run: a store of several refuses it rather than naming them all alike.
        with pytest.raises(InputError, match="applies to one run"):
            reg.register_all(stores["trackio"], name="x")
        replaced = reg.register(stores["wandb"], replace=True)
        assert replaced.replaced == result.run_id and reg.list_runs(limit=100)[1] == 6


def test_cli_register_with_a_sqlite_url_and_format(stores, tmp_path, monkeypatch):
    monkeypatch.chdir(stores["mlflow"].parent)
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = CliRunner().invoke(cli, ["--db", db, "register", "sqlite:///mlflow.db"])  # relative, as MLflow's URI
    assert result.exit_code == 0, result.output
    assert "3 registered, 0 skipped" in result.output
    check_mlflow_runs(db)
    with open_registry(db) as reg:
        sources = {reg.run_detail(r["id"])["source"]["path"] for r in reg.list_runs(limit=10)[0]}
    assert sources == {"mlflow.db"}
    again = CliRunner().invoke(cli, ["--db", db, "register", "--format", "mlflow", "sqlite:///mlflow.db"])
    assert again.exit_code == 0 and "0 registered, 3 skipped" in again.output
    missing = CliRunner().invoke(cli, ["--db", db, "register", "sqlite:///missing.db"])
    assert missing.exit_code == 1 and "missing.db" in missing.output
    assert not (stores["mlflow"].parent / "missing.db").exists()       # reading never creates the file
    wrong = CliRunner().invoke(cli, ["--db", db, "register", "--format", "csv", "sqlite:///mlflow.db"])
    assert wrong.exit_code == 1 and "MLflow tracking database" in wrong.output


@pytest.fixture
def mlflow_postgres(tmp_path):
    """A fresh PostgreSQL database that the real mlflow client fills through its tracking URI."""
    if _PG_SERVER_URL is None:
        pytest.skip("no PostgreSQL server (set RLREG_TEST_POSTGRES_URL)")
    pytest.importorskip("mlflow")
    name = f"mlflow_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(_PG_SERVER_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(_PG_SERVER_URL).set(database=name)
    try:
        run_script(MLFLOW_SCRIPT.format(uri=url.render_as_string(hide_password=False)), tmp_path)
        # What a user types: MLflow's own spelling of the URL, without a driver.
        yield url.set(drivername="postgresql").render_as_string(hide_password=False), url.password
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_cli_register_a_postgresql_mlflow_database(mlflow_postgres, tmp_path):
    url, password = mlflow_postgres
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = CliRunner().invoke(cli, ["--db", db, "register", url])
    assert result.exit_code == 0, result.output
    assert "3 registered, 0 skipped" in result.output
    check_mlflow_runs(db)
    with open_registry(db) as reg:
        sources = {reg.run_detail(r["id"])["source"]["path"] for r in reg.list_runs(limit=10)[0]}
    (source,) = sources
    assert source.startswith("postgresql") and ":***@" in source and f":{password}@" not in source
    again = CliRunner().invoke(cli, ["--db", db, "register", url, "--json"])
    answer = json.loads(again.output)
    assert again.exit_code == 0 and answer["registered"] == [] and len(answer["skipped"]) == 3


def test_partially_written_trackio_database_keeps_the_good_run_and_names_the_bad_one(tmp_path):
    pytest.importorskip("trackio")
    run_script(TRACKIO_SCRIPT, tmp_path, TRACKIO_DIR=str(tmp_path / "trackio"))
    store = tmp_path / "trackio" / "cartpole.db"
    with sqlite3.connect(store) as conn:   # the last row of run ppo-s1 cut mid-write
        (row_id,) = conn.execute("select max(id) from metrics where run_name = 'ppo-s1'").fetchone()
        conn.execute("update metrics set metrics = '{\"rollout/ep_rew_mean\": 9.' where id = ?", (row_id,))
    with open_registry(f"sqlite:///{tmp_path / 'reg.db'}") as reg:
        with pytest.raises(PartialImportError) as caught:
            reg.register_all(store)
        message = str(caught.value)
        assert str(store) in message and f"metrics row id {row_id}" in message and "ppo-s1" in message
        assert "registered 1 run(s), kept: 'ppo-s0'" in message
        assert [r["name"] for r in reg.list_runs(limit=10)[0]] == ["ppo-s0"]
        with pytest.raises(PartialImportError) as again:   # nothing registered twice, the bad run still reported
            reg.register_all(store)
        assert "registered nothing; 1 already present" in str(again.value)
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    result = CliRunner().invoke(cli, ["--db", db, "register", str(store)])
    assert result.exit_code == 1
    assert "1 registered, 0 skipped as already present, 1 failed" in result.output
    assert f"metrics row id {row_id}" in result.output


def test_truncated_stores_name_the_file_and_what_was_registered(stores, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    with open_registry(f"sqlite:///{tmp_path / 'reg.db'}") as reg:
        for fmt in ("mlflow", "trackio"):
            data = stores[fmt].read_bytes()
            cut = tmp_path / f"cut-{fmt}.db"
            cut.write_bytes(data[: len(data) // 3])
            before = reg.list_runs(limit=100)[1]
            with pytest.raises(InputError) as caught:
                reg.register_all(cut, format=fmt)
            message = str(caught.value)
            assert str(cut) in message and ("truncated" in message or "malformed" in message)
            registered = reg.list_runs(limit=100)[1] - before
            if isinstance(caught.value, PartialImportError):
                assert len(caught.value.registered) == registered
                assert (f"registered {registered} run(s)" if registered else "registered nothing") in message
            else:
                assert registered == 0 and "nothing was registered" in message
        pq.write_table(pa.table({"_step": list(range(1000)), "loss": [float(i) for i in range(1000)]}),
                       tmp_path / "h.parquet")
        data = (tmp_path / "h.parquet").read_bytes()
        (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2] + b"PAR1")
        with pytest.raises(InputError, match="truncated") as caught:
            reg.register(tmp_path / "cut.parquet")          # detected as W&B's export by its content
        assert str(tmp_path / "cut.parquet") in str(caught.value)


@pytest.fixture
def upload(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'server.db'}")
    create_user(reg, "uploader", "upload-password")
    token = create_token(reg, "uploader", "ci")
    from registry.web.app import create_app

    app = create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "t", "UPLOAD_DIR": str(tmp_path / "up")})
    client = app.test_client()

    def post(content: bytes, filename: str, status: int, **fields):
        response = client.post("/api/uploads", data={"file": (io.BytesIO(content), filename), **fields},
                               headers={"Authorization": f"Bearer {token}"}, content_type="multipart/form-data")
        assert response.status_code == status, response.get_data(as_text=True)[:1000]
        return response.get_json()

    yield post, reg
    reg.close()


def zipped(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for file in sorted(directory.rglob("*")):
            if file.is_file():
                zf.write(file, f"{directory.name}/{file.relative_to(directory).as_posix()}")
    return buffer.getvalue()


def test_upload_takes_tracker_stores(stores, upload, tmp_path):
    post, reg = upload
    answer = post(stores["trackio"].read_bytes(), "cartpole.db", 201)
    assert answer["file"] == "cartpole.db" and sorted(r["name"] for r in answer["runs"]) == ["ppo-s0", "ppo-s1"]
    assert {r["source_format"] for r in answer["runs"]} == {"trackio"}
    refused = post(stores["trackio"].read_bytes(), "cartpole.db", 409)
    assert "already registered" in refused["error"]
    run = post(zipped(stores["wandb"]), "run.zip", 201)          # a zipped W&B offline run directory
    assert run["name"] == "grpo-w" and run["source_format"] == "wandb"
    mlflow = post(stores["mlflow"].read_bytes(), "mlflow.db", 201, project="imported")
    assert len(mlflow["runs"]) == 3 and {r["name"] for r in mlflow["runs"]} == {"verl-grpo", "plain-ppo", "oom"}
    assert reg.list_runs(limit=100)[1] == 6
    # A damaged store registers nothing and the error names the file the client sent.
    damaged = tmp_path / "damaged.db"
    shutil.copy(stores["trackio"], damaged)
    with sqlite3.connect(damaged) as conn:
        conn.execute("pragma journal_mode=delete")    # the changes in the file itself, not in a -wal beside it
        conn.execute("update metrics set metrics = '{' where id = (select max(id) from metrics)")
        conn.execute("update metrics set run_id = run_id || '-copy'")     # new run ids: nothing already present
        conn.execute("update configs set run_id = run_id || '-copy'")
    error = post(damaged.read_bytes(), "damaged.db", 400)["error"]
    assert error.startswith("damaged.db") and "nothing was registered" in error and "not JSON" in error
    assert reg.list_runs(limit=100)[1] == 6
