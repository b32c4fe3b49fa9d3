"""The run dashboard's "Diagnosis" and "Similar runs" panels.

The dashboard calls both with the registry and the run (``Registry.run_detail`` dict) and
renders ``templates/panels/diagnosis.html`` / ``similar.html`` with whatever they return
as ``panel``: a dict of display-ready values (``None`` shows the empty placeholder).

* :func:`diagnosis_panel`: the run's current diagnosis (``registry.analysis.health.current_findings``:
  the stored row when it matches the run's data, dictionary and baseline, else diagnosed
  now), as a triage list (diagnostic layer first, then constraint, objective, comparison
  with the baseline, then the rollback point), joint readings and informational notes.
* :func:`similar_panel`: ``registry.analysis.similarity.find_similar`` with the options of the
  panel's form (query parameters ``sim_metrics``, ``sim_prefix``, ``sim_k``,
  ``sim_same_task``, ``sim_align``), plus an overlay of the headline metric drawn by the
  comparison plots.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

from flask import request, url_for

from registry.core.errors import InputError, NotFoundError
from registry.analysis.similarity import find_similar_for_run
from registry.store.facade import Registry
from registry.analysis.diagnosis.episodes import plotted_metric
from registry.analysis.health import current_findings
from registry.analysis.baselines import get_baseline_meta
from registry.web.formatting import format_number
from registry.db.models import CurveEmbedding, Run
from registry.web.curves import MAX_COMPARE_RUNS

log = logging.getLogger(__name__)

LAYER_LABELS = {
    "diagnostic": "diagnostic", "constraint": "constraint", "objective": "objective",
    "comparison": "vs baseline", "rollback": "rollback",
}
DETECTOR_LABELS = {
    "nan_inf": "NaN / Inf", "kl_spike": "KL spike", "kl_climb": "KL climbing", "clip_high": "clip fraction high",
    "clip_low": "clip fraction low", "entropy_collapse": "entropy collapse", "reward_zero": "reward at zero",
    "reward_drop": "reward drop", "reward_flat": "reward flat", "reward_slow": "learning held back",
    "length_hacking": "length hacking",
    "value_loss_flat": "value loss flat", "signal_collapse": "signal collapse",
    "advantage_drift": "advantage drift", "grad_norm_spikes": "grad-norm spikes",
    "policy_loss_growing": "policy loss growing", "baseline_deviation": "outside the baseline",
    "truncation": "responses truncated", "advantage_degenerate": "no learning signal",
    "kl_coef_opposite": "KL coefficient vs KL", "eval_diverging": "eval falling, train rising",
    "unusual_setting": "unusual setting", "components_diverging": "reward components diverge",
}
SEVERITY_LABELS = {"critical": "critical", "warning": "warning", "info": "info"}
PREFIX_CHOICES = (("", "auto"), ("0.1", "first 10%"), ("0.25", "first 25%"), ("0.5", "first 50%"),
                  ("0.75", "first 75%"), ("1", "whole run"))
DEFAULT_K = 10
MAX_K = 20
OVERLAY_NEIGHBOURS = 5
# Hyperparameters worth naming first in "differs in" (the rest go to the cell's title).
KEY_PARAMS = (
    "learning_rate", "lr", "actor.lr", "actor_lr", "kl_coef", "kl_loss_coef", "init_kl_coef", "beta",
    "clip_range", "clip_ratio", "cliprange", "ent_coef", "entropy_coeff", "batch_size", "train_batch_size",
    "n_steps", "n_epochs", "ppo_epochs", "rollout.n", "num_generations", "gamma", "gae_lambda", "max_grad_norm",
    "vf_coef", "target_kl", "env", "seed",
)


def metric_anchor(name: str) -> str:
    """The id of the dashboard card of canonical metric ``name`` (findings link to it)."""
    return f"plot-{name}"


def _steps(start: int, end: int) -> str:
    return f"step {start:,}" if start == end else f"steps {start:,}\u2013{end:,}"


def _label(detector: str) -> str:
    return DETECTOR_LABELS.get(detector, detector.replace("_", " "))


def _titles(run: Mapping[str, Any]) -> dict[str, str]:
    return {s["definition"]: s["definition"].replace("_", " ") for s in run.get("series") or [] if s.get("definition")}


# --- diagnosis ---------------------------------------------------------------------------


def _action(f: Mapping[str, Any]) -> str:
    """The suggested action without its rollback clause (the triage list ends with the rollback step)."""
    action = f.get("suggested_action") or ""
    if f.get("rollback_step") is not None:
        action = action.split("; roll back to checkpoint at step")[0]
        if action.startswith("roll back to checkpoint at step"):
            action = ""
    return action


def _finding_item(f: Mapping[str, Any], titles: Mapping[str, str], order: int | None = None,
                  reading: str | None = None, derived: Mapping[str, Mapping[str, str]] | None = None
                  ) -> dict[str, Any]:
    metric = f["metric"]
    plot = plotted_metric(derived or {}, metric)
    return {
        "order": order, "id": f["id"], "layer": f["layer"], "layer_label": LAYER_LABELS.get(f["layer"], f["layer"]),
        "severity": f["severity"], "detector": f["detector"], "label": _label(f["detector"]),
        "metric": metric, "metric_title": titles.get(metric, metric), "anchor": metric_anchor(plot),
        "has_plot": plot in titles, "span": _steps(f["start"], f["end"]), "start": f["start"], "end": f["end"],
        "title": f["title"], "causes": list(f.get("likely_causes") or []), "check": list(f.get("check_next") or []),
        "action": _action(f), "rollback_step": f.get("rollback_step"),
        "detected_at": f.get("detected_at"), "reading": reading, "summary": f.get("summary"),
        "related": [m for m in f.get("related_metrics") or [] if m != metric],
        "ranked_causes": [c for c in f.get("causes") or [] if c.get("key") != "generic"],
        "named_cause": f.get("cause"), "confidence": f.get("confidence") or "high", "notes": list(f.get("notes") or []),
    }


def diagnosis_panel(registry: Registry, run: dict[str, Any]) -> dict[str, Any] | None:
    """The run's diagnosis in triage order, ready for ``panels/diagnosis.html``."""
    try:
        found = current_findings(registry, run["id"], data_version=run["data_version"], task=run.get("task"))
    except Exception as exc:  # noqa: BLE001 - a detector failing on odd data must not take the dashboard down
        log.exception("diagnosis of run %s failed", run["id"])
        return {"error": f"the diagnosis of this run failed: {exc}", "spans": {}, "ranges": None,
                "severity_by_metric": {},
                "api_url": url_for("api.run_diagnosis", ref=run["id"])}
    d = found.diagnosis or {}
    titles = _titles(run)
    derived = d.get("derived") or {}
    by_id = {f["id"]: f for f in d.get("findings") or []}
    joint = d.get("joint_readings") or []
    reading_of = {fid: j["title"] for j in joint for fid in j.get("finding_ids") or []}
    items: list[dict[str, Any]] = []
    rollback = None
    for step in d.get("triage") or []:
        if step["layer"] == "rollback":
            rollback = {"order": step["order"], "text": step["text"], "step": d.get("rollback_step"),
                        "reason": d.get("rollback_reason")}
            continue
        for fid in step.get("finding_ids") or []:
            if fid in by_id:
                items.append(_finding_item(by_id[fid], titles, step["order"], reading_of.get(fid), derived))
    if rollback is not None and rollback["step"] is not None:
        uri = next((c["uri"] for c in run.get("checkpoints") or [] if c["step"] == rollback["step"]), None)
        rollback["uri"] = uri
    info = [_finding_item(f, titles, derived=derived) for f in d.get("findings") or [] if f["severity"] == "info"]
    readings = []
    for j in joint:
        members = [by_id[fid] for fid in j.get("finding_ids") or [] if fid in by_id]
        metrics = list(dict.fromkeys(f["metric"] for f in members))
        readings.append({
            "kind": j["kind"], "title": j["title"], "severity": j["severity"], "span": _steps(j["start"], j["end"]),
            "interpretation": j["interpretation"], "action": j["suggested_action"], "check": j.get("check_next") or [],
            "metrics": [{"name": m, "title": titles.get(m, m), "anchor": metric_anchor(plotted_metric(derived, m)),
                         "has_plot": plotted_metric(derived, m) in titles} for m in metrics],
        })
    task = run.get("task")
    baseline = None
    if task:
        meta = get_baseline_meta(registry, task)
        baseline = {"task": task, "exists": meta is not None, "url": url_for("baselines.baseline", task=task),
                    "used": d.get("baseline_task") == task, **(meta or {})}
    worst = found.worst_severity if found.n_problems else None
    first = min((i["start"] for i in items), default=None)
    return {
        "run_id": run["id"], "state": found.state, "computed_at": found.computed_at,
        "running": run.get("status") == "running", "status": run.get("status"),
        "first_step": d.get("first_step"), "last_step": d.get("last_step"),
        "metrics_checked": len(d.get("metrics_checked") or []), "missing_roles": d.get("missing_roles") or [],
        "summary": d.get("summary") or "", "healthy": bool(d.get("healthy", True)), "worst": worst,
        "verdict": d.get("verdict") or ("problems" if found.n_problems else "healthy"),
        "not_judged": list(d.get("not_judged") or []), "checked": list(d.get("checked") or []),
        "derived": [v["text"] for v in derived.values()],
        "baseline_note": d.get("baseline_note"),
        "ranges_used": [{"metric": k, **v} for k, v in sorted((d.get("ranges_used") or {}).items())],
        "n_problems": found.n_problems, "n_warning": found.n_warning, "n_critical": found.n_critical,
        "n_info": found.n_info, "first_problem_step": first,
        "triage_items": [i for i in items if i["layer"] != "comparison"],
        "baseline_items": [i for i in items if i["layer"] == "comparison"], "rollback": rollback, "joint": readings,
        "info": info, "baseline": baseline,
        "spans": {m: [tuple(s) for s in v] for m, v in (found.summary.get("spans") or {}).items()},
        "ranges": dict(found.summary.get("ranges") or d.get("ranges") or {}),
        "severity_by_metric": _severity_by_metric(items),
        "api_url": url_for("api.run_diagnosis", ref=run["id"]),
    }


def _severity_by_metric(items: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric: the worst severity of its findings and their one-liners (for the plot cards)."""
    out: dict[str, dict[str, Any]] = {}
    for i in items:
        cur = out.setdefault(i["metric"], {"severity": i["severity"], "titles": []})
        if i["severity"] == "critical":
            cur["severity"] = "critical"
        cur["titles"].append(f"{i['label']} ({i['span']}): {i['title']}")
    return out


# --- similar runs ------------------------------------------------------------------------


def _parse_prefix(text: str) -> float | int | None:
    """``0.25`` or ``25%`` a fraction of training, ``2000`` a step count; empty or ``1`` means no prefix."""
    text = (text or "").strip()
    percent = text.endswith("%")
    body = text.rstrip("%").strip()
    if not body:
        return None
    try:
        value = float(body)
    except ValueError:
        raise InputError(f"prefix {text!r} must be a fraction (0.25), a percentage (25%) or a step count (2000)") \
            from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"prefix must be positive, got {text!r}")
    if percent:
        value /= 100.0
    if value == 1.0:
        return None
    return int(value) if value > 1 and value.is_integer() else value


def _parse_match(text: str) -> tuple[float | int | None, tuple[float | int, float | int] | None]:
    """The panel's Match field: a prefix (``25%``, ``0.25``, ``2000``) or a window of two such
    bounds (``30%-50%``, ``0.3-0.5``, ``2000-6000``). Returns (prefix, window)."""
    parts = [p.strip() for p in (text or "").replace(",", "-").split("-")]
    if len(parts) == 1:
        return _parse_prefix(parts[0]), None
    if len(parts) != 2 or not all(parts):
        raise InputError(f"match {text!r} must be a prefix (25%, 2000) or a window START-END (30%-50%, 2000-6000)")
    a, b = (0.0 if p.rstrip("%").strip() in ("0", "0.0") else _parse_prefix(p) for p in parts)
    return None, (0.0 if a is None else a, 1.0 if b is None else b)


def similar_options(args: Mapping[str, str]) -> dict[str, Any]:
    """The panel form's values as given (strings), with defaults."""
    raw_k = (args.get("sim_k") or "").strip()
    return {
        "metrics": (args.get("sim_metrics") or "").strip(),
        "prefix": (args.get("sim_prefix") or "").strip(),
        "k": raw_k or str(DEFAULT_K),
        "same_task": (args.get("sim_same_task") or "") in ("1", "on", "true", "yes"),
        "align": (args.get("sim_align") or "fraction").strip() or "fraction",
        "anywhere": (args.get("sim_anywhere") or "") in ("1", "on", "true", "yes"),
        "submitted": "sim" in args,
    }


def _k(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise InputError(f"k must be a whole number, got {text!r}") from None
    if not 1 <= k <= MAX_K:
        raise InputError(f"k must be between 1 and {MAX_K}, got {k}")
    return k


def _fmt_value(v: Any) -> str:
    return "\u2014" if v is None else format_number(v) if isinstance(v, (int, float)) else str(v)


def _param_rank(key: str, values: Sequence[Any]) -> tuple[int, int, str]:
    """Well-known hyperparameters first, then other numbers, then text (labels, paths)."""
    last = key.lower()
    for i, hint in enumerate(KEY_PARAMS):
        if last == hint or last.endswith("." + hint):
            return 0, i, key
    numeric = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)
    return (1 if numeric else 2), 0, key


def _diffs(param_diff: Mapping[str, Sequence[Any]], shown: int = 2) -> tuple[list[dict[str, str]], str, int]:
    ranked = sorted(param_diff, key=lambda k: _param_rank(k, param_diff[k]))
    rows = [{"key": k, "query": _fmt_value(param_diff[k][0]), "theirs": _fmt_value(param_diff[k][1])} for k in ranked]
    title = "; ".join(f"{r['key']}: {r['query']} here, {r['theirs']} there" for r in rows)
    return rows[:shown], title, max(0, len(rows) - shown)


def _short_metric(name: str) -> str:
    for suffix in ("_mean",):
        if name.endswith(suffix) and len(name) > 12:
            name = name[: -len(suffix)]
    return name.replace("_", " ")


def similar_panel(registry: Registry, run: dict[str, Any]) -> dict[str, Any] | None:
    """Nearest historical runs and how they ended, ready for ``panels/similar.html``."""
    opts = similar_options(request.args)
    running = run.get("status") == "running"
    panel: dict[str, Any] = {"form": opts, "prefix_choices": PREFIX_CHOICES, "running": running, "error": None,
                             "max_k": MAX_K, "has_task": bool(run.get("task")), "task": run.get("task")}
    if not any(s.get("definition") for s in run.get("series") or []):
        panel["error"] = "This run has no metrics the dictionary knows, so there is nothing to match on."
        return panel
    try:
        prefix, window = _parse_match(opts["prefix"])
        query = {"metrics": opts["metrics"] or None, "k": _k(opts["k"]), "prefix": prefix, "window": window,
                 "align": opts["align"] if opts["align"] in ("fraction", "step") else "fraction",
                 "same_task": opts["same_task"], "anywhere": opts["anywhere"]}
        key = (registry.url, run["id"], run["data_version"], tuple(sorted(query.items())), _corpus_stamp(registry))
        result = _SIMILAR.get(key)
        if result is None:
            result = find_similar_for_run(registry, run["id"], status=run.get("status"), **query)
            _SIMILAR.put(key, result)
    except (InputError, NotFoundError) as exc:
        panel["error"] = str(exc)
        return panel
    metrics = list(result.metrics)
    neighbours = []
    for n in result.neighbours:
        diffs, diff_title, more = _diffs(n.param_diff)
        neighbours.append({
            "rank": n.rank, "run_id": n.run_id, "name": n.name, "url": url_for("ui.run_dashboard", ref=n.run_id),
            "distance": n.distance, "metric_distances": [n.metric_distances.get(m) for m in metrics],
            "verdict": n.verdict, "status": n.status, "task": n.task,
            "scores": sorted(n.scores.items()), "diffs": diffs, "diff_title": diff_title, "diffs_more": more,
            "warnings": list(n.warnings), "matched": n.matched_at(), "coverage": n.coverage,
            "partial": n.metrics_compared < n.metrics_total,
        })
    excluded = []
    for g in result.excluded:
        runs = [{"name": r.get("name") or r["id"][:8], "url": url_for("ui.run_dashboard", ref=r["id"])}
                for r in g.get("runs") or []]
        excluded.append({"reason": g.get("reason"), "metric": g.get("metric"),
                         "differences": list(g.get("differences") or []), "count": g.get("count", len(runs)),
                         "runs": runs[:5], "more": max(0, int(g.get("count", len(runs))) - len(runs[:5]))})
    q = result.query
    closeness, prediction = dict(result.closeness or {}), dict(result.prediction or {})
    head = result.summary  # the verdict sentence; closeness and outcome get their own lines below
    for said in (closeness.get("message") if closeness.get("no_close_match") else None, prediction.get("message")):
        if said:
            head = head.replace(" " + said, "")
    panel.update({
        "summary": head, "closeness": closeness, "prediction": prediction, "metrics": [{"name": m, "short": _short_metric(m)} for m in metrics],
        "neighbours": neighbours, "excluded": excluded, "warnings": list(result.warnings),
        "portion": q.get("portion_label") or "the whole run", "portion_kind": q.get("portion_kind"),
        "anywhere": bool(q.get("anywhere")),
        "engine": result.engine, "predicted": result.predicted_verdict, "verdict_counts": result.verdict_counts,
        "eligible": result.stats.get("eligible_runs"), "last_step": q.get("last_step"),
        "api_url": url_for("api.run_similar", ref=run["id"]) + _api_query(opts),
        "overlay": _overlay(run, result, metrics) if neighbours else None,
    })
    return panel


class _LRU:
    """A small thread-safe LRU of recent similar-run results (a dashboard reload asks the same again)."""

    def __init__(self, size: int = 256):
        import threading
        from collections import OrderedDict

        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_SIMILAR = _LRU()


def _corpus_stamp(registry: Registry) -> tuple:
    """Changes whenever a search could answer differently: embeddings written, runs added, removed or updated."""
    from sqlalchemy import func, select


    with registry.read() as session:
        return tuple(session.execute(select(
            select(func.max(CurveEmbedding.id)).scalar_subquery(),
            select(func.count(CurveEmbedding.id)).scalar_subquery(),
            select(func.count(Run.id)).scalar_subquery(), select(func.max(Run.updated_at)).scalar_subquery())).one())


def _api_query(opts: Mapping[str, Any]) -> str:
    from urllib.parse import urlencode

    prefix, window = _parse_match(opts["prefix"])
    items = [(k, v) for k, v in (("metrics", opts["metrics"]), ("prefix", "" if prefix is None else str(prefix)),
                                 ("window", ",".join(str(b) for b in window) if window else ""), ("k", opts["k"]),
                                 ("align", opts["align"] if opts["align"] != "fraction" else ""),
                                 ("same_task", "1" if opts["same_task"] else ""),
                                 ("anywhere", "1" if opts["anywhere"] else "")) if v]
    return ("?" + urlencode(items)) if items else ""


def _overlay(run: Mapping[str, Any], result: Any, metrics: Sequence[str]) -> dict[str, Any]:
    """The headline metric of the query and its nearest neighbours, drawn by the comparison plot.

    A running run, or a step-aligned query, is overlaid on the step axis: the neighbours'
    curves go on past the query's last step and show how those runs ended.
    """
    from urllib.parse import urlencode


    metric = metrics[0]
    ids = [n.run_id for n in result.neighbours]
    align = "step" if run.get("status") == "running" or result.query.get("align") == "step" else "fraction"
    shown = [run["id"]] + ids[:OVERLAY_NEIGHBOURS]
    everyone = ([run["id"]] + ids)[:MAX_COMPARE_RUNS]
    common = [("group", "0")] + ([("align", align)] if align != "step" else [])
    # Runs of several tasks live on different scales: overlay their shapes, as the search compared them.
    tasks = {run.get("task")} | {n.task for n in result.neighbours[:OVERLAY_NEIGHBOURS]}
    normalized = len(tasks) > 1 and result.query.get("normalize", "z") == "z"
    # anywhere: each run's matched window laid over the query's, on the fraction of the window
    windows = _matched_windows(run["id"], result, metric) if result.query.get("anywhere") else []
    if windows:
        align = "window"
    img = url_for("plots.compare_plot") + "?" + urlencode(
        [("run", r) for r in shown] + [("metric", metric)] + common + ([("normalized", "1")] if normalized else [])
        + [("win", f"{r}:{lo}:{hi}") for r, lo, hi in windows if r in shown])
    compare = url_for("ui.compare") + "?" + urlencode([("run", r) for r in everyone] + common)
    return {"img": img, "metric": metric, "compare_url": compare, "shown": len(shown) - 1, "all": len(everyone) - 1,
            "align": align, "normalized": normalized}


def _matched_windows(query_id: str, result: Any, metric: str) -> list[tuple[str, int, int]]:
    """(run, first step, last step) of the query's portion and of each neighbour's match in ``metric``."""
    spans = [(query_id, (result.query.get("compared_steps") or {}).get(metric))]
    spans += [(n.run_id, n.compared_steps.get(metric)) for n in result.neighbours]
    return [(r, int(s[0]), int(s[1])) for r, s in spans if s and s[1] > s[0]]
