"""Several runs on one plot: runs grouped into units (seed groups), metrics compared by semantics,
overlays with bands, and their exports."""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from registry.dictionary.definitions import healthy_range_for
from registry.core.errors import InputError
from registry.core.semantics import SEMANTIC_FIELDS, semantic_differences
from registry.core.series import SeriesData
from registry.web.plotting import PALETTE, PlotSpec, Trace

from registry.web.curves import ALIGNMENTS, BANDS, GRID_POINTS, NORMALIZATIONS, NORMALIZATION_LABELS, NORMALIZED_QUANTITIES, Prepared, SmoothOptions, choice_arg, export_rows, fmt_count, prepare, reduce_for_display, thin_nonfinite, y_limits


SEED_KEYS = ("seed", "random_seed", "rng_seed")


def is_seed_key(key: str) -> bool:
    last = key.lower().rsplit(".", 1)[-1].rsplit("/", 1)[-1]
    return last in SEED_KEYS or last.endswith("_seed")


def configuration(run: Mapping[str, Any]) -> tuple:
    """What makes runs seeds of one configuration: everything but the seed."""
    params = tuple(sorted((k, repr(v)) for k, v in (run.get("params") or {}).items() if not is_seed_key(k)))
    return (run.get("project"), run.get("algorithm"), run.get("framework"), run.get("task"), params)


@dataclass
class Unit:
    """A line in the legend: one run, or a group of seeds of one configuration."""

    index: int
    label: str
    runs: list[dict[str, Any]]
    color: str

    @property
    def css_class(self) -> str:
        return f"c{self.index % len(PALETTE)}"

    @property
    def is_group(self) -> bool:
        return len(self.runs) > 1


def hyperparameter_diff(runs: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for keys whose values differ between the runs (missing counts as different), and the same keys."""
    fields = [("algorithm", "algorithm"), ("framework", "framework"), ("task", "task"), ("project", "project")]
    keys = sorted({k for r in runs for k in (r.get("params") or {})})
    differing, same = [], []
    missing = object()
    for label, f in fields:
        values = [r.get(f) for r in runs]
        if len({repr(v) for v in values}) > 1:
            differing.append({"key": label, "values": values, "kind": "run", "present": [True] * len(values)})
    for k in keys:
        values = [(r.get("params") or {}).get(k, missing) for r in runs]
        if len({repr(v) if v is not missing else "<missing>" for v in values}) > 1:
            differing.append({"key": k, "kind": "param", "present": [v is not missing for v in values],
                              "values": [None if v is missing else v for v in values]})
        else:
            same.append(k)
    # Mark, per row, which cells differ from the first run's value: those get highlighted.
    for row in differing:
        base = (row["present"][0], repr(row["values"][0]))
        row["differs"] = [(p, repr(v)) != base for p, v in zip(row["present"], row["values"])]
    return differing, same


def build_units(runs: Sequence[dict[str, Any]], group_seeds: bool) -> list[Unit]:
    """Runs grouped into seed groups (when asked and when a configuration has several runs)."""
    buckets: dict[tuple, list[dict[str, Any]]] = {}
    order: list[tuple] = []
    for r in runs:
        key = configuration(r) if group_seeds else (r["id"],)
        if key not in buckets:
            buckets[key] = []
            order.append(key)
        buckets[key].append(r)
    # Label groups by what distinguishes their configuration from the others.
    reps = [buckets[k][0] for k in order]
    diff_rows, _ = hyperparameter_diff(reps) if len(reps) > 1 else ([], [])
    distinguishing = [row["key"] for row in diff_rows if not is_seed_key(row["key"])][:3]
    units = []
    for i, key in enumerate(order):
        members = buckets[key]
        if len(members) == 1:
            label = members[0]["name"]
        else:
            label = f"{_group_name(members, distinguishing)} ({len(members)} seeds)"
        units.append(Unit(index=i, label=label, runs=members, color=PALETTE[i % len(PALETTE)]))
    return units


def _group_name(members: Sequence[Mapping[str, Any]], distinguishing: Sequence[str]) -> str:
    """``sb3-cartpole-s*`` from the runs' common name prefix, else the distinguishing settings."""
    names = [m["name"] for m in members]
    prefix = os.path.commonprefix(names)
    if len(prefix) >= 4:
        return prefix.rstrip("-_ .") + "*" if prefix not in names else prefix
    rep = members[0]
    bits = []
    for k in distinguishing[:2]:
        v = rep.get(k) if k in ("algorithm", "framework", "task", "project") else (rep.get("params") or {}).get(k)
        bits.append(f"{k.rsplit('.', 1)[-1]}={_short(v)}")
    return ", ".join(bits) or names[0]


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    text = str(v)
    return text if len(text) <= 24 else text[:21] + "..."


@dataclass
class Member:
    run: dict[str, Any]
    series: dict[str, Any]   # run_detail series entry


@dataclass
class MetricComparison:
    """One canonical metric across the selected runs, with its semantic check."""

    name: str
    definition: dict[str, Any] | None
    members: list[Member]
    missing: list[dict[str, Any]]
    semantic_groups: list[tuple[tuple, list[Member]]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def layer(self) -> str:
        return (self.definition or {}).get("layer") or "diagnostic"

    @property
    def normalizable(self) -> bool:
        return (self.definition or {}).get("quantity") in NORMALIZED_QUANTITIES


def _semantic_tuple(sem: Mapping[str, Any]) -> tuple:
    return tuple(sem.get(f) for f in SEMANTIC_FIELDS)


def pick_series(detail: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per canonical name, the run's series with most points (as ``canonical_curves`` picks)."""
    out: dict[str, dict[str, Any]] = {}
    for s in sorted(detail.get("series") or [], key=lambda s: (-(s.get("count") or 0), s["key"])):
        name = s.get("definition")
        if name and name not in out:
            out[name] = s
    return out


def compare_metrics(details: Sequence[dict[str, Any]],
                    definitions: Mapping[str, dict[str, Any]]) -> list[MetricComparison]:
    """Every canonical metric any selected run has, with semantic differences found.

    Semantics are compared group against group: each distinct combination (estimator,
    averaging, normalisation axis, logging point) is a group; a warning names each field
    on which a group differs from the first, and which runs are on each side.
    """
    picked = [(d, pick_series(d)) for d in details]
    names = sorted({n for _, p in picked for n in p},
                   key=lambda n: (_LAYER_ORDER.get((definitions.get(n) or {}).get("layer"), 3), n))
    out = []
    for name in names:
        members = [Member(d, p[name]) for d, p in picked if name in p]
        missing = [d for d, p in picked if name not in p]
        groups: dict[tuple, list[Member]] = {}
        for m in members:
            groups.setdefault(_semantic_tuple(m.series.get("semantics") or {}), []).append(m)
        comp = MetricComparison(name=name, definition=definitions.get(name), members=members, missing=missing,
                                semantic_groups=list(groups.items()))
        if len(groups) > 1:
            (base_key, base_members), *others = comp.semantic_groups
            base_sem = base_members[0].series.get("semantics") or {}
            for _, other_members in others:
                sem = other_members[0].series.get("semantics") or {}
                diffs = semantic_differences(base_sem, sem)
                who = f"{_names(base_members)} vs {_names(other_members)}"
                comp.warnings.append(f"{'; '.join(diffs)} ({who})")
        out.append(comp)
    return out


_LAYER_ORDER = {"objective": 0, "constraint": 1, "diagnostic": 2}


def _names(members: Sequence[Member], limit: int = 3) -> str:
    names = [m.run["name"] for m in members]
    text = ", ".join(names[:limit])
    return text + (f" +{len(names) - limit}" if len(names) > limit else "")


def _window(text: str) -> tuple[str, int, int]:
    """``RUN:FIRST:LAST`` (steps) -> (run, first, last)."""
    run, _, rest = text.rpartition(":")
    run, _, first = run.rpartition(":")
    try:
        lo, hi = int(first), int(rest)
    except ValueError:
        lo = hi = -1
    if not run or lo < 0 or hi <= lo:
        raise InputError(f"win must be RUN:FIRST_STEP:LAST_STEP with 0 <= FIRST_STEP < LAST_STEP; got {text!r}")
    return run, lo, hi


def run_length(detail: Mapping[str, Any]) -> float:
    """The last step the run reached over all its series (for fraction-of-training alignment)."""
    steps = [s.get("last_step") for s in detail.get("series") or [] if s.get("last_step") is not None]
    return float(max(steps)) if steps else 1.0


@dataclass(frozen=True)
class CompareOptions:
    align: str = "step"
    group: bool = True
    band: str = "minmax"
    norm: str = "zscore"
    #: (run id, first step, last step): draw only that part of the run, on the fraction of it
    #: (the windows where an anywhere search matched, laid over the query's)
    windows: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> CompareOptions:
        group_raw = (args.get("group") or "1").strip().lower()
        raw_windows = args.getlist("win") if hasattr(args, "getlist") else [w for w in [args.get("win")] if w]
        return cls(
            align=choice_arg(args, "align", ALIGNMENTS, "step"),
            group=group_raw not in ("0", "off", "false", "no"),
            band=choice_arg(args, "band", BANDS, "minmax"),
            norm=choice_arg(args, "norm", NORMALIZATIONS, "zscore"),
            windows=tuple(_window(w) for w in raw_windows),
        )

    def key(self) -> tuple:
        return (self.align, self.group, self.band, self.norm, self.windows)

    def query(self) -> dict[str, str]:
        out = {}
        if self.align != "step":
            out["align"] = self.align
        if not self.group:
            out["group"] = "0"
        if self.band != "minmax":
            out["band"] = self.band
        if self.norm != "zscore":
            out["norm"] = self.norm
        return out


def group_band(prepared: Sequence[Prepared], band: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean of the members' smoothed curves on a common grid, with min-max or +-std band."""
    curves = [(p.line_x, p.smooth if p.smooth is not None else p.line_y) for p in prepared if len(p.x)]
    if not curves:
        empty = np.empty(0)
        return empty, empty, empty, empty
    lo = min(float(x[0]) for x, _ in curves)
    hi = max(float(x[-1]) for x, _ in curves)
    grid = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.array([lo])
    stack = np.full((len(curves), len(grid)), np.nan)
    for i, (x, y) in enumerate(curves):
        inside = (grid >= x[0]) & (grid <= x[-1])
        stack[i, inside] = np.interp(grid[inside], x.astype(np.float64), y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(stack, axis=0)
        if band == "std":
            std = np.nanstd(stack, axis=0)
            low, high = mean - std, mean + std
        else:
            low, high = np.nanmin(stack, axis=0), np.nanmax(stack, axis=0)
    ok = np.isfinite(mean)
    return grid[ok], mean[ok], low[ok], high[ok]


LINESTYLES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)))


def crop_prepared(p: Prepared, lo: float, hi: float) -> Prepared:
    """``p`` within ``lo <= x <= hi`` (x in the plot's units), smoothing kept as computed on the whole."""
    keep = (p.x >= lo) & (p.x <= hi)
    line_x = p.line_x
    lkeep = (line_x >= lo) & (line_x <= hi)
    return Prepared(x=p.x[keep], y=p.y[keep], smooth=None if p.smooth is None else p.smooth[lkeep],
                    nonfinite_x=p.nonfinite_x[(p.nonfinite_x >= lo) & (p.nonfinite_x <= hi)], total=p.total,
                    window=p.window, steps=p.steps, values=p.values,
                    smooth_x=None if p.smooth_x is None else p.smooth_x[lkeep],
                    step_y=None if p.step_y is None else p.step_y[lkeep])


def overlay_spec(comp: MetricComparison, data: Mapping[str, SeriesData], units: Sequence[Unit],
                 opts: CompareOptions, smooth: SmoothOptions, *, normalized: bool = False,
                 x_range: tuple[float, float] | None = None) -> tuple[PlotSpec, dict]:
    """The overlay of one metric: per unit a raw+smoothed curve or a seed group's mean and band.

    ``data`` maps run id -> that run's series for this metric (raw values; sign applied here).
    ``x_range`` keeps only that part of the x-axis (a zoomed interactive plot), after smoothing.
    Returns the spec and the full-resolution export table.
    """
    window = smooth.window_for(comp.definition)
    norm = opts.norm if normalized else None
    sem_index = {id(m): gi for gi, (_, ms) in enumerate(comp.semantic_groups) for m in ms}
    member_by_run = {m.run["id"]: m for m in comp.members}
    windows = {run: (lo, hi) for run, lo, hi in opts.windows}
    n_traces = sum(1 for u in units for r in u.runs if r["id"] in member_by_run) or 1
    per_trace = max(300, smooth.points // n_traces)
    traces: list[Trace] = []
    ys: list[np.ndarray] = []
    total_in = total_out = 0
    export: dict[str, list] = {"run_id": [], "run": [], "step": [], "x": [], "value": [], "smoothed": []}
    for unit in units:
        # Within a unit, members with different semantics are never averaged together.
        by_sem: dict[int, list[tuple[Member, Prepared]]] = {}
        for r in unit.runs:
            m = member_by_run.get(r["id"])
            if m is None or r["id"] not in data:
                continue
            series, offset = data[r["id"]], 0.0
            if r["id"] in windows:
                offset, last = windows[r["id"]]
                scale = float(last - offset)
                series = series.between(offset, last)
            else:
                scale = run_length(r) if opts.align == "fraction" or windows else None
            p = prepare(series, m.series.get("sign") or 1.0, smooth.method, window, x_scale=scale,
                        normalize=norm, x_offset=offset)
            _extend_export(export, r, p, scale, offset)
            if x_range is not None:
                p = crop_prepared(p, *x_range)
            by_sem.setdefault(sem_index.get(id(m), 0), []).append((m, p))
        for gi, items in sorted(by_sem.items()):
            style = LINESTYLES[gi % len(LINESTYLES)]
            suffix = _semantic_suffix(comp, gi)
            if len(items) > 1:
                gx, mean, low, high = group_band([p for _, p in items], opts.band)
                label = f"{unit.label}{suffix}" if len(items) == len(unit.runs) else \
                    f"{unit.label.rsplit(' (', 1)[0]} ({len(items)} seeds){suffix}"
                traces.append(Trace(label=label, color=unit.color, smooth_x=gx, smooth_y=mean, band_x=gx,
                                    band_low=low, band_high=high, linestyle=style))
                ys += [low, high]
                total_in += sum(len(p.x) for _, p in items)
                total_out += len(gx)
            else:
                m, p = items[0]
                raw_x, raw_y, sx, sy = reduce_for_display(p, per_trace)
                traces.append(Trace(label=m.run["name"] + suffix, color=unit.color, raw_x=raw_x, raw_y=raw_y,
                                    smooth_x=sx, smooth_y=sy, linestyle=style,
                                    nonfinite_x=thin_nonfinite(p.nonfinite_x), raw_markers=p.repeats))
                ys += [p.y, p.smooth]
                total_in += len(p.x)
                total_out += len(raw_x)
    notes = []
    if total_out < total_in:
        notes.append(f"downsampled {fmt_count(total_in)} -> {fmt_count(total_out)} points")
    if any(t.band_x is not None for t in traces):
        notes.append("seed groups: mean, band " + ("\u00b1 1 std" if opts.band == "std" else "min-max"))
    if normalized:
        notes.append(NORMALIZATION_LABELS[opts.norm])
    healthy = None
    if comp.definition and not normalized:
        tasks = {m.run.get("task") for m in comp.members}
        healthy = healthy_range_for(comp.definition, tasks.pop() if len(tasks) == 1 else None)
    spec = PlotSpec(
        traces=traces, healthy=healthy, ylim=y_limits(ys, smooth.ignore_outliers), notes=notes,
        warnings=[f"not comparable: {w}" for w in comp.warnings], legend=True, width=6.4, height=3.1,
        xlabel="fraction of the matched window" if windows else
        "fraction of training" if opts.align == "fraction" else "step",
        fraction_axis=opts.align == "fraction" or bool(windows),
        ylabel=NORMALIZATION_LABELS[opts.norm] if normalized else (comp.definition or {}).get("unit") or None,
    )
    return spec, export


def _semantic_suffix(comp: MetricComparison, gi: int) -> str:
    """`` [k1]``: the semantic values that set this group apart from the other groups."""
    if len(comp.semantic_groups) <= 1:
        return ""
    keys = [k for k, _ in comp.semantic_groups]
    varying = [i for i in range(len(SEMANTIC_FIELDS)) if len({k[i] for k in keys}) > 1]
    return " [" + ", ".join(str(keys[gi][i] or "unspecified") for i in varying) + "]"


def _extend_export(export: dict[str, list], run: Mapping[str, Any], p: Prepared, scale: float | None,
                   offset: float = 0.0) -> None:
    rows = export_rows(p)
    n = len(rows["step"])
    export["run_id"] += [run["id"]] * n
    export["run"] += [run["name"]] * n
    export["step"] += rows["step"]
    export["x"] += ((p.steps - offset) / scale).tolist() if scale else rows["step"]
    export["value"] += rows["value"]
    export["smoothed"] += rows["smoothed"]


def finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v

