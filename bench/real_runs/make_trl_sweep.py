"""Train the labelled real TRL GRPO run set: TRL's own ``GRPOTrainer`` on a tiny task, over a sweep.

The model, tokenizer and prompts are those of ``tests/data/real/make/trl_grpo_tiny.py`` (a random
2-layer Qwen2 built from a config, a character-level tokenizer, one-digit additions), built
locally with nothing downloaded. So that healthy runs exist beside the failures, the model first
gets a short supervised start (:func:`pretrain`: answers in the format, right 30% of the time), as
GRPO starts from a model that already answers; then two rewards, weighted 1 and 0.5:

* ``accuracy_reward``: 1.0 when the completion is the expected sum;
* ``format_reward``: 1.0 when the completion is a number that ended with its end-of-sequence token
  (not cut at the maximum length).

Each run writes the Trainer's TensorBoard layout, ``runs/<time>_<host>/events.out.tfevents.*``
(with the ``args`` text summary holding the GRPOConfig), and ``config.json`` (the GRPOConfig) into
``tests/data/real/trl_sweep/<run>/``; no checkpoint is kept. A run whose directory already holds
an event file is skipped.

The sweep is in :data:`SWEEP`. Labels are *not* written here: they come from looking at the
curves afterwards (``labels.yaml`` beside the runs, with the observation per run).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/real_runs/make_trl_sweep.py [--only NAME ...] [--list]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "real" / "trl_sweep"
sys.path.insert(0, str(ROOT / "tests" / "data" / "real" / "make"))

#: Settings every run shares (GRPOConfig arguments); a run's own settings go on top.
BASE = {"max_steps": 300, "learning_rate": 3e-3, "beta": 0.04, "num_iterations": 1, "epsilon": 0.2,
        "max_completion_length": 8, "temperature": 1.0, "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2, "num_generations": 4, "reward_weights": [1.0, 0.5]}

#: The supervised start: its length, and how often its answers are right.
PRETRAIN_STEPS = 400
PRETRAIN_RIGHT = 0.3

#: name -> (seed, GRPOConfig arguments on top of BASE)
SWEEP: dict[str, tuple[int, dict]] = {
    # BASE as it is: a learning rate of 3e-3 (it suits a 2-layer model), beta 0.04, groups of 4, 8 tokens (TRL 1.16.0's
    # defaults: learning rate 1e-6, beta 0, groups of 8, 512 tokens).
    **{f"default_s{s}": (s, {}) for s in range(1, 7)},
    # Learning rates 3x-10x high and 30x-100x low.
    "lr_1e-2_s7": (7, {"learning_rate": 1e-2}),
    "lr_1e-2_s8": (8, {"learning_rate": 1e-2}),
    "lr_3e-2_s9": (9, {"learning_rate": 3e-2}),
    "lr_1e-4_s10": (10, {"learning_rate": 1e-4}),
    "lr_3e-5_s11": (11, {"learning_rate": 3e-5}),
    "lr_6e-3_s20": (20, {"learning_rate": 6e-3}),
    # The KL penalty off and 25x.
    "beta_0_s12": (12, {"beta": 0.0}),
    "beta_1_s13": (13, {"beta": 1.0}),
    # Several policy updates per batch, with TRL's clip range and a tenth of it.
    "iters_4_s14": (14, {"num_iterations": 4}),
    "iters_4_eps_0.02_s15": (15, {"num_iterations": 4, "epsilon": 0.02}),
    # A maximum completion length that cuts the answer or its end-of-sequence token.
    "maxlen_1_s16": (16, {"max_completion_length": 1}),
    "maxlen_2_s19": (19, {"max_completion_length": 2}),
    # Sampling temperature low and high.
    "temp_0.3_s17": (17, {"temperature": 0.3}),
    "temp_1.5_s18": (18, {"temperature": 1.5}),
    # A second held-out batch, placed before it was trained: new seeds of the families above at new strengths,
    # and groups of 2 (the group size the families above do not vary).
    **{f"default_s{s}": (s, {}) for s in range(21, 24)},
    "lr_2e-2_s24": (24, {"learning_rate": 2e-2}),
    "lr_1e-3_s25": (25, {"learning_rate": 1e-3}),
    "beta_0.4_s26": (26, {"beta": 0.4}),
    "iters_2_eps_0.05_s27": (27, {"num_iterations": 2, "epsilon": 0.05}),
    "maxlen_2_s28": (28, {"max_completion_length": 2}),
    "temp_0.5_s29": (29, {"temperature": 0.5}),
    "groups_2_s30": (30, {"num_generations": 2}),
    # A third held-out batch, placed before it was trained, after every change prompted by the second had landed: new
    # seeds, new strengths (learning rate 17x high and 10x low, beta 50x, three updates per batch with TRL's epsilon,
    # temperature 0.7), and settings that should stay healthy (groups of 8, a maximum length of 4 tokens).
    **{f"default_s{s}": (s, {}) for s in range(31, 34)},
    "lr_5e-2_s34": (34, {"learning_rate": 5e-2}),
    "lr_3e-4_s35": (35, {"learning_rate": 3e-4}),
    "beta_2_s36": (36, {"beta": 2.0}),
    "iters_3_s37": (37, {"num_iterations": 3}),
    "temp_0.7_s38": (38, {"temperature": 0.7}),
    "groups_8_s39": (39, {"num_generations": 8}),
    "maxlen_4_s40": (40, {"max_completion_length": 4}),
    # A fourth held-out batch, placed before it was trained, after the change to the KL to the reference above the
    # default high (DIAGNOSIS_VERSION 32): new seeds, new strengths (learning rate 5x high and 6x low, beta 0.1 and
    # 0.01, two updates per batch, temperature 1.2, a maximum length of 3 tokens).
    **{f"default_s{s}": (s, {}) for s in range(41, 44)},
    "lr_1.5e-2_s44": (44, {"learning_rate": 1.5e-2}),
    "lr_5e-4_s45": (45, {"learning_rate": 5e-4}),
    "beta_0.1_s46": (46, {"beta": 0.1}),
    "beta_0.01_s47": (47, {"beta": 0.01}),
    "iters_2_s48": (48, {"num_iterations": 2}),
    "temp_1.2_s49": (49, {"temperature": 1.2}),
    "maxlen_3_s50": (50, {"max_completion_length": 3}),
    # A fifth held-out batch, placed before it was trained, after the change to the KL to the reference's first
    # updates and one-batch jumps during a drift (DIAGNOSIS_VERSION 33): new seeds of families that failed before
    # (learning rate 2.7x high, four updates per batch, temperature 0.5, no KL penalty) and of ones that did not.
    **{f"default_s{s}": (s, {}) for s in range(51, 54)},
    "lr_8e-3_s54": (54, {"learning_rate": 8e-3}),
    "lr_2e-4_s55": (55, {"learning_rate": 2e-4}),
    "beta_0.2_s56": (56, {"beta": 0.2}),
    "beta_0_s57": (57, {"beta": 0.0}),
    "iters_4_s58": (58, {"num_iterations": 4}),
    "temp_0.5_s59": (59, {"temperature": 0.5}),
    "groups_2_s60": (60, {"num_generations": 2}),
    # A sixth held-out batch, placed before it was trained, before the change that names the one setting a run has
    # apart from the task's healthy runs (DIAGNOSIS_VERSION 35): settings 1.5x-2.5x off the healthy runs' (learning
    # rate 1.7x high and 2x low, temperature 0.6 and 0.4, beta 0.08, two updates per batch), one far off (learning
    # rate 4x high) and new default seeds.
    **{f"default_s{s}": (s, {}) for s in range(61, 64)},
    "lr_5e-3_s64": (64, {"learning_rate": 5e-3}),
    "lr_1.5e-3_s65": (65, {"learning_rate": 1.5e-3}),
    "temp_0.6_s66": (66, {"temperature": 0.6}),
    "temp_0.4_s67": (67, {"temperature": 0.4}),
    "beta_0.08_s68": (68, {"beta": 0.08}),
    "iters_2_s69": (69, {"num_iterations": 2}),
    "lr_1.2e-2_s70": (70, {"learning_rate": 1.2e-2}),
}


def accuracy_reward(completions, answer, **kwargs):
    """1.0 when the completion is the expected sum."""
    return [1.0 if c.strip() == ans else 0.0 for c, ans in zip(completions, answer)]


def make_format_reward(eos_id: int):
    def format_reward(completions, completion_ids, **kwargs):
        """1.0 when the completion is a number that ended with the end-of-sequence token (not cut)."""
        return [1.0 if c.strip().isdigit() and ids and ids[-1] == eos_id else 0.0
                for c, ids in zip(completions, completion_ids)]
    return format_reward


def pretrain(model, tokenizer, seed: int, steps: int = PRETRAIN_STEPS) -> None:
    """A short supervised start, as GRPO starts from a model that already answers in the format: the
    prompts followed by a one-digit answer and the end-of-sequence token, the answer right with
    probability ``PRETRAIN_RIGHT`` and a random digit otherwise."""
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        texts = []
        for _ in range(32):
            a, b = rng.randint(0, 4), rng.randint(0, 4)
            ans = a + b if rng.random() < PRETRAIN_RIGHT else rng.randint(0, 9)
            texts.append(f"what is {a}+{b}? {ans}")
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        ids = torch.cat([batch.input_ids, torch.full((len(texts), 1), tokenizer.pad_token_id)], dim=1)
        mask = torch.cat([batch.attention_mask, torch.zeros(len(texts), 1, dtype=torch.long)], dim=1)
        ends = batch.attention_mask.sum(1)
        ids[torch.arange(len(texts)), ends] = tokenizer.eos_token_id
        mask[torch.arange(len(texts)), ends] = 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def train(name: str, seed: int, settings: dict, out: Path = OUT) -> Path:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_tiny import build_dataset, build_model, build_tokenizer

    config = {**BASE, **settings}
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        # The trainer loads its reference model by path when beta > 0, so the random model is saved first.
        model_dir = f"{tmp}/model"
        model = build_model(tokenizer)
        pretrain(model, tokenizer, seed)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        args = GRPOConfig(output_dir=f"{tmp}/out", report_to=["tensorboard"], logging_steps=1, save_strategy="no",
                          use_cpu=True, bf16=False, seed=seed, dataloader_num_workers=0, **config)
        trainer = GRPOTrainer(
            model=model_dir,
            reward_funcs=[accuracy_reward, make_format_reward(tokenizer.eos_token_id)],
            args=args, train_dataset=build_dataset(64, seed), processing_class=tokenizer)
        trainer.train()
        dest = out / name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(f"{tmp}/out/runs", dest / "runs")
        (dest / "config.json").write_text(json.dumps(json.loads(args.to_json_string()), indent=2, sort_keys=True))
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="train only these runs")
    ap.add_argument("--list", action="store_true", help="list the sweep and exit")
    ap.add_argument("--out", type=Path, default=OUT, help="where the runs go (default: the labelled set)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="train one run NAME (--only NAME) with these settings instead of the sweep's (a trial)")
    args = ap.parse_args(argv)
    names = args.only or list(SWEEP)
    if args.list:
        for name in names:
            seed, settings = SWEEP[name]
            print(f"{name:<26} seed {seed} {settings}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    trial = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    trial_seed = int(trial.pop("seed", 0))
    for name in names:
        seed, settings = SWEEP[name] if not args.set else (trial_seed, trial)
        if any((args.out / name).rglob("events.out.tfevents.*")):
            print(f"{name}: already trained, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        train(name, seed, settings, args.out)
        print(f"{name}: trained in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
