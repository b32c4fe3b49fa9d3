"""How the analysis layer follows the store: the subscribers it attaches to a registry's hooks."""
from __future__ import annotations

from registry.analysis.health import refresh_findings
from registry.analysis.similarity.index import refresh_embeddings
from registry.store.hooks import Hooks


def subscribe(hooks: Hooks) -> None:
    """Keep the similar-run index current inside each write, and diagnose each committed run."""
    hooks.on_series_written(refresh_embeddings)
    hooks.on_run_committed(refresh_findings)
