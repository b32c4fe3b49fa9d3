"""Write actions in the web UI with a session login and CSRF on: the edit form, delete with
confirmation, the upload form and its registration report, and the run history every change lands in."""
from __future__ import annotations

import io
import re

import pytest
from click.testing import CliRunner

from registry import Registry
from registry.store.auth import create_token, create_user
from registry.cli.main import cli
from registry.store.run_history import history
from registry.web.app import create_app
from registry.web.edit_views import parse_checkpoints, parse_scores
from test_security import csrf_from, login


@pytest.fixture
def site(db_url, tmp_path):
    reg = Registry(db_url)
    run = reg.register_arrays(
        "edit-me", {"train/approx_kl": ([1, 2, 3], [0.01, 0.02, 0.015]), "rollout/ep_rew_mean": ([1, 2, 3], [1, 2, 3])},
        framework="stable-baselines3", algorithm="PPO", project="p", tags=["old-tag", "keep"],
        outcome={"verdict": "failed", "scores": {"final_return": 3.0, "dropped": 1.0},
                 "checkpoints": [(3, "s3://ckpt/3")]})
    create_user(reg, "alice", "alice-password")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "edit-test", "UPLOAD_DIR": str(tmp_path / "up")})
    yield app, reg, run.run_id, db_url
    reg.close()


def logged_in(app):
    client = app.test_client()
    assert login(client).status_code == 302
    return client


def edit_fields(page: str) -> dict[str, str]:
    fields = {"csrf_token": csrf_from(page), "version": re.search(r'name="version" type="hidden" value="(\d+)"', page).group(1)}
    return fields


def test_edit_form_replaces_outcome_and_tags_and_the_history_shows_who_and_what(site):
    app, reg, run_id, _ = site
    anonymous = app.test_client()
    assert anonymous.get(f"/runs/{run_id}/edit").status_code == 302  # to the login page
    client = logged_in(app)
    page = client.get(f"/runs/{run_id}/edit").get_data(as_text=True)
    assert "final_return = 3.0" in page and "3 s3://ckpt/3" in page and "keep, old-tag" in page
    form = {**edit_fields(page), "verdict": "success", "tags": "keep, reviewed",
            "scores": "final_return = 4.5\nsuccess_rate = 0.9", "checkpoints": "3 s3://ckpt/3\n1,000 s3://ckpt/1000 best so far",
            "notes": "re-evaluated\r\non 100 episodes", "note": "new eval"}
    # The same post without the CSRF token changes nothing.
    refused = client.post(f"/runs/{run_id}/edit", data={k: v for k, v in form.items() if k != "csrf_token"})
    assert refused.status_code == 400
    assert reg.run_detail(run_id)["verdict"] == "failed"
    answer = client.post(f"/runs/{run_id}/edit", data=form)
    assert answer.status_code == 302, answer.get_data(as_text=True)[:500]
    run = reg.run_detail(run_id)
    assert run["verdict"] == "success"
    assert run["scores"] == {"final_return": 4.5, "success_rate": 0.9}  # 'dropped' removed
    assert run["tags"] == ["keep", "reviewed"]
    assert run["notes"] == "re-evaluated\non 100 episodes"
    assert [(c["step"], c["uri"], c["note"]) for c in run["checkpoints"]] == [
        (3, "s3://ckpt/3", None), (1000, "s3://ckpt/1000", "best so far")]
    [event, *_] = history(reg, run_id)
    assert event["author"] == "alice" and event["action"] == "edited" and event["note"] == "new eval"
    assert event["changes"]["verdict"] == {"before": "failed", "after": "success"}
    assert event["changes"]["tags"] == {"before": ["keep", "old-tag"], "after": ["keep", "reviewed"]}
    assert event["changes"]["scores"]["before"] == {"dropped": 1.0, "final_return": 3.0}
    assert set(event["changes"]) == {"verdict", "tags", "scores", "notes", "checkpoints"}
    shown = client.get(f"/runs/{run_id}/history").get_data(as_text=True)
    assert "alice" in shown and "new eval" in shown and "reviewed" in shown and "old-tag" in shown
    # Saving the same form again records nothing.
    page = client.get(f"/runs/{run_id}/edit").get_data(as_text=True)
    again = client.post(f"/runs/{run_id}/edit", data={**form, **edit_fields(page)}, follow_redirects=True)
    assert "Nothing changed" in again.get_data(as_text=True)
    assert len(history(reg, run_id)) == 1


def test_edit_form_refuses_bad_lines_and_a_stale_form_without_writing(site):
    app, reg, run_id, _ = site
    client = logged_in(app)
    page = client.get(f"/runs/{run_id}/edit").get_data(as_text=True)
    fields = {**edit_fields(page), "verdict": "failed"}
    bad = client.post(f"/runs/{run_id}/edit", data={**fields, "scores": "final_return = 4\nacc = high"})
    assert bad.status_code == 400 and "line 2: &#39;high&#39; is not a number" in bad.get_data(as_text=True)
    bad = client.post(f"/runs/{run_id}/edit", data={**fields, "checkpoints": "3 a\n3 b"})
    assert bad.status_code == 400 and "checkpoint step 3 is given twice" in bad.get_data(as_text=True)
    # Someone else changed the run after this form was opened.
    reg.set_outcome(run_id, verdict="diverged")
    stale = client.post(f"/runs/{run_id}/edit", data={**fields, "verdict": "success"})
    assert stale.status_code == 400 and "changed since the form was opened" in stale.get_data(as_text=True)
    run = reg.run_detail(run_id)
    assert run["verdict"] == "diverged" and run["scores"] == {"final_return": 3.0, "dropped": 1.0}
    assert [e["action"] for e in history(reg, run_id)] == ["outcome"]


def test_parsers_name_the_line():
    assert parse_scores("# comment\n a = 1e-3 \n\nb=2") == {"a": 1e-3, "b": 2.0}
    with pytest.raises(ValueError, match="line 1: write 'name = value'"):
        parse_scores("just a name")
    with pytest.raises(ValueError, match="line 2: score 'a' is given twice"):
        parse_scores("a = 1\na = 2")
    assert [c.to_dict() for c in parse_checkpoints("10 s3://x note with spaces")] == [
        {"step": 10, "uri": "s3://x", "note": "note with spaces"}]
    with pytest.raises(ValueError, match="line 1: step 'ten' is not a whole number"):
        parse_checkpoints("ten s3://x")


def test_delete_needs_the_name_typed_and_leaves_a_record(site):
    app, reg, run_id, _ = site
    client = logged_in(app)
    page = client.get(f"/runs/{run_id}/delete").get_data(as_text=True)
    assert "6 points" in page and "2 metric series" in page
    token = csrf_from(page)
    wrong = client.post(f"/runs/{run_id}/delete", data={"csrf_token": token, "confirm_name": "edit-m"})
    assert wrong.status_code == 400 and "nothing was deleted" in wrong.get_data(as_text=True)
    assert reg.run_detail(run_id)["name"] == "edit-me"
    done = client.post(f"/runs/{run_id}/delete", data={"csrf_token": token, "confirm_name": "edit-me",
                                                       "note": "duplicate of another run"})
    assert done.status_code == 302
    assert reg.list_runs()[1] == 0
    assert client.get(f"/runs/{run_id}").status_code == 404
    record = client.get(f"/runs/{run_id}/history")
    text = record.get_data(as_text=True)
    assert record.status_code == 200 and "deleted" in text and "duplicate of another run" in text and "alice" in text
    [event] = history(reg, run_id)
    assert event["changes"]["verdict"] == {"before": "failed", "after": None}
    assert client.get("/runs/0123456789abcdef0123456789abcdef/history").status_code == 404


def test_upload_form_registers_and_reports_mapped_unmapped_and_warnings(site):
    app, reg, _, _ = site
    client = logged_in(app)
    page = client.get("/upload").get_data(as_text=True)
    assert 'src="/static/upload.js"' in page and "<script>" not in page
    csv = b"step,train/approx_kl,rollout/ep_rew_mean,my/probe_value\n1,0.01,5,1\n2,0.02,6,2\n2,0.03,7,3\n"
    answer = client.post("/upload", data={"csrf_token": csrf_from(page), "file": (io.BytesIO(csv), "ppo_run.csv"),
                                          "framework": "stable-baselines3", "tags": "uploaded, ui"},
                         content_type="multipart/form-data", headers={"X-Requested-With": "XMLHttpRequest"})
    text = answer.get_data(as_text=True)
    assert answer.status_code == 201, text[:800]
    assert "<!doctype" not in text.lower()  # a fragment for the page's report area
    assert "Registered 1 run from <code>ppo_run.csv</code>" in text
    assert "train/approx_kl" in text and "kl_old_mean" in text  # mapped, to its definition
    assert 'class="compact report-unmapped"' in text and "my/probe_value" in text
    [run], _ = reg.list_runs(where="name=ppo_run")
    assert run["tags"] == ["ui", "uploaded"]
    [event] = history(reg, run["id"])
    assert event["action"] == "registered" and event["author"] == "alice"
    assert event["changes"]["source"]["after"] == "ppo_run.csv" and event["changes"]["points"]["after"] == 9
    # Without JavaScript the same post answers with a whole page.
    page = client.get("/upload").get_data(as_text=True)
    full = client.post("/upload", data={"csrf_token": csrf_from(page), "file": (io.BytesIO(csv), "again.csv")},
                       content_type="multipart/form-data")
    assert full.status_code == 409 and "<!doctype html>" in full.get_data(as_text=True)
    assert "already registered" in full.get_data(as_text=True)


def test_upload_form_error_names_the_file_and_position_and_stores_nothing(site):
    app, reg, _, _ = site
    client = logged_in(app)
    page = client.get("/upload").get_data(as_text=True)
    before = reg.list_runs()[1]
    bad = b"step,loss\n1,0.5\n2,abc\n"
    answer = client.post("/upload", data={"csrf_token": csrf_from(page), "file": (io.BytesIO(bad), "broken.csv")},
                         content_type="multipart/form-data", headers={"X-Requested-With": "XMLHttpRequest"})
    text = answer.get_data(as_text=True)
    assert answer.status_code == 400 and 'id="upload-error"' in text and "broken.csv" in text and "line 3" in text
    assert reg.list_runs()[1] == before
    # No CSRF token: refused before anything is read.
    refused = client.post("/upload", data={"file": (io.BytesIO(b"step,loss\n1,1\n"), "x.csv")},
                          content_type="multipart/form-data")
    assert refused.status_code == 400 and reg.list_runs()[1] == before


def test_api_cli_outcome_and_status_changes_are_in_the_history(site):
    app, reg, run_id, db_url = site
    token = create_token(reg, "alice", "ci")
    client = app.test_client()
    auth = {"Authorization": f"Bearer {token}"}
    assert client.post(f"/api/runs/{run_id}/outcome", json={"scores": {"final_return": 7}}, headers=auth).status_code == 200
    assert client.post(f"/api/runs/{run_id}/status", json={"status": "crashed"}, headers=auth).status_code == 200
    # An outcome that changes nothing records nothing.
    assert client.post(f"/api/runs/{run_id}/outcome", json={"verdict": "failed"}, headers=auth).status_code == 200
    result = CliRunner().invoke(cli, ["--db", db_url, "outcome", run_id, "--verdict", "diverged"])
    assert result.exit_code == 0, result.output
    events = history(reg, run_id)
    assert [(e["action"], e["author"]) for e in events] == [("outcome", None), ("status", "alice"), ("outcome", "alice")]
    assert events[2]["changes"] == {"scores": {"before": {"dropped": 1.0, "final_return": 3.0},
                                               "after": {"dropped": 1.0, "final_return": 7.0}}}
    assert events[1]["changes"] == {"status": {"before": "finished", "after": "crashed"}}
    assert events[0]["changes"] == {"verdict": {"before": "failed", "after": "diverged"}}
