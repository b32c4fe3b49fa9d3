"""How the analysis layer follows the store: the subscribers it attaches to a registry's hooks.

The subscribers import diagnosis and the similar-run index (NumPy, the detectors) when a write
first calls them, so that opening a registry to read, as ``rlreg runs`` does, stays cheap.
"""
from __future__ import annotations

from typing import Any

from registry.store.hooks import Hooks


def refresh_embeddings(*args: Any, **kwargs: Any) -> Any:
    from registry.analysis.similarity.index import refresh_embeddings as refresh

    return refresh(*args, **kwargs)


def refresh_findings(*args: Any, **kwargs: Any) -> Any:
    from registry.analysis.health import refresh_findings as refresh

    return refresh(*args, **kwargs)


def subscribe(hooks: Hooks) -> None:
    """Keep the similar-run index current inside each write, and diagnose each committed run."""
    hooks.on_series_written(refresh_embeddings)
    hooks.on_run_committed(refresh_findings)
