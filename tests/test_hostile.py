"""No 500 and no traceback: generated hostile inputs against the HTTP API and the CLI get a 4xx with a
message (or exit 1 with one line), and a refused input leaves the database exactly as it was."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.cli.main import cli
from registry.core.errors import RegistryError
from registry.core.limits import Limits
from registry.web.app import create_app
from test_security import _snapshot

REPO = Path(__file__).resolve().parents[1]

hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=20),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "not " * 60 + "name=x", "(" * 300, "' OR 1=1 --", "%", "\\",
                     "x" * 5000, "1e400", "-0", "NaN", "../../etc/passwd", "<script>", "\u202e"]),
)
huge_numbers = st.one_of(st.integers(min_value=-(10**500), max_value=10**500),
                         st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1]),
                         st.floats(allow_nan=False, allow_infinity=False))


json_values = st.recursive(st.one_of(st.none(), st.booleans(), huge_numbers, hostile_text),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(hostile_text, inner, max_size=3)),
                           max_leaves=12)
bodies = st.one_of(
    st.fixed_dictionaries({"name": hostile_text}, optional={"params": json_values, "tags": json_values,
                                                             "project": json_values, "run_id": hostile_text}),
    json_values,
).map(lambda body: json.dumps(body, ensure_ascii=True))  # lone surrogates travel as \ud800 escapes
# Nesting far past any limit, as text (a structure that deep cannot even be printed by the test runner).
deep_bodies = st.integers(min_value=30, max_value=5000).map(
    lambda d: '{"name": "deep", "params": {"p": ' + "[" * d + "0" + "]" * d + "}}")


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    reg = open_registry(f"sqlite:///{tmp / 'hostile.db'}", limits=Limits(max_json_depth=16))
    run_id = reg.register_arrays("target", {"loss": ([1, 2], [1.0, 0.5])}, tags=["t"]).run_id
    create_user(reg, "alice", "alice-password")
    token = create_token(reg, "alice", "ci", scope="admin")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "hostile", "UPLOAD_DIR": str(tmp / "up"),
                      "LIMITS": Limits(max_json_depth=16)})
    yield app, reg, run_id, {"Authorization": f"Bearer {token}"}
    reg.close()


def _resolves(reg, ref: str) -> bool:
    try:
        reg.run_detail(ref)
    except RegistryError:  # not found, ambiguous or not a valid name: the CLI must refuse it
        return False
    return True


def _check(response) -> None:
    assert response.status_code < 500, (response.status_code, response.get_data(as_text=True)[:300])
    if response.status_code >= 400 and response.mimetype == "application/json":
        assert response.get_json()["error"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.one_of(bodies, deep_bodies))
def test_create_run_with_hostile_bodies(hostile_site, raw):
    app, reg, run_id, auth = hostile_site
    before = _snapshot(reg)
    response = app.test_client().post("/api/runs", data=raw, headers={**auth, "Content-Type": "application/json"})
    _check(response)
    if response.status_code >= 400:
        assert _snapshot(reg) == before


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(key=hostile_text, steps=st.lists(huge_numbers, max_size=4), values=st.lists(json_values, max_size=4),
       semantics=st.one_of(st.none(), json_values), outcome=json_values)
def test_metrics_and_outcomes_with_hostile_values(hostile_site, key, steps, values, semantics, outcome):
    app, reg, run_id, auth = hostile_site
    client = app.test_client()
    before = _snapshot(reg)
    body = {"batch_id": "hostile", "points": {key: {"steps": steps, "values": values}}}
    if semantics is not None:
        body["semantics"] = semantics
    response = client.post(f"/api/runs/{run_id}/metrics", data=json.dumps(body), headers={
        **auth, "Content-Type": "application/json"})
    _check(response)
    if response.status_code >= 400:
        assert _snapshot(reg) == before
    before = _snapshot(reg)
    response = client.post(f"/api/runs/{run_id}/outcome", data=json.dumps(
        {"checkpoints": outcome} if isinstance(outcome, list) else {"scores": outcome}),
        headers={**auth, "Content-Type": "application/json"})
    _check(response)
    if response.status_code >= 400:
        assert _snapshot(reg) == before


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(q=hostile_text, page=st.one_of(hostile_text, huge_numbers.map(str)), order=hostile_text, ref=hostile_text)
def test_reads_with_hostile_queries(hostile_site, q, page, order, ref):
    app, reg, run_id, auth = hostile_site
    client = app.test_client()
    from urllib.parse import quote

    def raw_query(args: dict[str, str]) -> str:  # bytes as an attacker sends them, lone surrogates included
        return "&".join(f"{k}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for k, v in args.items())

    for url, args in (("/runs", {"q": q, "page": page, "sort": order}), ("/api/runs", {"q": q, "order": order,
                                                                                       "offset": page}),
                      ("/compare", {"run": ref}), ("/api/definitions", {"layer": q})):
        _check(client.get(url + "?" + raw_query(args)))
    safe_ref = quote(ref.encode("utf-8", "surrogatepass"), safe="")
    for url in (f"/runs/{safe_ref}", f"/api/runs/{safe_ref}", f"/api/runs/{safe_ref}/series?key=loss",
                f"/api/runs/{run_id}/series?key={safe_ref}", f"/dictionary/{safe_ref}"):
        _check(client.get(url))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(where=hostile_text, ref=hostile_text, tag=hostile_text)
def test_cli_with_hostile_arguments(hostile_site, where, ref, tag):
    app, reg, run_id, auth = hostile_site
    db = str(reg.engine.url)
    runner = CliRunner()
    before = _snapshot(reg)
    # Earlier examples may have created a run with this very name (hostile names are accepted when valid):
    # then `outcome` legitimately changes it.
    names_a_run = _resolves(reg, ref)
    for args in (["runs", "--where", where], ["show", ref], ["outcome", ref, "--verdict", "failed"],
                 ["diagnose", ref], ["runs", "--json", "--where", f"tag={tag!r}"]):
        result = runner.invoke(cli, ["--db", db, *args])
        assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output[-500:])
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
        if result.exit_code:
            assert "error" in result.output.lower() or "usage" in result.output.lower()
    assert _snapshot(reg) == before or names_a_run


# --- the machine failing: one line, exit 1 ---------------------------------------------------------


def test_read_only_database_and_missing_export_directory(tmp_path):
    path = tmp_path / "ro.db"
    open_registry(f"sqlite:///{path}").register_arrays("r", {"loss": ([1], [1.0])})
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    runner = CliRunner()
    result = runner.invoke(cli, ["--db", url, "outcome", "r", "--verdict", "failed"])
    assert result.exit_code == 1 and "read-only" in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    result = runner.invoke(cli, ["--db", f"sqlite:///{path}", "export", str(tmp_path / "missing" / "e.gz")])
    assert result.exit_code == 1 and "does not exist" in result.output


def _fill_disk_limited(db: Path, csv: Path) -> subprocess.CompletedProcess:
    def limit() -> None:  # a file-size limit stands in for a full disk: writes past it fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        size = db.stat().st_size + 64 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return subprocess.run([sys.executable, "-m", "registry.cli", "--db", f"sqlite:///{db}", "register", str(csv)],
                          preexec_fn=limit, capture_output=True, text=True, cwd=db.parent, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_a_full_disk_is_one_line_and_changes_nothing(tmp_path):
    db = tmp_path / "full.db"
    reg = open_registry(f"sqlite:///{db}")
    reg.register_arrays("kept", {"loss": ([1], [1.0])})
    before = _snapshot(reg)
    csv = tmp_path / "big.csv"
    csv.write_text("step," + ",".join(f"m{i}" for i in range(40)) + "\n" +
                   "".join(f"{s}," + ",".join(f"{s * 0.001 + i}" for i in range(40)) + "\n" for s in range(1, 3001)))
    result = _fill_disk_limited(db, csv)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and result.stderr.count("\n") <= 2, result.stderr
    assert "full disk" in result.stderr or "disk is full" in result.stderr, result.stderr
    assert _snapshot(reg) == before
    reg.close()


def test_absurdly_nested_files_are_refused_in_one_line(tmp_path):
    db = f"sqlite:///{tmp_path / 'n.db'}"
    reg = open_registry(db)
    before = _snapshot(reg)
    deep = tmp_path / "trainer_state.json"
    deep.write_text('{"log_history": ' + "[" * 100000 + "1" + "]" * 100000 + "}")
    result = CliRunner().invoke(cli, ["--db", db, "register", str(deep)])
    assert result.exit_code == 1 and "nested too deeply" in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert _snapshot(reg) == before
    reg.close()
