"""The API reference: /api/ lists every documented endpoint, /api/docs renders openapi.yaml, the nav links there."""
from __future__ import annotations

import html
import re

import yaml

from registry import open_registry
from registry.web.app import create_app
from registry.web.api import OPENAPI_PATH
from test_web_support import check_response


def _client(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'registry.db.engine'}")
    return reg, create_app({"REGISTRY": reg, "TESTING": True}).test_client()


def test_api_root_lists_every_documented_operation(tmp_path, openapi):
    reg, client = _client(tmp_path)
    response = client.get("/api/")
    assert response.status_code == 200
    check_response(openapi, response, "/api/")
    listed = {(e["method"], e["path"]) for e in response.get_json()["endpoints"]}
    spec = yaml.safe_load(OPENAPI_PATH.read_text())
    documented = {(m.upper(), p) for p, item in spec["paths"].items() for m in item if m in ("get", "post", "put",
                                                                                          "patch", "delete")}
    assert listed == documented and ("GET", "/api/runs/{ref}/plot") in listed
    assert response.get_json()["docs"] == "/api/docs"
    reg.close()


def test_reference_page_renders_each_operation_and_is_linked_from_the_navigation(tmp_path):
    reg, client = _client(tmp_path)
    page = client.get("/api/docs")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["Content-Security-Policy"]
    text = html.unescape(page.get_data(as_text=True))
    spec = yaml.safe_load(OPENAPI_PATH.read_text())
    for path, item in spec["paths"].items():
        assert f"<code>{path}</code>" in text, path
        for method, op in item.items():
            if method in ("get", "post", "delete") and op.get("summary"):
                assert op["summary"] in text
    # Parameters are listed with their type and whether they are required.
    assert re.search(r"<code>from_step</code>.*?query.*?number", text, re.S)
    runs = html.unescape(client.get("/runs").get_data(as_text=True))
    assert re.search(r'<a href="/api/docs"[^>]*>API</a>', runs)
    reg.close()
