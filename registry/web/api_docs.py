"""The API reference: ``/api/`` lists every endpoint (JSON), ``/api/docs`` renders ``openapi.yaml`` as a page.

Both read the same document the tests validate every response against, so the reference cannot
drift from what the server answers.
"""
from __future__ import annotations

import functools
from typing import Any

import yaml
from flask import Blueprint, Response, jsonify, render_template, url_for

from registry.web.api import OPENAPI_PATH

bp = Blueprint("api_docs", __name__, url_prefix="/api")

METHODS = ("get", "post", "put", "patch", "delete")


@functools.lru_cache(maxsize=1)
def _spec(mtime: float) -> dict[str, Any]:
    return yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))


def spec() -> dict[str, Any]:
    """The OpenAPI document (re-read when the file changes)."""
    return _spec(OPENAPI_PATH.stat().st_mtime)


def _resolve(node: Any, document: dict[str, Any]) -> Any:
    if isinstance(node, dict) and "$ref" in node:
        target: Any = document
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return target
    return node


def operations() -> list[dict[str, Any]]:
    """Every operation: method, path, summary, description, parameters and responses, in document order."""
    document = spec()
    out = []
    for path, item in (document.get("paths") or {}).items():
        shared = item.get("parameters") or []
        for method in METHODS:
            op = item.get(method)
            if not op:
                continue
            params = []
            for raw in [*shared, *(op.get("parameters") or [])]:
                p = _resolve(raw, document)
                schema = _resolve(p.get("schema") or {}, document)
                kind = schema.get("type", "")
                if kind == "array":
                    kind = f"array of {_resolve(schema.get('items') or {}, document).get('type', '')}"
                params.append({"name": p.get("name"), "in": p.get("in"), "required": bool(p.get("required")),
                               "type": kind if isinstance(kind, str) else " or ".join(kind),
                               "enum": schema.get("enum"), "default": schema.get("default"),
                               "description": (p.get("description") or "").strip()})
            body = _resolve(op.get("requestBody") or {}, document)
            responses = [{"status": str(code), "description": (_resolve(r, document).get("description") or "").strip()}
                         for code, r in (op.get("responses") or {}).items()]
            out.append({"method": method.upper(), "path": path, "id": op.get("operationId") or f"{method}-{path}",
                        "summary": op.get("summary") or "", "description": (op.get("description") or "").strip(),
                        "parameters": params, "body": sorted((body.get("content") or {}).keys()),
                        "responses": responses, "tags": op.get("tags") or []})
    return out


@bp.get("/")
def index() -> Response:
    """Every endpoint with its summary; the full document at /api/openapi.yaml, readable at /api/docs."""
    return jsonify({
        "openapi": url_for("api.openapi"), "docs": url_for("api_docs.docs"),
        "endpoints": [{"method": o["method"], "path": o["path"], "summary": o["summary"]} for o in operations()],
    })


@bp.get("/docs")
def docs() -> str:
    document = spec()
    return render_template("api_docs.html", info=document.get("info") or {}, operations=operations())
