"""Write an OpenRLHF-format TensorBoard run with OpenRLHF's own TensorboardLogger.

OpenRLHF's trainer needs DeepSpeed, Ray actors and flash-attn (not installable on a CPU-only
machine), so it is not run. Its logger (openrlhf.utils.logging_utils.TensorboardLogger, 0.11.2)
imports only torch and is used as is: it writes train/<key> scalars, train/generated_samples text
and eval/<key> scalars at the global step. The FILE FORMAT and the key names are OpenRLHF's
(keys as assembled in trainer/ppo_trainer.py: ppo_train/_compute_rollout_stats/compute_eval_metrics,
and trainer/ray/ppo_actor.py: training_step/ppo_train, experience_maker.py); the VALUES are made up.

Usage: python openrlhf_tensorboard_grpo.py OUT_DIR
"""

import json
import sys
from types import SimpleNamespace

import numpy as np

import openrlhf
from openrlhf.utils.logging_utils import TensorboardLogger

STEPS = 20
EVAL_STEPS = 5
N_SAMPLES = 8
RUN_NAME = "qwen_tiny_grpo_k3"

ARGS = {
    "logger": {"tensorboard_dir": None, "wandb": {"run_name": RUN_NAME, "key": None}},
    "algo": {"advantage": {"estimator": "group_norm"}, "kl": {"use_loss": True, "estimator": "k3", "init_coef": 0.001}},
    "actor": {"entropy_coef": 0.0},
    "rollout": {"n_samples_per_prompt": N_SAMPLES, "batch_size": 16},
    "eval": {"steps": EVAL_STEPS, "n_samples_per_prompt": 4},
}


def namespace(d):
    return SimpleNamespace(**{k: namespace(v) if isinstance(v, dict) else v for k, v in d.items()})


def train_status(rng: np.random.Generator, step: int) -> dict:
    reward = float(np.clip(0.15 + 0.03 * step + rng.normal(0, 0.04), 0, 1))
    resp_len = 180 + 6 * step + float(rng.normal(0, 10))
    kl = 0.0005 * step + abs(float(rng.normal(0, 0.0003)))
    status = {
        # ppo_actor.training_step metrics, averaged by ppo_actor.ppo_train
        "policy_loss": float(rng.normal(0, 0.02)),
        "entropy_loss": 0.62 - 0.008 * step + float(rng.normal(0, 0.01)),
        "actor_lr": 1e-6,
        "actor_grad_norm": float(rng.gamma(4.0, 0.04)),
        "reward": reward,
        "kl": kl,
        "logprobs_diff": float(rng.normal(0, 0.01)),
        "group_reward_std": 0.3 + float(rng.normal(0, 0.03)),
        "return": reward,
        "ppo_clip_ratio": 0.002 + 0.0004 * step + abs(float(rng.normal(0, 0.0005))),
        "ppo_kl": abs(float(rng.normal(0.0004, 0.0002))),
        "response_length": resp_len,
        "truncated": max(0.0, 0.01 * step / 4 + float(rng.normal(0, 0.01))),
        "total_length": resp_len + 96,
        # ppo_trainer.train_step / fit timings
        "timing/make_experience": 14.0 + float(rng.normal(0, 1)),
        "timing/ppo_train": 21.0 + float(rng.normal(0, 1)),
        "timing/broadcast": 1.1 + float(rng.normal(0, 0.1)),
        "timing/generation": 38.0 + float(rng.normal(0, 2)),
        # ppo_trainer._compute_rollout_stats
        "rollout/reward_mean": reward,
        "rollout/reward_std": 0.38 + float(rng.normal(0, 0.02)),
        "rollout/response_length_mean": resp_len,
        "rollout/truncated_rate": max(0.0, 0.01 * step / 4),
        "rollout/num_samples": float(ARGS["rollout"]["batch_size"] * N_SAMPLES),
        "generated_samples": ["what is 2+3? The answer is 5.", reward],
    }
    status["timing/step_total"] = sum(v for k, v in status.items() if k.startswith("timing/"))
    return status


def eval_logs(rng: np.random.Generator, step: int) -> dict:
    n = ARGS["eval"]["n_samples_per_prompt"]
    logs = {}
    for ds, base in (("gsm8k", 0.3), ("math500", 0.12)):
        pass1 = float(np.clip(base + 0.01 * step + rng.normal(0, 0.02), 0, 1))
        logs[f"eval_{ds}_pass{n}"] = min(1.0, pass1 * 1.8)
        logs[f"eval_{ds}_pass1"] = pass1
        logs[f"eval_{ds}_response_length_mean"] = 200 + 5 * step + float(rng.normal(0, 10))
        logs[f"eval_{ds}_truncated_rate"] = 0.01
    logs["eval_response_length_mean"] = 205 + 5 * step
    logs["eval_truncated_rate"] = 0.01
    logs["eval_num_samples"] = 400.0
    return logs


def main() -> None:
    out_dir = sys.argv[1]
    ARGS["logger"]["tensorboard_dir"] = out_dir
    rng = np.random.default_rng(0)
    tb = TensorboardLogger(namespace(ARGS))
    for step in range(1, STEPS + 1):
        tb.log_train(step, train_status(rng, step))
        if step % EVAL_STEPS == 0:
            tb.log_eval(step, eval_logs(rng, step))
    tb.close()
    with open(f"{out_dir}/args.json", "w") as f:
        json.dump(ARGS, f, indent=2)
    print("openrlhf", openrlhf.__version__ if hasattr(openrlhf, "__version__") else "0.11.2", file=sys.stderr)


if __name__ == "__main__":
    main()
