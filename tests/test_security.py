"""Access control, login, CSRF, throttling, headers, production mode and SQL-injection payloads."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect

from registry import Registry, open_registry
from registry.store.auth import create_token, create_user, revoke_token
from registry.db.models import User
from registry.web.app import create_app
from test_web_support import fill_registry

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def site(db_url, tmp_path):
    """CSRF on (as in production), the fixture runs, a user with a token."""
    reg = open_registry(db_url)
    ids = fill_registry(reg, n=20)
    create_user(reg, "alice", "alice-password")
    token = create_token(reg, "alice", "laptop", scope="admin")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "security-test", "UPLOAD_DIR": str(tmp_path / "up")})
    yield app, reg, ids, token
    reg.close()


def csrf_from(page: str) -> str:
    return re.search(r'name="csrf_token" (?:type="hidden" )?value="([^"]+)"', page).group(1)


def login(client, username: str = "alice", password: str = "alice-password", **extra):
    token = csrf_from(client.get("/login").get_data(as_text=True))
    return client.post("/login", data={"username": username, "password": password, "csrf_token": token, **extra})


WRITES = [
    ("post", "/api/runs", {"name": "x"}),
    ("post", "/api/runs/{run}/metrics", {"batch_id": "b1", "points": {"loss": {"steps": [10**6], "values": [1]}}}),
    ("post", "/api/runs/{run}/outcome", {"verdict": "failed"}),
    ("post", "/api/runs/{run}/status", {"status": "crashed"}),
    ("delete", "/api/runs/{run}", None),
    ("patch", "/api/definitions/entropy", {"changes": {"unit": "bits"}}),
    ("post", "/api/uploads", None),
]


def test_every_write_needs_credentials(site):
    app, reg, ids, token = site
    client = app.test_client()
    before = reg.run_detail(ids["sb3-s0"])
    definition = client.get("/api/definitions/entropy").get_json()
    for i, (method, url, body) in enumerate(WRITES):
        url = url.format(run=ids["sb3-s0"])
        for headers in ({}, {"Authorization": f"Bearer rlr_wrong-token-{i}"}, {"Authorization": "Basic YWxpY2U6eA=="}):
            response = getattr(client, method)(url, json=body, headers=headers)
            assert response.status_code == 401, (method, url, headers, response.status_code)
            assert response.get_json()["error"] and "Bearer" in response.headers["WWW-Authenticate"]
    assert reg.run_detail(ids["sb3-s0"]) == before
    # The HTML edit form sends an anonymous visitor to the login page, and refuses a post.
    assert client.get("/dictionary/entropy/edit").headers["Location"].startswith("/login?next=")
    assert client.post("/dictionary/entropy/edit", data={}).status_code in (302, 401)
    assert client.get("/api/definitions/entropy").get_json() == definition


def test_bearer_token_writes_without_csrf_and_a_revoked_token_cannot(site):
    app, reg, ids, token = site
    client = app.test_client()
    auth = {"Authorization": f"Bearer {token}"}
    created = client.post("/api/runs", json={"name": "by-token"}, headers=auth)
    assert created.status_code == 201
    edit = client.patch("/api/definitions/entropy", json={"changes": {"unit": "bits"}, "note": "units"},
                        headers=auth)
    assert edit.status_code == 200 and edit.get_json()["changed"]
    history = client.get("/api/definitions/entropy").get_json()["versions"]
    assert history[0]["author"] == "alice" and history[0]["note"] == "units"
    revoke_token(reg, "alice", "laptop")
    assert client.post("/api/runs", json={"name": "after-revoke"}, headers=auth).status_code == 401
    assert reg.list_runs(where="name=after-revoke")[1] == 0


def test_session_writes_need_the_csrf_token(site):
    app, reg, ids, token = site
    client = app.test_client()
    assert login(client).status_code == 302
    no_token = client.post("/api/runs", json={"name": "by-session"})
    assert no_token.status_code == 400 and "CSRF" in no_token.get_json()["error"]
    csrf = csrf_from(client.get("/login").get_data(as_text=True))
    ok = client.post("/api/runs", json={"name": "by-session"}, headers={"X-CSRFToken": csrf})
    assert ok.status_code == 201
    assert client.delete(f"/api/runs/{ok.get_json()['id']}").status_code == 400  # no token again
    assert client.delete(f"/api/runs/{ok.get_json()['id']}", headers={"X-CSRFToken": csrf}).status_code == 200
    # A disabled account's session stops working at once.
    with reg.transaction() as s:
        s.query(User).filter_by(username="alice").update({"disabled": True})
    assert client.post("/api/runs", json={"name": "x"}, headers={"X-CSRFToken": csrf}).status_code == 401


def test_login_logout_cookie_and_open_redirects(site):
    app, reg, ids, token = site
    client = app.test_client()
    page = client.get("/runs").get_data(as_text=True)
    assert 'id="login-link"' in page and "/login?next=/runs" in page
    wrong = login(client, password="not-the-password")
    assert wrong.status_code == 401 and "wrong user name or password" in wrong.get_data(as_text=True)
    without_csrf = client.post("/login", data={"username": "alice", "password": "alice-password"})
    assert without_csrf.status_code == 400
    ok = login(client, next="/runs?q=algorithm%3DPPO")
    assert ok.status_code == 302 and ok.headers["Location"] == "/runs?q=algorithm%3DPPO"
    cookie = ok.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    page = client.get("/runs").get_data(as_text=True)
    assert 'id="current-user">alice<' in page and 'id="logout-form"' in page
    assert client.get("/logout").status_code == 405  # no logging out through a link
    assert client.post("/logout").status_code == 400  # nor through a forged form
    assert client.post("/logout", data={"csrf_token": csrf_from(page)}).status_code == 302
    assert 'id="login-link"' in client.get("/runs").get_data(as_text=True)
    for evil in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"):
        fresh = app.test_client()
        response = login(fresh, next=evil)
        assert response.status_code == 302 and response.headers["Location"] == "/runs", evil


def test_failed_logins_back_off_per_client_never_locking_out_the_right_password(site):
    app, reg, ids, token = site
    create_user(reg, "bob", "bob-password")
    attacker = app.test_client()
    attacker.environ_base["REMOTE_ADDR"] = "10.0.0.66"
    for _ in range(4):
        assert login(attacker, password="guess").status_code == 401
    slowed = login(attacker, password="guess")  # the 5th failure for (alice, this client)
    assert slowed.status_code == 401
    backoff = login(attacker)  # this client now waits, whatever it sends
    assert backoff.status_code == 429 and 1 <= int(backoff.headers["Retry-After"]) <= 2
    # The right password from another client is never refused because of someone else's guesses.
    owner = app.test_client()
    owner.environ_base["REMOTE_ADDR"] = "10.0.0.7"
    assert login(owner).status_code == 302
    assert login(attacker, "bob", "bob-password").status_code == 302  # another name from the same client
    # Per client: past 20 failures the client backs off for every name, with a growing wait.
    spray = app.test_client()
    spray.environ_base["REMOTE_ADDR"] = "10.0.0.99"
    for i in range(20):
        assert login(spray, f"nobody{i}", "guess").status_code == 401
    first = login(spray, "bob", "bob-password")
    assert first.status_code == 429
    throttles = app.extensions["rlregistry.throttle"]
    throttles.fail(["client:10.0.0.99"] * 3)
    assert throttles.retry_after(["client:10.0.0.99"]) > int(first.headers["Retry-After"])
    bystander = app.test_client()
    bystander.environ_base["REMOTE_ADDR"] = "10.0.0.8"
    assert login(bystander, "bob", "bob-password").status_code == 302


def test_wrong_tokens_back_off_but_a_valid_token_always_works(site):
    app, reg, ids, token = site
    client = app.test_client()
    codes = [client.post("/api/runs", json={"name": "x"}, headers={"Authorization": f"Bearer rlr_guess{i}"}).status_code
             for i in range(25)]
    assert codes[:19] == [401] * 19 and set(codes[19:]) == {429}, codes
    blocked = client.post("/api/runs", json={"name": "x"}, headers={"Authorization": "Bearer rlr_guess-more"})
    assert blocked.status_code == 429 and int(blocked.headers["Retry-After"]) >= 1
    # The same client, the same moment: a valid token is checked first and accepted.
    ok = client.post("/api/runs", json={"name": "valid-after-junk"}, headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 201
    # One wrong token repeated counts against that token too (5 tries), from any address.
    other = app.test_client()
    other.environ_base["REMOTE_ADDR"] = "10.1.1.1"
    codes = [other.get("/api/runs", headers={"Authorization": "Bearer rlr_same"}).status_code for _ in range(6)]
    assert codes == [200] * 6  # reads are open: a bearer header is not even looked at there
    codes = [other.post("/api/runs", json={"name": "x"}, headers={"Authorization": "Bearer rlr_same"}).status_code
             for _ in range(6)]
    assert codes[:4] == [401] * 4 and codes[4:] == [429, 429], codes
    assert reg.list_runs(where="name=x")[1] == 0


def test_reads_can_require_a_login(db_url):
    reg = open_registry(db_url)
    ids = fill_registry(reg, n=10)
    create_user(reg, "carol", "carol-password")
    token = create_token(reg, "carol", "reader")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "s", "REQUIRE_LOGIN_FOR_READS": True})
    client = app.test_client()
    assert client.get("/runs").headers["Location"].startswith("/login?next=/runs")
    assert client.get(f"/runs/{ids['sb3-s0']}").status_code == 302
    assert client.get(f"/plots/run/{ids['sb3-s0']}?key=train/approx_kl").status_code == 302
    api = client.get("/api/runs")
    assert api.status_code == 401 and api.get_json()["error"]
    assert client.get("/login").status_code == 200 and client.get("/static/style.css").status_code == 200
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {token}"}).get_json()["total"] == 5
    assert login(client, "carol", "carol-password").status_code == 302
    assert client.get("/runs").status_code == 200 and client.get("/api/runs").status_code == 200
    reg.close()


def test_security_headers_everywhere(site):
    app, reg, ids, token = site
    client = app.test_client()
    for url in ("/runs", f"/runs/{ids['sb3-s0']}", "/api/runs", "/login", "/api/nothing", "/dictionary/entropy",
                "/no-such-page"):
        response = client.get(url)
        h = response.headers
        assert h["X-Content-Type-Options"] == "nosniff", url
        assert h["X-Frame-Options"] == "DENY", url
        assert h["Referrer-Policy"] == "same-origin", url
        csp = h["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp, url
    assert client.get("/login").headers["Cache-Control"] == "no-store"


def test_production_refuses_to_start_without_a_secret(tmp_path, monkeypatch):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLREG_")}
    env.update(RLREG_ENV="production", RLREG_DATABASE_URL=f"sqlite:///{tmp_path / 'p.db'}", PYTHONPATH=str(REPO))
    code = "from registry.web.app import create_app; app = create_app(); print('KEY', len(app.config['SECRET_KEY']))"
    refused = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode != 0 and "RLREG_SECRET_KEY must be set" in refused.stderr
    started = subprocess.run([sys.executable, "-c", code], env=dict(env, RLREG_SECRET_KEY="k" * 40),
                             capture_output=True, text=True, cwd=tmp_path)
    assert started.returncode == 0 and "KEY 40" in started.stdout, started.stderr
    short = subprocess.run([sys.executable, "-c", code], env=dict(env, RLREG_SECRET_KEY="k"),
                           capture_output=True, text=True, cwd=tmp_path)
    assert short.returncode != 0 and "RLREG_SECRET_KEY is 1 characters; production needs at least 32" in short.stderr
    # `rlreg serve` says so in one line, without a traceback.
    serve = subprocess.run([sys.executable, "-m", "registry.cli", "serve", "--port", "1"], env=env,
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert serve.returncode == 1 and "RLREG_SECRET_KEY must be set" in serve.stderr
    assert "Traceback" not in serve.stderr
    # In-process too: the environment as it is when the app is made.
    monkeypatch.setenv("RLREG_ENV", "production")
    monkeypatch.delenv("RLREG_SECRET_KEY", raising=False)
    with pytest.raises(RuntimeError, match="RLREG_SECRET_KEY"):
        create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'q.db'}"})


# --- SQL injection ---------------------------------------------------------------------------------

SQLI = [
    "' OR '1'='1", "'; DROP TABLE runs; --", "\" OR 1=1 --", "1; DELETE FROM series",
    "x') UNION SELECT * FROM users --",
    "name=x' OR 1=1 --", "learning_rate>0 or 1=1); drop table runs; --", "%' --", "\\'; --", "0x27", "\x00",
    "name IN (SELECT password_hash FROM users)", "-created_at; DROP TABLE runs",
]


def _snapshot(reg: Registry) -> str:
    runs, total = reg.list_runs(limit=None)
    details = [reg.run_detail(r["id"]) for r in runs]
    tables = sorted(inspect(reg.engine).get_table_names())
    with reg.read() as s:
        users = sorted((u.username, u.password_hash) for u in s.query(User))
    return json.dumps([total, details, tables, users], default=str, sort_keys=True)


def test_sql_injection_payloads_get_clean_answers_and_change_nothing(site):
    app, reg, ids, token = site
    client = app.test_client()
    before = _snapshot(reg)
    for payload in SQLI:
        for url, params in (
            ("/api/runs", {"filter": payload}), ("/api/runs", {"q": f"name={payload}"}),
            ("/api/runs", {"order": payload}), ("/api/runs", {"project": payload}), ("/api/runs", {"tag": payload}),
            ("/api/runs", {"verdict": payload}), ("/api/runs", {"status": payload}),
            ("/api/runs", {"limit": payload}), ("/api/runs", {"offset": payload}),
            (f"/api/runs/{payload}", {}), (f"/api/runs/{ids['sb3-s0']}/series", {"key": payload}),
            (f"/api/runs/{ids['sb3-s0']}/series", {"key": "train/approx_kl", "points": payload}),
            (f"/api/definitions/{payload}", {}), ("/api/definitions", {"layer": payload}),
        ):
            response = client.get(url, query_string=params)
            assert response.status_code < 500, (url, params, response.status_code)
            assert response.mimetype == "application/json", (url, params)
            body = response.get_json()
            if response.status_code >= 400:
                assert set(body) == {"error"}
                leaks = ("Traceback", "sqlalchemy", "sqlite3", "psycopg", "OperationalError", "ProgrammingError")
                assert not any(word in body["error"] for word in leaks), body
            elif "runs" in body:
                assert body["total"] == 0 or params.get("filter") or params.get("q"), (url, params, body["total"])
        for url, params in (("/runs", {"q": payload}), ("/runs", {"order": payload}), ("/runs", {"project": payload}),
                            ("/runs", {"page": payload}), ("/compare", {"run": payload}),
                            (f"/runs/{payload}", {}), (f"/dictionary/{payload}", {}), ("/dictionary/", {"q": payload})):
            response = client.get(url, query_string=params)
            assert response.status_code in (200, 400, 404), (url, params, response.status_code)
    assert _snapshot(reg) == before

    # Through the write API: names, tags, parameters, keys and batch ids are data, never SQL.
    auth = {"Authorization": f"Bearer {token}"}
    for i, payload in enumerate(p for p in SQLI if "\x00" not in p):
        created = client.post("/api/runs", json={"name": payload, "project": payload, "tags": [payload],
                                                 "params": {"opt": {"name": payload}}, "task": payload}, headers=auth)
        assert created.status_code == 201, created.get_json()
        run = created.get_json()
        assert run["name"] == payload.strip() and run["tags"] == [payload.strip()]
        assert run["params"] == {"opt.name": payload}
        if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", payload):
            bad_batch = client.post(f"/api/runs/{run['id']}/metrics", headers=auth,
                                    json={"batch_id": payload, "points": {payload: {"steps": [1], "values": [1]}}})
            assert bad_batch.status_code == 400 and "batch_id" in bad_batch.get_json()["error"]
        ok = client.post(f"/api/runs/{run['id']}/metrics", headers=auth,
                         json={"batch_id": f"b{i}", "points": {payload: {"steps": [1], "values": [1]}}})
        assert ok.status_code == 200 and ok.get_json()["applied"]
        assert reg.read_series(run["id"], payload).values.tolist() == [1.0]
        assert client.post(f"/api/runs/{payload}/outcome", json={"notes": payload},
                           headers=auth).status_code in (200, 404)
    assert client.post("/api/runs", json={"name": "\x00bad"}, headers=auth).status_code == 400
    assert client.delete("/api/runs/' OR 'x'='x", headers=auth).status_code == 404
    # A run really named "' OR '1'='1" is deleted by name: that one run and no other.
    assert client.delete("/api/runs/' OR '1'='1", headers=auth).status_code == 200
    runs, total = reg.list_runs(limit=None)
    assert total == 5 + len([p for p in SQLI if "\x00" not in p]) - 1
    assert {r["name"] for r in runs} >= {"sb3-cartpole-s0", "sb3-cartpole-s1", "cleanrl-cartpole"}
    assert sorted(inspect(reg.engine).get_table_names()) == json.loads(before)[2]


def test_malformed_write_bodies_are_400_json(site):
    app, reg, ids, token = site
    client = app.test_client()
    auth = {"Authorization": f"Bearer {token}"}
    run = ids["grpo-lr1e-6"]
    cases = [
        ("/api/runs", "not json", "JSON object"),
        ("/api/runs", [1, 2], "JSON object"),
        ("/api/runs", {"name": ""}, "name is required"),
        ("/api/runs", {"name": "x", "bogus": 1}, "unknown field"),
        ("/api/runs", {"name": "x", "tags": "a"}, "tags must be a list"),
        ("/api/runs", {"name": "x", "run_id": "../../etc"}, "run_id"),
        ("/api/runs", {"name": "x" * 500}, "longer than"),
        (f"/api/runs/{run}/metrics", {"points": {}}, "batch_id"),
        (f"/api/runs/{run}/metrics", {"batch_id": "a", "points": {"k": {"steps": [1.5], "values": [1]}}},
         "whole number"),
        (f"/api/runs/{run}/metrics", {"batch_id": "a", "points": {"k": {"steps": [True], "values": [1]}}},
         "whole number"),
        (f"/api/runs/{run}/metrics", {"batch_id": "a", "points": {"k": {"steps": [1], "values": ["1"]}}},
         "not a number"),
        (f"/api/runs/{run}/metrics", {"batch_id": "a", "points": {"k": {"steps": [1, 2], "values": [1]}}},
         "2 steps but 1"),
        (f"/api/runs/{run}/metrics", {"batch_id": "a", "points": {"k": {"steps": [2, 1], "values": [1, 2]}}},
         "goes back"),
        (f"/api/runs/{run}/metrics", {"batch_id": "a", "points": {"k": {"steps": [2**70], "values": [1]}}}, "int64"),
        (f"/api/runs/{run}/metrics", {"batch_id": "a", "points": {"\x01": {"steps": [1], "values": [1]}}}, "printable"),
        (f"/api/runs/{run}/outcome", {"verdict": "great"}, "verdict must be one of"),
        (f"/api/runs/{run}/outcome", {"scores": {"x": "high"}}, "must be a number"),
        (f"/api/runs/{run}/outcome", {"checkpoints": [{"step": "1", "uri": "s3://x"}]}, "checkpoints[0]"),
        (f"/api/runs/{run}/status", {"status": "exploded"}, "status must be one of"),
        ("/api/definitions/entropy", {"changes": {"layer": "top"}}, "layer"),
    ]
    for url, body, message in cases:
        method = client.patch if "definitions" in url else client.post
        kwargs = {"data": body, "content_type": "application/json"} if isinstance(body, str) else {"json": body}
        response = method(url, headers=auth, **kwargs)
        expected = 422 if message == "int64" else 400  # a bound on number size, not a malformed body
        assert response.status_code == expected, (url, body, response.status_code, response.get_data(as_text=True))
        assert message in response.get_json()["error"], (url, body, response.get_json())
    assert client.post("/api/runs/nope/status", json={"status": "finished"}, headers=auth).status_code == 404
    assert client.patch("/api/definitions/nope", json={"changes": {"unit": "x"}}, headers=auth).status_code == 404
