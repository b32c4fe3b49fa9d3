"""Hugging Face transformers / TRL: a ``TrainerCallback`` that streams the run into the registry.

    from registry.integrations.transformers import RegistryCallback
    trainer = GRPOTrainer(..., callbacks=[RegistryCallback(project="math", tags=["sweep-3"])])

- ``on_train_begin`` creates the run: every field of the TrainingArguments (for TRL that object
  *is* the trainer's config, ``GRPOConfig`` etc., a TrainingArguments subclass, so ``beta``,
  ``num_generations``, ``loss_type``, ``scale_rewards`` come with it) and the model config under
  ``model.``; framework ``trl`` when the config class comes from TRL (algorithm from its name:
  ``GRPOConfig`` -> GRPO), else ``transformers``; the packages' versions under ``versions.``.
- ``on_log`` logs every entry at ``state.global_step``. Training keys are kept exactly as the
  Trainer logs them (``loss``, ``reward``, ``kl``, ``rewards/accuracy_reward/mean``: the keys the
  dictionary's TRL aliases name, as in ``trainer_state.json``); ``eval_*`` keys become ``eval/*``
  (as transformers' own ``rewrite_logs`` does for W&B and TensorBoard), so an evaluation loss
  never lands in the training loss's series. The end-of-training summary (``train_runtime``,
  ``train_loss``, ...) becomes the run's scores, as when a ``trainer_state.json`` is registered.
- ``on_save`` records the checkpoint directory at its step; ``on_train_end`` marks the run
  finished. A process that ends without reaching ``on_train_end`` (an exception) marks it crashed.
- Only the world's main process (``state.is_world_process_zero``) creates and writes the run.

The target: ``url=``/``token=`` or ``db=``, else ``RLREG_URL`` + ``RLREG_TOKEN``, else
``RLREG_DATABASE_URL``, else ``./rlregistry.db``. Logging never raises into training (see
``registry.integrations.stream``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from transformers import TrainerCallback

from registry.integrations.stream import StreamingRun
from registry.importers.run_summary import SUMMARY_NAMES

EVAL_PREFIX = "eval_"
TEST_PREFIX = "test_"


def split_logs(logs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics to log as series, end-of-training summary). ``eval_x`` -> ``eval/x``, ``test_x`` -> ``test/x``."""
    metrics: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    is_summary = "train_runtime" in logs
    for key, value in logs.items():
        if is_summary and key in SUMMARY_NAMES:
            summary[key] = value
        elif key.startswith(EVAL_PREFIX):
            metrics["eval/" + key[len(EVAL_PREFIX):]] = value
        elif key.startswith(TEST_PREFIX):
            metrics["test/" + key[len(TEST_PREFIX):]] = value
        else:
            metrics[key] = value
    return metrics, summary


def framework_of(args: Any) -> tuple[str, str | None]:
    """("trl", "GRPO") for a TRL config class, ("transformers", None) for plain TrainingArguments."""
    cls = type(args)
    if cls.__module__.split(".")[0] == "trl":
        name = cls.__name__
        return "trl", (name[: -len("Config")] if name.endswith("Config") else None) or None
    return "transformers", None


def versions(framework: str) -> dict[str, str]:
    import transformers

    out = {"transformers": transformers.__version__}
    if framework == "trl":
        import trl

        out["trl"] = trl.__version__
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:
        pass
    return out


class RegistryCallback(TrainerCallback):
    """Streams a Trainer's (or a TRL trainer's) run into the registry; one line to add."""

    def __init__(self, name: str | None = None, *, project: str = "default", tags: Sequence[str] | None = None,
                 algorithm: str | None = None, task: str | None = None, url: str | None = None,
                 token: str | None = None, db: str | None = None, **stream_options: Any):
        self.name = name
        self.project = project
        self.tags = list(tags or [])
        self.algorithm = algorithm
        self.task = task
        self.target = {"url": url, "token": token, "db": db}
        self.stream_options = stream_options
        self.run: StreamingRun | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        if not state.is_world_process_zero:
            return
        if self.run is not None and not self.run.finished:
            self.run.finish("crashed")  # a second train() after an interrupted one
        framework, algorithm = framework_of(args)
        params: dict[str, Any] = dict(args.to_dict())
        params.pop("hub_token", None)
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            params["model"] = config.to_dict()
        params["versions"] = versions(framework)
        name = self.name or getattr(args, "run_name", None) or Path(args.output_dir or "run").name
        self.run = StreamingRun(
            str(name), project=self.project, algorithm=self.algorithm or algorithm, framework=framework,
            task=self.task, params=params, tags=self.tags, **self.target, **self.stream_options,
        )
        self.run.finish_at_exit("crashed")

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if self.run is None or not state.is_world_process_zero or not logs:
            return
        metrics, summary = split_logs(logs)
        self.run.log(state.global_step, metrics)
        if summary:
            self.run.set_outcome(scores=summary)

    def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.run is None or not state.is_world_process_zero:
            return
        directory = os.path.abspath(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
        self.run.checkpoint(state.global_step, directory)

    def on_train_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.run is None or not state.is_world_process_zero:
            return
        self.run.finish("finished")
