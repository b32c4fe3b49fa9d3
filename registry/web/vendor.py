"""plotly.js, served from the installed ``plotly`` package (no CDN), and its stylesheet.

The interactive plots use the plotly.js bundle that the ``plotly`` Python package ships in its
package data (``plotly/package_data/plotly.min.js``), so it installs from PyPI with the project
and works offline. Its version is the installed package's.

plotly.js adds its base CSS rules at load time through a ``<style>`` element, which the
Content-Security-Policy (``style-src 'self'``) refuses. It skips that when the page already has
an element ``#plotly.js-style-global.no-inline-styles``; the page links this module's
``plotly.css`` under that id. The rules are read from the installed bundle itself (its table of
selector -> declarations, with plotly's ``X``/``Y`` placeholders expanded the way plotly does),
so they always match the bundle being served.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from pathlib import Path

from flask import Blueprint, Response, abort, request

bp = Blueprint("vendor", __name__, url_prefix="/static/vendor")

# The bundle's CSS table starts with this selector; entries are "selector":'decls' or "selector":"decls".
_RULES_START = '{"X,X div":'
_RULE = re.compile(r'"((?:[^"\\]|\\.)*)":(?:\'((?:[^\'\\]|\\.)*)\'|"((?:[^"\\]|\\.)*)")')


@functools.lru_cache(maxsize=1)
def plotly_js_path() -> Path | None:
    """The installed plotly.min.js, None when the ``plotly`` package is missing."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def _bundle() -> tuple[bytes, str] | None:
    path = plotly_js_path()
    if path is None:
        return None
    data = path.read_bytes()
    return data, hashlib.sha256(data).hexdigest()[:20]


def plotly_css(js: str) -> str:
    """plotly.js's base stylesheet, from the rules table inside the bundle ``js``."""
    start = js.find(_RULES_START)
    if start < 0:
        return ""
    rules, pos = [], start + 1
    while True:
        match = _RULE.match(js, pos)
        if match is None:
            break
        selector = match.group(1).replace("X", ".js-plotly-plot .plotly").replace("Y", ".plotly-notifier")
        declarations = match.group(2) if match.group(2) is not None else match.group(3)
        rules.append(f"{selector}{{{declarations}}}")
        pos = match.end()
        if js.startswith(",", pos):
            pos += 1
        else:
            break
    # plotly inserts each rule at the top of its sheet, so earlier table entries win ties: reversed.
    return "\n".join(reversed(rules)) + "\n"


@functools.lru_cache(maxsize=1)
def _css() -> tuple[bytes, str] | None:
    bundle = _bundle()
    if bundle is None:
        return None
    css = plotly_css(bundle[0].decode("utf-8", "replace")).encode("utf-8")
    return css, hashlib.sha256(css).hexdigest()[:20]


def plotly_available() -> bool:
    return plotly_js_path() is not None


_STYLE_GUARD = re.compile(r'document\.getElementById\("([0-9a-f]{64})"\)\)\{var \w+=document\.createElement\("style"\)')


@functools.lru_cache(maxsize=1)
def inline_style_guards() -> tuple[str, ...]:
    """Ids whose presence stops the bundle from injecting a ``<style>`` element at load time.

    The bundle carries the maplibre stylesheet (map traces, unused here) and inserts it once,
    unless an element with its id exists; the page puts an inert ``<template>`` under each such
    id, so the CSP has nothing to refuse.
    """
    bundle = _bundle()
    if bundle is None:
        return ()
    return tuple(dict.fromkeys(_STYLE_GUARD.findall(bundle[0].decode("utf-8", "replace"))))


def _serve(item: tuple[bytes, str] | None, mimetype: str) -> Response:
    if item is None:
        abort(404, "the plotly package is not installed: pip install plotly")
    data, tag = item
    if request.if_none_match.contains(tag):
        response = Response(status=304)
    else:
        response = Response(data, mimetype=mimetype)
    response.set_etag(tag)
    # The file changes only with the installed package: revalidate after a day.
    response.headers["Cache-Control"] = "public, max-age=86400"
    return response


@bp.get("/plotly.min.js")
def plotly_js() -> Response:
    return _serve(_bundle(), "text/javascript")


@bp.get("/plotly.css")
def plotly_stylesheet() -> Response:
    return _serve(_css(), "text/css")
