"""Published training logs (tests/data/real/published/): every file registers, and the series an RL
engineer reads first (KL, reward, advantage, clip fraction, entropy, length) bind to the right definition
with the right semantics, each field saying where it came from."""
from __future__ import annotations

from pathlib import Path

import pytest

from registry import Registry

PUBLISHED = Path(__file__).resolve().parent / "data" / "real" / "published"

VERL = {
    "kl": ("actor/kl_loss", "kl_ref_mean", {"kl_estimator": "k3", "averaging": "token"}),
    "reward": ("critic/score/mean", "reward_sequence_mean", {"averaging": "sequence"}),
    "advantage": ("critic/advantages/mean", "advantage_mean", {"normalization_axis": "batch"}),
    "clip": ("actor/pg_clipfrac", "clip_fraction", {"averaging": "token"}),
    "entropy": ("actor/entropy", "entropy", {}),
    "length": ("response_length/mean", "response_length_mean", {"averaging": "sequence"}),
}

# file, register options, expected framework / algorithm (and where each came from), and per series kind
# (key, definition, semantic fields) or None when the framework does not log that kind at all.
CASES = [
    ("verl_issue_7412_step34.log", {}, ("verl", "format", None, None), VERL, 26),
    ("verl_sglang_tutorial_issue_106_steps80_83.log", {}, ("verl", "format", None, None),
     {**VERL, "entropy": ("actor/entropy_loss", "entropy", {})}, 35),
    ("verl_issue_2060_steps0_1.log", {}, ("verl", "format", None, None), VERL, 32),
    ("verl_issue_1208_step2.log",
     {"framework": "verl==0.3.0.post1", "params": {"algorithm": {"adv_estimator": "grpo"}}},
     ("verl", "declared", "grpo", "config: algorithm.adv_estimator=grpo"),
     {**VERL, "entropy": ("actor/entropy_loss", "entropy", {}),
      "advantage": ("critic/advantages/mean", "advantage_mean", {"normalization_axis": "group"})}, 36),
    ("chaos_economy_grpo", {}, ("trl", "format", "grpo", "detected"), {
        "kl": ("kl", "kl_ref_mean", {"kl_estimator": "k3", "logging_point": "before_grad_accumulation"}),
        "reward": ("reward", "reward_sequence_mean", {"averaging": "sequence"}),
        "advantage": None,  # TRL's GRPOTrainer logs no advantage statistics
        "clip": ("clip_ratio/region_mean", "clip_fraction", {"averaging": "token"}),
        "entropy": None,    # this TRL version logged no entropy
        "length": ("completions/mean_length", "response_length_mean", {"averaging": "sequence"}),
    }, 30),
]


@pytest.mark.parametrize("name,options,run,expected,bound", CASES, ids=[c[0] for c in CASES])
def test_published_log_binds_with_provenance(registry: Registry, name, options, run, expected, bound):
    result = registry.register(PUBLISHED / name, **options)
    framework, framework_from, algorithm, algorithm_from = run
    assert result.framework == framework
    assert result.binding["framework_from"] == framework_from
    assert result.binding.get("algorithm") == algorithm and result.binding.get("algorithm_from") == algorithm_from
    assert not result.guessed and len(result.mapped) == bound
    series = {s["key"]: s for s in registry.run_detail(result.run_id)["series"]}
    version = options.get("framework", "").partition("==")[2] or None
    for kind, want in expected.items():
        if want is None:
            assert not any(s["definition"] and s["definition"].startswith(kind) for s in series.values()), kind
            continue
        key, definition, fields = want
        s = series[key]
        assert s["definition"] == definition, (kind, key)
        provenance = s["provenance"]
        assert provenance["how"] == "alias" and provenance["alias_key"] == key
        for field, value in fields.items():
            assert s["semantics"][field] == value, (kind, field)
            origin = provenance["fields"][field]
            # No config file was published with these runs: every field is the framework's default,
            # stamped with the framework version when the run declares one.
            assert origin["from"] == "alias" and origin["framework"] == framework
            assert origin.get("framework_version") == version


def test_published_validation_keys_carry_their_labels(registry: Registry):
    result = registry.register(PUBLISHED / "verl_issue_2060_steps0_1.log")
    series = {s["key"]: s for s in registry.run_detail(result.run_id)["series"]}
    core = series["val-core/openai/gsm8k/acc/mean@1"]
    assert core["definition"] == "eval_reward_mean" and core["semantics"]["logging_point"] == "eval"
    assert core["labels"] == {"data_source": "openai/gsm8k", "var": "acc", "n": "1"}
    assert core["first_step"] == 0
