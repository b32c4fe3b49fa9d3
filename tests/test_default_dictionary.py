"""The shipped default metric dictionary, checked against the reference table of framework metric keys.

The reference table (``framework_metric_keys.csv``) lists the metric keys of verl, TRL, OpenRLHF,
stable-baselines3 and CleanRL as read from their source code; it lives next to the repository in
``../shared/reference``. Tests that need it are skipped when it is absent.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import yaml

from registry.core.semantics import ENUMS, effective_semantics

ROOT = Path(__file__).resolve().parents[1]
DICTIONARY = ROOT / "registry" / "dictionary" / "data" / "default_dictionary.yaml"
REFERENCE_CSV = ROOT.parent / "shared" / "reference" / "framework_metric_keys.csv"

FRAMEWORKS = ("verl", "trl", "openrlhf", "stable-baselines3", "cleanrl")
ALGORITHMS = (None, "ppo", "grpo", "rloo")
# framework column of the reference table -> (framework, algorithm) of an alias
CSV_FRAMEWORKS = {
    "verl": ("verl", None),
    "verl (megatron backend)": ("verl", None),
    "trl-grpo": ("trl", "grpo"),
    "trl-ppo": ("trl", "ppo"),
    "trl-rloo": ("trl", "rloo"),
    "trl (transformers Trainer base)": ("trl", None),
    "openrlhf": ("openrlhf", None),
    "sb3-ppo": ("stable-baselines3", None),
    "cleanrl-ppo": ("cleanrl", None),
}

DEFINITION_FIELDS = {
    "name", "display_name", "layer", "quantity", "description", "formula", "unit", "higher_is_better",
    "averaging", "kl_estimator", "normalization_axis", "logging_point", "healthy_range", "task_ranges",
    "smoothing_window", "aliases",
}
REQUIRED_DEFINITION_FIELDS = DEFINITION_FIELDS - {"healthy_range", "task_ranges"}
ALIAS_FIELDS = {
    "framework", "algorithm", "key", "averaging", "kl_estimator", "normalization_axis", "logging_point",
    "sign", "aggregation", "source", "notes",
}
SEMANTIC_ENUM_FIELDS = ("averaging", "kl_estimator", "normalization_axis", "logging_point")

# Every metric of the seed dashboard -> the definition that carries it.
SEED_DASHBOARD = {
    "reward per token": "reward_token_mean",
    "reward per sequence": "reward_sequence_mean",
    "reward part: accuracy": "reward_accuracy_mean",
    "reward part: format": "reward_format_mean",
    "reward part: total": "reward_total_mean",
    "return": "return_mean",
    "advantage mean": "advantage_mean",
    "advantage std": "advantage_std",
    "KL mean": "kl_ref_mean",
    "KL std": "kl_ref_std",
    "KL max": "kl_ref_max",
    "approx KL to old policy": "kl_old_mean",
    "clip fraction": "clip_fraction",
    "entropy": "entropy",
    "policy loss": "policy_loss",
    "value loss": "value_loss",
    "total loss": "total_loss",
    "response length": "response_length_mean",
    "reward std": "reward_std",
    "grad norm": "grad_norm",
    "learning rate": "learning_rate",
    "explained variance": "explained_variance",
    "episode return": "episode_return_mean",
    "episode length": "episode_length_mean",
}

# The tags of the real stable-baselines3 runs in ../shared/data/sb3_ppo -> definition.
SB3_TAGS = {
    "rollout/ep_rew_mean": "episode_return_mean",
    "rollout/ep_len_mean": "episode_length_mean",
    "rollout/ep_rew_std": "episode_return_std",
    "time/fps": "throughput_steps_per_s",
    "train/approx_kl": "kl_old_mean",
    "train/clip_fraction": "clip_fraction",
    "train/clip_range": "clip_range",
    "train/entropy_loss": "entropy",
    "train/explained_variance": "explained_variance",
    "train/learning_rate": "learning_rate",
    "train/loss": "total_loss",
    "train/policy_gradient_loss": "policy_loss",
    "train/value_loss": "value_loss",
    "train/std": "policy_std",
}


@pytest.fixture(scope="module")
def document():
    with DICTIONARY.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def definitions(document):
    return {d["name"]: d for d in document["definitions"]}


@pytest.fixture(scope="module")
def aliases(document):
    """(framework, algorithm, key) -> (definition, alias)."""
    return {
        (a["framework"], a.get("algorithm"), a["key"]): (d, a) for d in document["definitions"] for a in d["aliases"]
    }


@pytest.fixture(scope="module")
def reference_rows():
    if not REFERENCE_CSV.is_file():
        pytest.skip(f"reference table not found at {REFERENCE_CSV}")
    with REFERENCE_CSV.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def semantics_of(aliases, framework, algorithm, key):
    definition, alias = aliases[(framework, algorithm, key)]
    return definition, alias, effective_semantics(definition, alias)


# --- structure ---------------------------------------------------------------------


def test_document_header(document):
    assert document["format"] == "rlregistry-dictionary"
    assert document["version"] == 1
    assert isinstance(document["definitions"], list) and document["definitions"]


def test_definitions_have_the_schema_fields_and_legal_enums(document):
    for d in document["definitions"]:
        name = d.get("name")
        assert set(d) <= DEFINITION_FIELDS, (name, set(d) - DEFINITION_FIELDS)
        assert REQUIRED_DEFINITION_FIELDS <= set(d), (name, REQUIRED_DEFINITION_FIELDS - set(d))
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name), name
        for field in ("layer", "quantity", *SEMANTIC_ENUM_FIELDS):
            assert d[field] in ENUMS[field], (name, field, d[field])
        for field in ("display_name", "description", "unit"):
            assert isinstance(d[field], str) and d[field].strip(), (name, field)
        assert isinstance(d["formula"], str), name
        assert d["higher_is_better"] in (True, False, None), name
        window = d["smoothing_window"]
        assert isinstance(window, int) and not isinstance(window, bool) and window >= 1, name
        ranges = [d.get("healthy_range")] + list((d.get("task_ranges") or {}).values())
        for task, r in (d.get("task_ranges") or {}).items():
            # A range for one environment is a claim about that environment: say where it comes from.
            assert isinstance(r.get("source"), str) and "gymnasium" in r["source"], (name, task, r)
        for r in ranges:
            if r is None:
                continue
            assert set(r) - {"source"} == {"low", "high"}, (name, r)
            for bound in (r["low"], r["high"]):
                assert bound is None or (isinstance(bound, (int, float)) and not isinstance(bound, bool)), (name, r)
            if r["low"] is not None and r["high"] is not None:
                assert r["low"] <= r["high"], (name, r)
        assert isinstance(d["aliases"], list), name


def test_aliases_have_the_schema_fields_and_legal_enums(document):
    for d in document["definitions"]:
        for a in d["aliases"]:
            where = (d["name"], a.get("framework"), a.get("key"))
            assert set(a) <= ALIAS_FIELDS, (where, set(a) - ALIAS_FIELDS)
            assert a["framework"] in FRAMEWORKS, where
            assert a.get("algorithm") in ALGORITHMS, where
            assert isinstance(a["key"], str) and a["key"], where
            for field in SEMANTIC_ENUM_FIELDS:
                if a.get(field) is not None:
                    assert a[field] in ENUMS[field], (where, field, a[field])
            assert a.get("sign", 1) in (1, -1), where
            for field in ("aggregation", "source"):
                assert isinstance(a.get(field), str) and a[field].strip(), (where, field)
            assert isinstance(a.get("notes", ""), str), where


def test_definition_names_are_unique(document):
    names = [d["name"] for d in document["definitions"]]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_alias_identities_are_unique(document):
    seen: dict[tuple, str] = {}
    for d in document["definitions"]:
        for a in d["aliases"]:
            ident = (a["framework"], a.get("algorithm"), a["key"])
            assert ident not in seen, f"{ident} claimed by {seen[ident]!r} and {d['name']!r}"
            seen[ident] = d["name"]


def test_kl_aliases_name_their_estimator(document):
    for d in document["definitions"]:
        if d["quantity"] == "kl":
            assert d["kl_estimator"] != "n/a", d["name"]
            for a in d["aliases"]:
                assert a.get("kl_estimator") not in (None, "n/a"), (d["name"], a["key"])
        elif d["name"] != "reward_kl_penalty_mean":
            assert d["kl_estimator"] == "n/a", d["name"]


# --- the reference table -------------------------------------------------------------


def test_every_reference_row_is_an_alias(reference_rows, aliases):
    assert len(reference_rows) == 152
    missing = []
    for row in reference_rows:
        framework, algorithm = CSV_FRAMEWORKS[row["framework"]]
        # The table writes verl's sample count as a bare N (mean@N); the dictionary's templates
        # spell every filled-in part as a {placeholder} (mean@{n}) so that real keys match.
        ident = (framework, algorithm, re.sub(r"@N$", "@{n}", row["key"]))
        if ident not in aliases:
            missing.append(ident)
            continue
        _, alias = aliases[ident]
        # aggregation and source are copied from the table, not paraphrased
        assert row["source_file"] in alias["source"], ident
        if row["aggregation"].strip():
            assert row["aggregation"] in alias["aggregation"], ident
    assert not missing, missing


def test_reference_concepts_are_not_merged_across_kl_kinds(reference_rows, aliases):
    """KL to the reference, KL to the old policy and rollout-vs-trainer KL stay separate definitions."""
    expected = {"kl_ref_mean": "kl_ref_mean", "kl_old_mean": "kl_old_mean", "kl_rollout_mean": "kl_rollout_mean",
                "kl_ref_seq_sum": "kl_ref_seq_sum"}
    for row in reference_rows:
        if row["canonical_concept"] in expected:
            framework, algorithm = CSV_FRAMEWORKS[row["framework"]]
            definition, _ = aliases[(framework, algorithm, row["key"])]
            assert definition["name"] == expected[row["canonical_concept"]], row["key"]


# --- seed dashboard ------------------------------------------------------------------


def test_seed_dashboard_is_covered(definitions):
    missing = {item: name for item, name in SEED_DASHBOARD.items() if name not in definitions}
    assert not missing, missing


def test_seed_dashboard_healthy_ranges(definitions):
    def healthy(name):
        r = definitions[name].get("healthy_range") or {}
        return r.get("low"), r.get("high")

    assert healthy("clip_fraction") == (0.05, 0.3)
    low, high = healthy("kl_old_mean")
    assert high is not None and 0.02 <= high <= 0.05
    assert healthy("explained_variance") == (0.0, 1.0)
    assert definitions["explained_variance"]["higher_is_better"] is True
    assert healthy("entropy")[0] > 0
    assert healthy("reward_std")[0] > 0
    assert healthy("advantage_std")[0] > 0
    # a zero spread of episode returns is harmless (every CartPole episode at the 500 cap)
    assert healthy("episode_return_std")[0] in (None, 0)
    for name in ("episode_return_mean", "episode_return"):
        tasks = definitions[name]["task_ranges"]
        assert (tasks["CartPole-v1"]["low"], tasks["CartPole-v1"]["high"]) == (0, 500)
        assert "max_episode_steps=500" in tasks["CartPole-v1"]["source"]
        assert tasks["Pendulum-v1"]["high"] == 0 and tasks["Pendulum-v1"]["low"] < -1500
        # 200 steps of at most pi^2 + 0.1 * 8^2 + 0.001 * 2^2 cost each (gymnasium's pendulum.py)
        assert tasks["Pendulum-v1"]["low"] <= -200 * (3.14159265 ** 2 + 6.4 + 0.004) < tasks["Pendulum-v1"]["low"] + 1


# --- stable-baselines3, CleanRL and verl facts ---------------------------------------------


@pytest.mark.parametrize("tag, name", sorted(SB3_TAGS.items()))
def test_sb3_tags_map_to_definitions(aliases, tag, name):
    definition, _ = aliases[("stable-baselines3", None, tag)]
    assert definition["name"] == name


def test_sb3_episode_return_is_described_as_a_return(aliases):
    definition, alias, semantics = semantics_of(aliases, "stable-baselines3", None, "rollout/ep_rew_mean")
    assert definition["quantity"] == "return" and semantics["averaging"] == "episode"
    assert "undiscounted" in definition["description"] and "despite its name" in definition["description"]


@pytest.mark.parametrize(
    "framework, algorithm, key, name, estimator",
    [
        ("stable-baselines3", None, "train/approx_kl", "kl_old_mean", "k3"),
        ("cleanrl", None, "losses/old_approx_kl", "kl_old_mean", "k1"),
        ("cleanrl", None, "losses/approx_kl", "kl_old_mean", "k3"),
        ("verl", None, "actor/kl_loss", "kl_ref_mean", "k3"),
        ("verl", None, "actor/ppo_kl", "kl_old_mean", "k1"),
        ("verl", None, "actor/reward_kl_penalty", "kl_ref_mean", "k1"),
        ("verl", None, "rollout_corr/kl", "kl_rollout_mean", "k1"),
        ("verl", None, "rollout_corr/k3_kl", "kl_rollout_mean", "k3"),
        ("trl", "grpo", "kl", "kl_ref_mean", "k3"),
        ("trl", "rloo", "kl", "kl_ref_mean", "k1"),
        ("trl", "ppo", "objective/kl", "kl_ref_seq_sum", "k1"),
        ("trl", "ppo", "policy/approxkl_avg", "kl_old_mean", "k2"),
        ("openrlhf", None, "train/kl", "kl_ref_mean", "k1"),
        ("openrlhf", None, "train/ppo_kl", "kl_old_mean", "k1"),
    ],
)
def test_kl_estimators(aliases, framework, algorithm, key, name, estimator):
    definition, _, semantics = semantics_of(aliases, framework, algorithm, key)
    assert definition["name"] == name
    assert semantics["kl_estimator"] == estimator


def test_sb3_approx_kl_is_last_epoch_only(aliases):
    _, alias = aliases[("stable-baselines3", None, "train/approx_kl")]
    assert "LAST epoch" in alias["aggregation"]


@pytest.mark.parametrize(
    "framework, algorithm, key, sign",
    [
        ("stable-baselines3", None, "train/entropy_loss", -1),
        ("openrlhf", None, "train/entropy_loss", 1),
        ("cleanrl", None, "losses/entropy", 1),
        ("verl", None, "actor/entropy", 1),
        ("trl", "grpo", "entropy", 1),
    ],
)
def test_entropy_signs(aliases, framework, algorithm, key, sign):
    definition, alias = aliases[(framework, algorithm, key)]
    assert definition["name"] == "entropy"
    assert alias.get("sign", 1) == sign


def test_only_sb3_entropy_loss_is_negated(document):
    negated = [
        (a["framework"], a["key"]) for d in document["definitions"] for a in d["aliases"] if a.get("sign", 1) != 1
    ]
    assert negated == [("stable-baselines3", "train/entropy_loss")]


@pytest.mark.parametrize(
    "framework, algorithm, key, axis",
    [
        ("verl", None, "critic/advantages/mean", "batch"),  # default adv_estimator gae: batch whitening
        ("verl", "grpo", "critic/advantages/mean", "group"),
        ("verl", "grpo", "critic/returns/mean", "group"),  # GRPO returns are the advantages
        ("stable-baselines3", None, "train/policy_gradient_loss", "minibatch"),
        ("cleanrl", None, "losses/policy_loss", "minibatch"),
    ],
)
def test_advantage_normalization_axes(aliases, framework, algorithm, key, axis):
    _, _, semantics = semantics_of(aliases, framework, algorithm, key)
    assert semantics["normalization_axis"] == axis


@pytest.mark.parametrize(
    "framework, algorithm, key, point",
    [
        ("stable-baselines3", None, "train/approx_kl", "after_grad_accumulation"),
        ("stable-baselines3", None, "train/explained_variance", "rollout"),
        ("stable-baselines3", None, "rollout/ep_rew_mean", "rollout"),
        ("verl", None, "actor/pg_loss", "after_grad_accumulation"),
        ("verl", None, "actor/kl_loss", "after_grad_accumulation"),
        ("verl", None, "actor/ppo_kl", "before_grad_accumulation"),
        ("trl", "grpo", "kl", "before_grad_accumulation"),
        ("trl", "rloo", "kl", "rollout"),
        ("trl", None, "loss", "after_grad_accumulation"),
        ("verl", None, "val-core/{data_source}/{var}/mean@{n}", "eval"),
    ],
)
def test_logging_points(aliases, framework, algorithm, key, point):
    _, _, semantics = semantics_of(aliases, framework, algorithm, key)
    assert semantics["logging_point"] == point
