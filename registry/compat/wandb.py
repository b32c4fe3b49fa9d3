"""A W&B-style entry point for training scripts: ``import registry.compat.wandb as wandb``.

Only the subset an RL training script uses (CleanRL, OpenRLHF, custom loops) is here:

- ``wandb.init(project=, name=, config=, tags=, group=, notes=, mode=...)`` -> ``Run``; other
  keyword arguments W&B accepts (``entity``, ``sync_tensorboard``, ``save_code``, ``reinit``...)
  are accepted and ignored. ``mode="disabled"`` records nothing.
- ``wandb.config`` / ``run.config``: attribute and item access, ``update(dict)``; an
  ``argparse.Namespace`` is taken as its ``vars``. Stored as the run's hyperparameters when the run
  is created, at the first ``log`` (so ``config.update`` right after ``init`` is kept; a change
  after the first ``log`` is not, and says so once).
- ``wandb.log(data, step=None, commit=None)``: nested dicts become ``a/b`` keys; numbers (and
  NumPy/torch scalars) are logged, media and text skipped. Without ``step`` the run's own counter
  is used and advanced by each committed call, as W&B does; a step below the counter is skipped.
- ``wandb.define_metric(name, step_metric=, summary=, goal=, hidden=, **semantics)``: ``name`` may
  end in ``*``. A key with a ``step_metric`` is logged at that metric's value (from the same call,
  else its last value): ``define_metric("train/*", step_metric="train/global_step")`` is how
  OpenRLHF puts its curves on the global step. ``goal``/``summary``/``step_metric`` are stored as
  hyperparameters ``wandb.define_metric.<name>.<field>``; the registry's semantic fields
  (``kl_estimator="k1"``, ``averaging="token"``, ``definition="kl_old_mean"``...) are sent as the
  series' semantics, as ``rlreg register --semantics`` does.
- ``run.summary[...] = x`` / ``run.summary.update(...)``: numeric values become the run's scores
  when it finishes.
- ``wandb.finish(exit_code=None)``: a non-zero exit code marks the run crashed. A script that ends
  without it gets ``finished`` (``crashed`` on an uncaught exception).
- ``wandb.Image``, ``Histogram``, ``Table``, ``Video``, ``watch``, ``save``, ``alert``: accepted, no-ops.

Where the run goes: as every integration, ``RLREG_URL`` + ``RLREG_TOKEN``, else
``RLREG_DATABASE_URL``, else ``./rlregistry.db`` (see ``registry.integrations.stream``).
"""
from __future__ import annotations

import fnmatch
import logging
from typing import Any, Mapping, Sequence

from config import wandb_settings
from registry.core.hparams import flatten
from registry.integrations.stream import StreamingRun, metric_value
from registry.core.semantics import SEMANTIC_FIELDS

_logger = logging.getLogger("registry.integrations")

run: Run | None = None
config: Config | None = None
summary: Summary | None = None


class Config(dict):
    """Hyperparameters with attribute access (``wandb.config.learning_rate``)."""

    def __init__(self, owner: Run | None = None, values: Mapping[str, Any] | None = None):
        super().__init__(values or {})
        object.__setattr__(self, "_owner", owner)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if self._owner is not None:
            self._owner._config_changed()

    def update(self, values: Any = None, allow_val_change: bool | None = None, **kwargs: Any) -> None:  # noqa: ARG002
        for key, value in {**_as_dict(values), **kwargs}.items():
            self[key] = value

    def setdefaults(self, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            self.setdefault(key, value)

    def as_dict(self) -> dict[str, Any]:
        return dict(self)


class Summary(dict):
    """``run.summary``: values set here become the run's scores (the numeric ones)."""

    def update(self, values: Any = None, **kwargs: Any) -> None:
        super().update({**_as_dict(values), **kwargs})


class Run:
    """What ``wandb.init`` returns: ``log``, ``define_metric``, ``config``, ``summary``, ``finish``."""

    def __init__(self, *, project: str | None, name: str | None, config: Any, tags: Sequence[str] | None,
                 group: str | None, job_type: str | None, notes: str | None, disabled: bool,
                 run_options: Mapping[str, Any]):
        env = wandb_settings()
        self.project = project or env["project"] or "default"
        self.name = name or env["name"]
        self.tags = list(tags or [])
        if group:
            self.tags.append(f"group:{group}")
        if job_type:
            self.tags.append(f"job_type:{job_type}")
        self.notes = notes
        self.disabled = disabled
        self.config = Config(self, _as_dict(config))
        self.summary = Summary()
        self.step = 0
        self._metrics: dict[str, dict[str, Any]] = {}   # define_metric rules by name (glob)
        self._last: dict[str, float] = {}               # last value of each key, for step metrics
        self._run_options = dict(run_options)
        self._stream: StreamingRun | None = None
        self._finished = False
        self._warned_config = False

    @property
    def id(self) -> str | None:
        return self._stream.id if self._stream else None

    # --- W&B API -------------------------------------------------------------------

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        if self.disabled or self._finished:
            return
        flat = flatten(data, sep="/")
        if step is not None:
            step = int(step)
            if step < self.step:
                _logger.warning("rlregistry: wandb.log at step %d after step %d is skipped (as W&B does)",
                            step, self.step)
                return
            self.step = step
        stream = self._ensure_stream()
        by_step: dict[int, dict[str, Any]] = {}
        for key, value in flat.items():
            rule = self._rule(key)
            step_metric = rule.get("step_metric") if rule else None
            at = self.step
            if step_metric and step_metric != key:
                source = flat.get(step_metric, self._last.get(step_metric))
                try:
                    at = int(source) if source is not None else self.step
                except (TypeError, ValueError):
                    at = self.step
            by_step.setdefault(at, {})[key] = value
        for at, metrics in sorted(by_step.items()):
            stream.log(at, metrics)
        for key, value in flat.items():
            number = metric_value(value)
            if number is not None:
                self._last[key] = number
        if commit is None:
            commit = step is None
        if commit:
            self.step += 1

    def define_metric(self, name: str, step_metric: str | None = None, *, summary: str | None = None,
                      goal: str | None = None, hidden: bool | None = None, step_sync: bool | None = None,
                      **semantics: Any) -> None:
        bad = set(semantics) - set(SEMANTIC_FIELDS) - {"definition"}
        if bad:
            raise TypeError(f"define_metric: unknown argument(s) {', '.join(sorted(bad))}")
        self._metrics[name] = {"step_metric": step_metric, "summary": summary, "goal": goal, "hidden": hidden,
                               "semantics": semantics}
        hints = {k: v for k, v in (("step_metric", step_metric), ("summary", summary), ("goal", goal)) if v}
        if hints:
            self.config.setdefault("wandb", {}).setdefault("define_metric", {})[name] = hints
            self._config_changed()

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:  # noqa: ARG002
        if self.disabled or self._finished:
            return
        self._finished = True
        stream = self._ensure_stream()
        scores = {k: metric_value(v) for k, v in self.summary.items() if not isinstance(v, bool) and metric_value(v) is not None}
        if scores:
            stream.set_outcome(scores=scores)
        stream.finish("crashed" if exit_code else "finished")
        _forget(self)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        self.finish(exit_code=1 if exc_type else 0)

    # no-ops a training script may call
    def watch(self, *args: Any, **kwargs: Any) -> None:
        return None

    def save(self, *args: Any, **kwargs: Any) -> None:
        return None

    def alert(self, *args: Any, **kwargs: Any) -> None:
        return None

    def log_artifact(self, *args: Any, **kwargs: Any) -> None:
        return None

    # --- internals -----------------------------------------------------------------

    def _rule(self, key: str) -> dict[str, Any] | None:
        if key in self._metrics:
            return self._metrics[key]
        for pattern, rule in self._metrics.items():
            if "*" in pattern and fnmatch.fnmatchcase(key, pattern):
                return rule
        return None

    def _ensure_stream(self) -> StreamingRun:
        if self._stream is None:
            semantics = {}
            for pattern, rule in self._metrics.items():
                if rule["semantics"] and "*" not in pattern:
                    semantics[pattern] = dict(rule["semantics"])
            self._stream = StreamingRun(
                self.name or f"{self.project}-run", project=self.project, params=dict(self.config),
                tags=self.tags, semantics=semantics, **self._run_options)
            self._stream.finish_at_exit("finished")
            self.name = self._stream.spec["name"]
        return self._stream

    def _config_changed(self) -> None:
        if self._stream is not None and not self._warned_config:
            self._warned_config = True
            _logger.warning("rlregistry: config changed after the first log; the run keeps the config it started with")


def init(project: str | None = None, name: str | None = None, config: Any = None, tags: Sequence[str] | None = None,
         group: str | None = None, job_type: str | None = None, notes: str | None = None, mode: str | None = None,
         *, db: str | None = None, url: str | None = None, token: str | None = None, **ignored: Any) -> Run:
    """Start a run (W&B's signature; ``db``/``url``/``token`` choose the registry, else the environment)."""
    if run is not None and not run._finished:
        run.finish()
    disabled = (mode or wandb_settings()["mode"]) == "disabled"
    options = {k: v for k, v in (("db", db), ("url", url), ("token", token)) if v}
    new = Run(project=project, name=name, config=config, tags=tags, group=group, job_type=job_type, notes=notes,
              disabled=disabled, run_options=options)
    _bind(new)
    return new


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    if run is None:
        raise RuntimeError("call wandb.init() before wandb.log()")
    run.log(data, step=step, commit=commit)


def define_metric(name: str, step_metric: str | None = None, **kwargs: Any) -> None:
    if run is None:
        raise RuntimeError("call wandb.init() before wandb.define_metric()")
    run.define_metric(name, step_metric, **kwargs)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    if run is not None:
        run.finish(exit_code=exit_code, quiet=quiet)


def watch(*args: Any, **kwargs: Any) -> None:
    return None


def save(*args: Any, **kwargs: Any) -> None:
    return None


def alert(*args: Any, **kwargs: Any) -> None:
    return None


class _Media:
    """Images, histograms, tables and videos are accepted and not stored (not metrics)."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass


Image = Histogram = Table = Video = Audio = _Media


def _bind(new: Run) -> None:
    global run, config, summary
    run, config, summary = new, new.config, new.summary


def _forget(finished: Run) -> None:
    global run, config, summary
    if run is finished:
        run, config, summary = None, None, None


def _as_dict(values: Any) -> dict[str, Any]:
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return dict(values)
    if hasattr(values, "__dict__"):  # argparse.Namespace, a dataclass instance
        return dict(vars(values))
    raise TypeError(f"config must be a mapping or a namespace, got {type(values).__name__}")
