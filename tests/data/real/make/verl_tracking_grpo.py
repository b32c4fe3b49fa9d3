"""Write a verl-format training log with verl's own logger (verl.utils.tracking.Tracking).

The FILE FORMAT is verl's: the `file` backend writes <root>/<project>/<experiment>.jsonl as
{"step": N, "data": {...}} lines and the `console` backend prints "step:N - key:value - ..." lines
(this script's stdout is the console log). The METRIC VALUES come from small synthetic batches: no
model is trained. Where verl has a function that computes a metric, it is called on the synthetic
batch (compute_data_metrics, compute_timing_metrics, compute_throughout_metrics,
compute_grpo_outcome_advantage, the vanilla policy loss, kl_penalty, agg_loss, validation metrics);
the remaining values (grad norm, learning rate, memory, MFU, timings) are made up, under the key
names verl 0.9.1's trainer gives them (trainer/ppo/ray_trainer.py, workers/engine_workers.py,
workers/utils/losses.py).

Usage: VERL_FILE_LOGGER_ROOT=OUT_DIR python verl_tracking_grpo.py OUT_DIR > OUT_DIR/console.log
"""

import json
import sys

import numpy as np
import torch
from omegaconf import OmegaConf

import verl
from verl import DataProto
from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage, get_policy_loss_fn, kl_penalty
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.metric import reduce_metrics
from verl.utils.tracking import Tracking

PROJECT = "verl_grpo_tiny"
EXPERIMENT = "qwen_tiny_gsm8k_grpo"
STEPS = 15
TEST_FREQ = 5
N_PROMPTS, N_SAMPLES = 8, 4
MAX_PROMPT, MAX_RESPONSE = 24, 48
N_GPUS = 8

CONFIG = {
    "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False},
    "actor_rollout_ref": {
        "actor": {
            "use_kl_loss": True,
            "kl_loss_type": "low_var_kl",
            "kl_loss_coef": 0.001,
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0,
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "clip_ratio_c": 3.0,
            "ppo_epochs": 1,
            "ppo_mini_batch_size": 4,
            "optim": {"lr": 1e-6},
        },
        "rollout": {"n": N_SAMPLES, "temperature": 1.0},
    },
    "data": {"max_prompt_length": MAX_PROMPT, "max_response_length": MAX_RESPONSE, "train_batch_size": N_PROMPTS},
    "trainer": {
        "project_name": PROJECT,
        "experiment_name": EXPERIMENT,
        "logger": ["console", "file"],
        "total_training_steps": STEPS,
        "test_freq": TEST_FREQ,
        "n_gpus_per_node": N_GPUS,
        "nnodes": 1,
        "val_before_train": True,
    },
}


def synthetic_batch(rng: np.random.Generator, step: int) -> DataProto:
    """A left-padded prompt / right-padded response batch with outcome scores on the last token."""
    bsz = N_PROMPTS * N_SAMPLES
    prompt_len = rng.integers(8, MAX_PROMPT + 1, size=bsz)
    # responses get longer as training goes on, some hit the limit
    resp_len = np.clip(rng.normal(20 + step, 8, size=bsz).astype(int), 1, MAX_RESPONSE)
    attn = torch.zeros(bsz, MAX_PROMPT + MAX_RESPONSE, dtype=torch.long)
    for i in range(bsz):
        attn[i, MAX_PROMPT - prompt_len[i] : MAX_PROMPT] = 1
        attn[i, MAX_PROMPT : MAX_PROMPT + resp_len[i]] = 1
    response_mask = attn[:, MAX_PROMPT:].clone()
    p_correct = 0.2 + 0.5 * step / STEPS
    scores = (rng.random(bsz) < p_correct).astype(np.float32)
    token_level_scores = torch.zeros(bsz, MAX_RESPONSE)
    token_level_scores[torch.arange(bsz), torch.tensor(resp_len - 1)] = torch.tensor(scores)
    uids = np.array([f"p{step}_{i // N_SAMPLES}" for i in range(bsz)], dtype=object)
    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards=token_level_scores, response_mask=response_mask, index=uids, norm_adv_by_std_in_grpo=True
    )
    old_log_probs = -torch.tensor(rng.gamma(1.0, 0.6, size=(bsz, MAX_RESPONSE)), dtype=torch.float32)
    batch = DataProto.from_dict(
        tensors={
            "prompts": torch.zeros(bsz, MAX_PROMPT, dtype=torch.long),
            "responses": torch.zeros(bsz, MAX_RESPONSE, dtype=torch.long),
            "attention_mask": attn,
            "response_mask": response_mask,
            "token_level_scores": token_level_scores,
            "token_level_rewards": token_level_scores,
            "advantages": advantages,
            "returns": returns,
            "old_log_probs": old_log_probs,
        },
        non_tensors={"uid": uids},
        meta_info={"global_token_num": attn.sum(-1).tolist()},
    )
    return batch


def actor_metrics(rng: np.random.Generator, batch: DataProto, step: int) -> dict:
    """Per-mini-batch actor metrics computed with verl's loss functions, reduced as the trainer does."""
    actor_cfg = OmegaConf.create({**CONFIG["actor_rollout_ref"]["actor"], "global_batch_info": {}})
    policy_loss_fn = get_policy_loss_fn("vanilla")
    response_mask = batch.batch["response_mask"].bool()
    per_mini_batch: dict[str, list] = {}
    mb = CONFIG["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] * N_SAMPLES
    for start in range(0, len(batch), mb):
        sl = slice(start, start + mb)
        old = batch.batch["old_log_probs"][sl]
        log_prob = old + torch.tensor(rng.normal(0.0, 0.05 + 0.01 * step, size=old.shape), dtype=torch.float32)
        ref = old + torch.tensor(rng.normal(0.0, 0.02 * step, size=old.shape), dtype=torch.float32)
        mask = response_mask[sl]
        pg_loss, pg_metrics = policy_loss_fn(
            old_log_prob=old,
            log_prob=log_prob,
            advantages=batch.batch["advantages"][sl],
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=actor_cfg,
            rollout_is_weights=None,
        )
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref, kl_penalty=actor_cfg.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode="token-mean")
        values = {
            **pg_metrics,
            "actor/pg_loss": pg_loss.item(),
            "actor/kl_loss": kl_loss.item(),
            "actor/kl_coef": actor_cfg.kl_loss_coef,
            "actor/loss": (pg_loss + actor_cfg.kl_loss_coef * kl_loss).item(),
        }
        for k, v in values.items():
            per_mini_batch.setdefault(k, []).append(v)
    metrics = reduce_metrics(per_mini_batch)
    # no model is trained: these are made up
    metrics.update(
        {
            "actor/grad_norm": float(rng.gamma(4.0, 0.05)),
            "actor/lr": CONFIG["actor_rollout_ref"]["actor"]["optim"]["lr"],
            "actor/perf/max_memory_allocated_gb": 41.2 + float(rng.normal(0, 0.3)),
            "actor/perf/max_memory_reserved_gb": 52.0,
            "actor/perf/cpu_memory_used_gb": 118.5 + float(rng.normal(0, 1.0)),
            "perf/mfu/actor": 0.31 + float(rng.normal(0, 0.01)),
        }
    )
    return metrics


def validation_metrics(rng: np.random.Generator, step: int) -> dict:
    """verl's own validation reduction (RayPPOTrainer._val_metrics_update, which does not use self)."""
    data_sources, uids, rewards = [], [], []
    for ds, base in (("openai/gsm8k", 0.25), ("lighteval/MATH", 0.1)):
        for q in range(6):
            for _ in range(N_SAMPLES):
                data_sources.append(ds)
                uids.append(f"{ds}-{q}")
                rewards.append(float(rng.random() < base + 0.4 * step / STEPS))
    infos = {"reward": rewards, "acc": [bool(r) for r in rewards]}
    return RayPPOTrainer._val_metrics_update(None, np.array(data_sources, dtype=object), uids, infos, [])


def main() -> None:
    out_dir = sys.argv[1]
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    tracker = Tracking(project_name=PROJECT, experiment_name=EXPERIMENT, default_backend=["console", "file"], config=CONFIG)
    tracker.log(data=validation_metrics(rng, 0), step=0)
    for step in range(1, STEPS + 1):
        batch = synthetic_batch(rng, step)
        timing_raw = {
            "gen": 9.0 + float(rng.normal(0, 0.5)) + 0.2 * step,
            "reward": 0.4 + float(rng.normal(0, 0.05)),
            "old_log_prob": 1.6 + float(rng.normal(0, 0.1)),
            "ref": 1.5 + float(rng.normal(0, 0.1)),
            "adv": 0.05,
            "update_actor": 6.0 + float(rng.normal(0, 0.3)),
        }
        timing_raw["step"] = sum(timing_raw.values())
        metrics = {}
        entropy = torch.tensor(rng.gamma(2.0, 0.3 - 0.01 * step, size=batch.batch["old_log_probs"].shape))
        metrics["actor/entropy"] = agg_loss(
            loss_mat=entropy, loss_mask=batch.batch["response_mask"], loss_agg_mode="token-mean"
        ).item()
        metrics["perf/mfu/actor_infer"] = 0.22 + float(rng.normal(0, 0.01))
        metrics.update(actor_metrics(rng, batch, step))
        if step % TEST_FREQ == 0:
            metrics.update(validation_metrics(rng, step))
        metrics.update({"training/global_step": step, "training/epoch": 0})
        metrics.update(compute_data_metrics(batch=batch, use_critic=False))
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=N_GPUS))
        tracker.log(data=metrics, step=step)
    tracker.finish()
    with open(f"{out_dir}/config.json", "w") as f:
        json.dump(CONFIG, f, indent=2)
    print(f"verl {verl.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
