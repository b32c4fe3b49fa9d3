"""Token scopes on every endpoint, disabling users, and server-side sessions (cookie flags, lifetime, revocation)."""
from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from click.testing import CliRunner

from registry import open_registry
from registry.store.auth import create_token, create_user, list_tokens, set_password, set_user_disabled
from registry.cli.main import cli
from registry.db.models import UserSession
from registry.web.app import create_app
from test_security import _snapshot, csrf_from, login
from test_web_support import fill_registry

SAFE = {"GET", "HEAD", "OPTIONS"}
# Every endpoint that changes data, the scope it needs, and a request that succeeds with that scope.
GUARDED = {
    "write_api.create_run": ("write", "post", "/api/runs", {"json": {"name": "scoped"}}),
    "write_api.append_metrics": ("write", "post", "/api/runs/{run}/metrics",
                                 {"json": {"batch_id": "b1", "points": {"loss": {"steps": [10**6], "values": [1]}}}}),
    "write_api.set_outcome": ("write", "post", "/api/runs/{run}/outcome", {"json": {"verdict": "failed"}}),
    "write_api.set_status": ("write", "post", "/api/runs/{run}/status", {"json": {"status": "crashed"}}),
    "write_api.upload": ("write", "post", "/api/uploads", {"upload": True}),
    "write_api.delete_run": ("admin", "delete", "/api/runs/{victim}", {}),
    "write_api.edit_definition": ("admin", "patch", "/api/definitions/entropy",
                                  {"json": {"changes": {"unit": "bits"}, "note": "scope test"}}),
    "dictionary.edit": ("admin", "get", "/dictionary/entropy/edit", {}),
    # An HTML form: an empty post gets past the guard and is refused by the form (400), not 401/403.
    "baselines.baseline_build": ("admin", "post", "/baselines/CartPole-v1/build", {"form_refuses": True}),
    "baselines.baseline_edit": ("admin", "get", "/baselines/CartPole-v1/metrics/{metric}/edit", {}),
    "edit.edit": ("write", "get", "/runs/{run}/edit", {}),
    "edit.delete": ("admin", "get", "/runs/{victim}/delete", {}),
    "edit.upload": ("write", "get", "/upload", {}),
}
UNGUARDED_POSTS = {"auth.login", "auth.logout"}  # CSRF-protected forms that change no data


@pytest.fixture
def scoped(db_url, tmp_path):
    reg = open_registry(db_url)
    ids = fill_registry(reg, n=20)
    ids["victim"] = reg.register_arrays("victim", {"loss": ([1, 2], [1.0, 0.5])}).run_id
    from registry.analysis.baselines import build_task_baseline

    ids["run"] = ids["sb3-s0"]
    ids["metric"] = next(iter(build_task_baseline(reg, "CartPole-v1", allow_weak=True).metrics))
    create_user(reg, "alice", "alice-password")
    tokens = {scope: create_token(reg, "alice", f"{scope}-token", scope=scope) for scope in ("read", "write", "admin")}
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "scope-test", "UPLOAD_DIR": str(tmp_path / "up")})
    yield app, reg, ids, tokens
    reg.close()


def _send(client, token: str, method: str, url: str, spec: dict, ids: dict[str, str]):
    url = url.format(**ids)
    headers = {"Authorization": f"Bearer {token}"}
    if spec.get("upload"):
        data = {"file": (io.BytesIO(f"step,loss_{token[-6:]}\n1,0.5\n2,0.25\n".encode()), "scoped.csv"), "name": f"upload-{token[-6:]}"}
        return client.post(url, data=data, headers=headers, content_type="multipart/form-data")
    return getattr(client, method)(url, json=spec.get("json"), headers=headers)


def test_every_data_changing_endpoint_has_a_scope(scoped):
    app, *_ = scoped
    for rule in app.url_map.iter_rules():
        view = app.view_functions[rule.endpoint]
        scope = getattr(view, "required_scope", None)
        if rule.methods - SAFE and rule.endpoint not in UNGUARDED_POSTS:
            assert rule.endpoint in GUARDED, f"{rule.rule} ({rule.endpoint}) changes data but has no test here"
        if rule.endpoint in GUARDED:
            assert scope == GUARDED[rule.endpoint][0], rule.endpoint
        elif rule.endpoint not in UNGUARDED_POSTS:
            assert scope is None and not (rule.methods - SAFE), rule.endpoint


@pytest.mark.parametrize("endpoint", sorted(GUARDED))
def test_scope_is_enforced_per_endpoint(scoped, endpoint):
    app, reg, ids, tokens = scoped
    needed, method, url, spec = GUARDED[endpoint]
    client = app.test_client()
    weaker = [s for s in ("read", "write") if s != needed and ("read", "write", "admin").index(s)
              < ("read", "write", "admin").index(needed)]
    before = _snapshot(reg)
    for scope in weaker:
        refused = _send(client, tokens[scope], method, url, spec, ids)
        assert refused.status_code == 403, (endpoint, scope, refused.status_code)
        if url.startswith("/api/"):
            message = refused.get_json()["error"]
            assert f"scope '{scope}'" in message and f"needs '{needed}'" in message
    assert _snapshot(reg) == before
    for scope in ("read", "write", "admin")[("read", "write", "admin").index(needed):]:
        answer = _send(client, tokens[scope], method, url, spec, ids)
        ok = answer.status_code == 400 if spec.get("form_refuses") else answer.status_code < 400
        assert ok, (endpoint, scope, answer.status_code, answer.get_data(as_text=True)[:300])
        if method == "delete":
            break  # the run is gone now
    if method != "get" and not spec.get("form_refuses"):
        assert _snapshot(reg) != before


def test_a_read_token_reads_everything_when_reads_need_a_login(db_url):
    reg = open_registry(db_url)
    ids = fill_registry(reg, n=10)
    create_user(reg, "carol", "carol-password")
    reader = create_token(reg, "carol", "dashboard", scope="read")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "s", "REQUIRE_LOGIN_FOR_READS": True})
    client = app.test_client()
    auth = {"Authorization": f"Bearer {reader}"}
    run = ids["sb3-s0"]
    for url in ("/runs", f"/runs/{run}", "/compare?run=" + run, "/dictionary/", "/dictionary/entropy", "/baselines",
                "/api/runs", f"/api/runs/{run}", f"/api/runs/{run}/series?key=train/approx_kl", "/api/definitions",
                f"/api/runs/{run}/diagnosis", f"/plots/run/{run}/data.json?key=train/approx_kl", "/api/baselines"):
        assert client.get(url).status_code in (302, 401), url
        assert client.get(url, headers=auth).status_code == 200, url
    assert client.post("/api/runs", json={"name": "no"}, headers=auth).status_code == 403
    reg.close()


def test_token_scopes_in_the_cli_and_disabling_users(sqlite_url):
    runner = CliRunner()
    db = ["--db", sqlite_url]
    assert runner.invoke(cli, [*db, "user", "create", "dana", "--password", "s3cret-pass"]).exit_code == 0
    made = runner.invoke(cli, [*db, "token", "create", "--user", "dana", "--name", "grafana", "--scope", "read"])
    assert made.exit_code == 0, made.output
    secret = made.output.splitlines()[0]
    assert runner.invoke(cli, [*db, "token", "create", "--user", "dana", "--name", "ci"]).exit_code == 0
    bad = runner.invoke(cli, [*db, "token", "create", "--user", "dana", "--name", "x", "--scope", "root"])
    assert bad.exit_code == 2 and "root" in bad.output
    table = runner.invoke(cli, [*db, "token", "list"]).output
    assert re.search(r"grafana\s+│\s+read", table) and re.search(r"ci\s+│\s+write", table), table
    reg = open_registry(sqlite_url)
    assert {t["name"]: t["scope"] for t in list_tokens(reg)} == {"ci": "write", "grafana": "read"}
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "s", "REQUIRE_LOGIN_FOR_READS": True})
    client = app.test_client()
    auth = {"Authorization": f"Bearer {secret}"}
    assert client.get("/api/runs", headers=auth).status_code == 200
    assert runner.invoke(cli, [*db, "user", "disable", "dana"]).exit_code == 0
    refused = client.get("/api/runs", headers=auth)
    assert refused.status_code == 401 and "disabled" in refused.get_json()["error"]
    listing = runner.invoke(cli, [*db, "user", "list", "--json"]).output
    assert '"disabled": true' in listing
    assert runner.invoke(cli, [*db, "user", "enable", "dana"]).exit_code == 0
    assert client.get("/api/runs", headers=auth).status_code == 200
    missing = runner.invoke(cli, [*db, "user", "disable", "nobody"])
    assert missing.exit_code == 1 and "no user 'nobody'" in missing.output
    reg.close()


# --- sessions ------------------------------------------------------------------------------------------


def _cookie_attributes(response) -> dict[str, str | bool]:
    header = next(v for k, v in response.headers.items() if k == "Set-Cookie" and v.startswith("session="))
    parts = [p.strip() for p in header.split(";")]
    return {p.split("=", 1)[0].lower(): (p.split("=", 1)[1] if "=" in p else True) for p in parts[1:]}


@pytest.mark.parametrize("secure,hours", [("1", "2"), ("0", None)])
def test_cookie_settings_from_the_environment_take_effect(sqlite_url, monkeypatch, secure, hours):
    from email.utils import parsedate_to_datetime

    monkeypatch.setenv("RLREG_SECURE_COOKIES", secure)
    if hours:
        monkeypatch.setenv("RLREG_SESSION_HOURS", hours)
    else:
        monkeypatch.delenv("RLREG_SESSION_HOURS", raising=False)
    reg = open_registry(sqlite_url)
    create_user(reg, "alice", "alice-password")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "cookie-test"})
    response = login(app.test_client())
    assert response.status_code == 302
    attrs = _cookie_attributes(response)
    assert ("secure" in attrs) == (secure == "1") and attrs["httponly"] is True and attrs["samesite"] == "Lax"
    lifetime = timedelta(hours=int(hours or 12))
    expires = parsedate_to_datetime(attrs["expires"])
    from datetime import datetime, timezone

    assert abs((expires - datetime.now(timezone.utc) - lifetime).total_seconds()) < 60
    with reg.read() as s:
        row = s.query(UserSession).one()
        stored = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=expires.tzinfo)
    assert abs((stored - expires).total_seconds()) < 5
    reg.close()


def test_bad_settings_name_the_variable(sqlite_url, monkeypatch):
    from config import ConfigError

    monkeypatch.setenv("RLREG_SESSION_HOURS", "twelve")
    with pytest.raises(ConfigError, match="RLREG_SESSION_HOURS='twelve' must be a whole number"):
        create_app({"DATABASE_URL": sqlite_url})


def _logged_in(app):
    client = app.test_client()
    assert login(client).status_code == 302
    csrf = csrf_from(client.get("/login").get_data(as_text=True))
    cookie = client.get_cookie("session").value  # now holding the CSRF secret too
    return client, cookie, csrf


def _create(app, cookie: str, csrf: str, name: str):
    """A write from a saved copy of the cookie, in a fresh client (as an attacker who copied it would)."""
    replay = app.test_client()
    replay.set_cookie("session", cookie)
    return replay.post("/api/runs", json={"name": name}, headers={"X-CSRFToken": csrf})


def test_logout_password_change_and_disabling_end_sessions(sqlite_url):
    reg = open_registry(sqlite_url)
    create_user(reg, "alice", "alice-password")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "session-test"})
    client, cookie, csrf = _logged_in(app)
    assert _create(app, cookie, csrf, "before-logout").status_code == 201
    page = client.get("/runs").get_data(as_text=True)
    assert client.post("/logout", data={"csrf_token": csrf_from(page)}).status_code == 302
    replayed = _create(app, cookie, csrf, "after-logout")
    assert replayed.status_code == 401
    assert 'id="current-user"' not in _page_with(app, cookie)
    # A password change ends every session of the user (two browsers here).
    first, cookie1, csrf1 = _logged_in(app)
    second, cookie2, csrf2 = _logged_in(app)
    assert _create(app, cookie1, csrf1, "b1").status_code == 201 and _create(app, cookie2, csrf2, "b2").status_code == 201
    assert set_password(reg, "alice", "a-new-password") == 2
    assert _create(app, cookie1, csrf1, "x1").status_code == 401 and _create(app, cookie2, csrf2, "x2").status_code == 401
    assert login(app.test_client()).status_code == 401  # the old password is gone
    # Disabling ends sessions; enabling does not bring them back.
    third, cookie3, csrf3 = _logged_in_with(app, "a-new-password")
    set_user_disabled(reg, "alice", True)
    set_user_disabled(reg, "alice", False)
    assert _create(app, cookie3, csrf3, "x3").status_code == 401
    names = {r["name"] for r in reg.list_runs()[0]}
    assert names == {"before-logout", "b1", "b2"}
    reg.close()


def test_an_expired_session_is_refused_even_if_the_browser_keeps_the_cookie(sqlite_url):
    reg = open_registry(sqlite_url)
    create_user(reg, "alice", "alice-password")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "session-test"})
    client, cookie, csrf = _logged_in(app)
    assert _create(app, cookie, csrf, "fresh").status_code == 201
    with reg.transaction() as s:
        for row in s.query(UserSession):  # the browser keeps the cookie; the server's clock moved on
            row.expires_at = row.expires_at - timedelta(hours=13)
    assert _create(app, cookie, csrf, "stale").status_code == 401
    reg.close()


def _page_with(app, cookie: str) -> str:
    replay = app.test_client()
    replay.set_cookie("session", cookie)
    return replay.get("/runs").get_data(as_text=True)


def _logged_in_with(app, password: str):
    client = app.test_client()
    assert login(client, password=password).status_code == 302
    csrf = csrf_from(client.get("/login").get_data(as_text=True))
    cookie = client.get_cookie("session").value  # now holding the CSRF secret too
    return client, cookie, csrf
