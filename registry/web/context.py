"""What the web modules share at request time: the open registry, the plot cache, the CSRF guard.

Kept apart from :mod:`registry.web.app` so that views import these without importing the
application factory (which imports every view).
"""
from __future__ import annotations

from flask import current_app
from flask_wtf.csrf import CSRFProtect

from registry.store.facade import Registry
from registry.web.cache import PlotCache

csrf = CSRFProtect()


def get_registry() -> Registry:
    return current_app.extensions["rlregistry"]


def get_plot_cache() -> PlotCache:
    return current_app.extensions["rlregistry.plot_cache"]
