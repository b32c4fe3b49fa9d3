"""Similar-run search: which past runs looked like this one, and how did they end?

    from registry import open_registry
    from registry.analysis.similarity import find_similar

    reg = open_registry("sqlite:///runs.db")
    res = find_similar(reg, "ppo-lr5e-2", metrics="reward,kl,entropy", k=10, prefix=0.25)
    print(res.summary)          # "Matching the first 25% of training: 7 of the 10 nearest runs ..."
    res.to_dict()               # JSON-ready: neighbours with distances, params, verdicts, scores

Queries:
- whole run (default for a finished run); ``prefix`` a fraction (0-1] or a step count;
  ``window`` a pair of fractions or of steps. Historical runs are compared over the same
  portion: the same fraction of their own training (``align="fraction"``) or the same
  absolute steps (``align="step"``; runs that end earlier are excluded, with the reason).
  A run still training is compared, by default, over what it has logged so far: against
  the same fraction of training when its planned length is known (``total_steps=`` or a
  hyperparameter such as ``total_timesteps``), else against the same number of steps.
  The neighbours' verdicts and final scores are how those runs *ended*.
- ``anywhere=True``: the window or prefix is matched against windows of the same length
  wherever they lie in each run ("where else did this pattern happen?"; ``anywhere``).
- ``metrics``: canonical names, raw keys of the query run, or short names ("reward",
  "return", "kl", "entropy", or any dictionary quantity) resolved among the query run's
  own metrics by quantity (see ``search.resolve_metrics``). Default: reward/return, KL
  and entropy. ``weights`` per metric (default 1).
- ``normalize="z"`` (default) compares shapes after per-metric z-normalisation; flat
  series are marked flat (all-zero shape) rather than divided by ~0. ``"raw"`` compares
  values, each metric divided by the median std of that metric over the collection.
- Filters: ``same_task``, ``same_project``, ``same_algorithm``, ``where`` (filter
  language, ``registry.store.filters``), ``outcome`` (verdict or list of verdicts).
- Semantics: a metric is only compared between series whose quantity, averaging, KL
  estimator and normalization axis agree. Runs whose series disagree are compared on
  their other metrics (the neighbour carries a warning) or, with none left, excluded;
  ``result.excluded`` lists each group with the differences ("KL estimator: k3 vs k1").
  A different logging point only warns.

Engine (see ``search``): a PAA-32 candidate stage (vectorised NumPy over cached per-process
matrices, or pgvector HNSW on PostgreSQL), a cheap elastic pre-rerank (banded DTW on grids
halved to 64 points), then exact 128-point banded DTW (dtaidistance C) on the final pool with
early abandoning against the current k-th best. Results are exact over that pool.
Embeddings (``index``) are kept current by ``refresh_embeddings(session, run_id)``, which
the store calls after each write, and recomputed for a new ``EMBEDDING_VERSION`` by
``rebuild_embeddings(registry)``.
"""
from registry.analysis.similarity.features import EMBEDDING_VERSION, compute_features
from registry.analysis.similarity.index import pgvector_status, rebuild_embeddings, refresh_embeddings
from registry.analysis.similarity.result import Neighbour, SimilarResult
from registry.analysis.similarity.query import resolve_metrics
from registry.analysis.similarity.search import brute_force, find_similar, find_similar_for_run

__all__ = [
    "EMBEDDING_VERSION", "Neighbour", "SimilarResult", "brute_force", "compute_features", "find_similar",
    "find_similar_for_run",
    "pgvector_status", "rebuild_embeddings", "refresh_embeddings", "resolve_metrics",
]
