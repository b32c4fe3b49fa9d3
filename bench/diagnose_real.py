"""Diagnosis on the labelled real run sets (stable-baselines3 and CleanRL PPO, TRL GRPO sweeps), tuning vs held-out.

The SB3 runs are in ``tests/data/real/sb3_sweep/<run>/`` (event file + params.json, trained by
``bench/real_runs/make_sb3_sweep.py``), the CleanRL runs in
``tests/data/real/cleanrl_sweep/<run>/runs/`` (CleanRL's own ``ppo.py``, run by
``bench/real_runs/make_cleanrl_sweep.py``), the TRL GRPO runs in
``tests/data/real/trl_sweep/<run>/runs/`` with ``config.json`` beside (TRL's own ``GRPOTrainer``
on a tiny task, run by ``bench/real_runs/make_trl_sweep.py``). In each set, ``labels.yaml`` says, per run, what its
curves show (healthy, or the problems seen, each with the detectors that count as finding it and the
steps it spans), the cause, and the observation the label was read from; ``split.yaml`` says which
runs were used for tuning and which are held out, in batches each placed there before it was trained
(``held_out``, ``held_out_2``, ...; its comments say which diagnosis change each batch measured).

Printed separately for the tuning part, each held-out batch and all held-out runs together:

* detection recall: labelled problems found by a finding of severity warning or above, of
  one of the problem's detectors, overlapping its steps (a miss lists any joint reading over its
  steps, which the user sees but which does not count);
* detection precision: warning-or-above findings on problem runs whose detector is one of the
  run's problems' detectors or a listed consequence, over all warning-or-above findings on
  problem runs;
* false alarms on healthy runs: healthy runs with any finding of severity warning or above,
  without a baseline and with one (learned from the other healthy runs of the same
  environment, leave-one-out; a baseline of fewer than 3 runs is weak and says so);
* runs labelled ``borderline`` (a difference from the healthy runs that is not a failure) are
  listed with their verdict, not scored;
* cause accuracy: of the warning-or-above findings that detect a labelled problem (or a
  listed consequence), the share whose *named* cause (best-supported, support >= 0.5) is
  the label's cause; findings with no named cause count as wrong, and the rest are split into
  those that named no cause and those that named a wrong one;
* precision and cause accuracy with a baseline, counted the same way over the findings of the
  diagnosis with a baseline (a deviation from the healthy runs counts as a consequence of any
  labelled problem, so only its cause is scored).

Run: .venv/bin/python bench/diagnose_real.py [--verbose] [--runs DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry.analysis.diagnosis import build_baseline, diagnose  # noqa: E402
from registry.analysis.diagnosis.fixtures import default_metric_infos, load_tensorboard_run  # noqa: E402
from registry.analysis.diagnosis.hyperparams import settings_for_baseline  # noqa: E402

#: The labelled sets: stable-baselines3 runs (with params.json beside each event file), CleanRL runs
#: (CleanRL's own ``runs/<run name>/`` layout, its hyperparameters read from the event file) and TRL runs
#: (transformers' ``runs/<time>_<host>/`` layout, the GRPOConfig in config.json beside it).
RUN_SETS = [ROOT / "tests" / "data" / "real" / name for name in ("sb3_sweep", "cleanrl_sweep", "trl_sweep")]

#: The TRL set's task (bench/real_runs/make_trl_sweep.py): its runs' labels say the same.
TRL_TASK = "tiny-addition"

#: Per part, the runs listed under each heading (the rest of a part's figures are counts).
LISTED = ("misses", "false_alarms", "wrong_causes", "fp", "rows", "borderline")

TARGET_RECALL = 1.0
TARGET_CAUSE = 0.9


def load_set(root: Path) -> tuple[dict, dict]:
    """The labels, and each run's part of ``split.yaml``: ``tuning``, then the held-out batches in
    the order they were added (``held_out``, ``held_out_2``, ...)."""
    labels = yaml.safe_load((root / "labels.yaml").read_text())["runs"]
    split = yaml.safe_load((root / "split.yaml").read_text())
    part = {name: p for p, names in split.items() for name in names}
    return labels, part


def run_inputs(root: Path, name: str) -> tuple[dict, dict, str, str]:
    """Curves, hyperparameters, environment and framework of one labelled run."""
    if (root / name / "params.json").exists():
        params = json.loads((root / name / "params.json").read_text())
        return load_tensorboard_run(root / name, "stable-baselines3")[0], params, params["env"], "stable-baselines3"
    (run_dir,) = (root / name / "runs").iterdir()
    if (root / name / "config.json").exists():
        # transformers' TensorBoard layout, the GRPOConfig beside it: TRL's keys carry no framework name the
        # importer could tell from TRL's generic ones ("loss", "reward") alone, and the task is the set's own.
        curves, params, framework, _ = load_tensorboard_run(run_dir, "trl")
        return curves, params, TRL_TASK, framework
    curves, params, framework, task = load_tensorboard_run(run_dir)
    if framework is None or task is None:
        raise SystemExit(f"{run_dir}: the importer found no framework or task")
    return curves, params, task, framework


def baselines_for(root: Path, labels: dict, healthy_of_env: dict[str, list[str]], leave_out: str | None, env: str):
    names = [n for n in healthy_of_env.get(env, []) if n != leave_out]
    if not names:
        return None
    inputs = [run_inputs(root, n) for n in names]
    knobs = settings_for_baseline([p for _, p, _, _ in inputs], inputs[0][3])
    return build_baseline(env, [c for c, _, _, _ in inputs], infos=default_metric_infos(env), hyperparams=knobs)


def evaluate(root: Path, verbose: bool = False) -> dict[str, dict]:
    labels, part = load_set(root)
    healthy_of_env: dict[str, list[str]] = defaultdict(list)
    for name, lab in labels.items():
        if lab["label"] == "healthy":
            healthy_of_env[lab["env"]].append(name)
    stats: dict[str, dict] = {p: defaultdict(float) | {k: [] for k in LISTED} for p in dict.fromkeys(part.values())}
    for name in sorted(labels):
        lab = labels[name]
        if name not in part:
            raise SystemExit(f"{name} is labelled but in neither part of split.yaml")
        st = stats[part[name]]
        curves, params, env, framework = run_inputs(root, name)
        infos = default_metric_infos(env)
        d = diagnose(curves, infos, params=params, framework=framework)
        warn = d.at_least("warning")
        base = baselines_for(root, labels, healthy_of_env, name, env)
        db = diagnose(curves, infos, baseline=base, params=params, framework=framework) \
            if base is not None else None
        named = sorted({f"{f.detector}->{f.cause}" for f in warn})
        st["rows"].append(f"{name:<24} {lab['label']:<8} {str(lab.get('cause')):<20} {d.verdict:<9} "
                          f"{', '.join(named) or '-'}")
        if verbose:
            print(f"\n== {name} [{part[name]}] label={lab['label']} cause={lab.get('cause')}: {d.verdict}")
            for f in d.findings:
                print(f"   {f.summary()[:140]} | cause={f.cause} conf={f.confidence}")
        if lab["label"] == "borderline":
            wb = db.at_least("warning") if db is not None else []
            st["borderline"].append(
                f"{name}: {d.verdict}; " + ("; ".join(f.summary()[:100] for f in warn) or "no warning")
                + (f" | with {db.baseline_note}: {db.verdict}; " + ("; ".join(f.summary()[:120] for f in wb)
                                                                   or "no warning") if db is not None else ""))
            continue
        if lab["label"] == "healthy":
            st["healthy_runs"] += 1
            if warn:
                st["healthy_alarm"] += 1
                st["false_alarms"].append(f"{name}: " + "; ".join(f.summary()[:100] for f in warn))
            if db is not None:
                st["healthy_with_baseline"] += 1
                wb = db.at_least("warning")
                if wb:
                    st["healthy_alarm_baseline"] += 1
                    st["false_alarms"].append(f"{name} (with {db.baseline_note}): "
                                              + "; ".join(f.summary()[:100] for f in wb))
            continue
        st["problem_runs"] += 1
        allowed = set(lab.get("consequences") or [])
        for prob in lab["problems"]:
            allowed |= set(prob["detectors"])
            lo, hi = prob["steps"]
            hit = [f for f in warn if f.detector in prob["detectors"] and f.start <= hi and f.end >= lo]
            st["problems"] += 1
            if hit:
                st["found"] += 1
            else:
                # A joint reading over those steps is said to the user but is not a finding: not counted.
                joint = [j.kind for j in d.joint_readings if j.start <= hi and j.end >= lo]
                st["misses"].append(f"{name}: {prob['detectors']} in steps {lo}-{hi}; found "
                                    + (", ".join(f.detector for f in warn) or "nothing")
                                    + (f" (joint reading over those steps, not counted: {', '.join(joint)})"
                                       if joint else ""))
        for f in warn:
            if f.detector in allowed:
                st["tp"] += 1
                st["cause_total"] += 1
                if f.cause == lab["cause"]:
                    st["cause_right"] += 1
                else:
                    st["cause_unnamed"] += f.cause is None
                    st["wrong_causes"].append(f"{name}: {f.detector} named {f.cause!r}, label {lab['cause']!r}")
            else:
                st["fp_findings"] += 1
                st["fp"].append(f"{name}: {f.summary()[:110]}")
        if db is not None:
            st["problem_runs_baseline"] += 1
            st["problems_baseline"] += len(lab["problems"])
            found_b = sum(1 for prob in lab["problems"] if any(
                f.detector in prob["detectors"] and f.start <= prob["steps"][1] and f.end >= prob["steps"][0]
                for f in db.at_least("warning")))
            st["found_baseline"] += found_b
            # The same precision and cause counts for the findings a baseline adds or changes: a deviation
            # from the healthy runs is a consequence of any labelled problem (the run is not healthy), so
            # only its named cause is scored; other detectors count as above.
            for f in db.at_least("warning"):
                if f.detector in allowed or f.detector == "baseline_deviation":
                    st["tp_baseline"] += 1
                    if f.cause == lab["cause"]:
                        st["cause_right_baseline"] += 1
                    else:
                        st["cause_unnamed_baseline"] += f.cause is None
                        st["wrong_causes"].append(f"{name} (with baseline): {f.detector} {f.metric} named "
                                                  f"{f.cause!r}, label {lab['cause']!r}")
                else:
                    st["fp_findings_baseline"] += 1
                    st["fp"].append(f"{name} (with baseline): {f.summary()[:110]}")
    return stats


def _add_parts(parts: list[dict]) -> dict:
    """The figures of several parts together (one part over both run sets, or all held-out batches):
    counts added, listed runs joined."""
    out: dict = defaultdict(float)
    for st in parts:
        for k, v in st.items():
            out[k] = out[k] + v if k in out else v
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f} ({a:.0f}/{b:.0f})" if b else "n/a (0/0)"


def _unnamed(st: dict, suffix: str) -> str:
    """Of the findings whose cause was not the label's, how many named none (the diagnosis saying it
    cannot tell) rather than a wrong one."""
    wrong = st[f"tp{suffix}"] - st[f"cause_right{suffix}"]     # tp counts every scored cause
    if not wrong:
        return ""
    unnamed = st[f"cause_unnamed{suffix}"]
    return f"; of the rest, {unnamed:.0f} named no cause and {wrong - unnamed:.0f} a wrong one"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", default=RUN_SETS, help="labelled run sets")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    stats: dict[str, dict] = {}
    for root in args.runs:
        for p, st in evaluate(root, args.verbose).items():
            stats[p] = _add_parts([stats[p], st]) if p in stats else st
    missed = []
    print(f"\nreal PPO run sets: {', '.join(map(str, args.runs))}")
    held_out = [p for p in stats if p != "tuning"]
    for p in [*stats, "all held-out"]:
        if p in stats:
            st = stats[p]
        else:  # all held-out batches together: their runs are listed under their own batch, so only the counts
            st = _add_parts([stats[q] for q in held_out])
            st.update({k: [] for k in LISTED})
        print(f"\n[{p}] {st['problem_runs']:.0f} problem runs ({st['problems']:.0f} labelled problems), "
              f"{st['healthy_runs']:.0f} healthy runs")
        print(f"  detection recall     {_ratio(st['found'], st['problems'])}")
        print(f"  detection precision  {_ratio(st['tp'], st['tp'] + st['fp_findings'])}")
        print(f"  recall with baseline {_ratio(st['found_baseline'], st['problems_baseline'])} "
              f"(runs whose environment has healthy runs to learn from)")
        print(f"  false alarms on healthy runs: without baseline {_ratio(st['healthy_alarm'], st['healthy_runs'])}, "
              f"with baseline {_ratio(st['healthy_alarm_baseline'], st['healthy_with_baseline'])}")
        print(f"  named cause right    {_ratio(st['cause_right'], st['cause_total'])}{_unnamed(st, '')}")
        print(f"  with baseline: precision {_ratio(st['tp_baseline'], st['tp_baseline'] + st['fp_findings_baseline'])}, "
              f"named cause right {_ratio(st['cause_right_baseline'], st['tp_baseline'])}"
              f"{_unnamed(st, '_baseline')}")
        print(f"    {'run':<24} {'label':<8} {'labelled cause':<20} {'verdict':<9} warning findings -> named cause")
        for row in st["rows"]:
            print(f"    {row}")
        for key, title in (("misses", "missed"), ("false_alarms", "false alarm"), ("fp", "unexpected finding"),
                           ("wrong_causes", "cause"), ("borderline", "borderline (not scored)")):
            for line in st[key]:
                print(f"    {title}: {line}")
        if st["problems"] and st["found"] / st["problems"] < TARGET_RECALL:
            missed.append(f"{p}: recall {st['found'] / st['problems']:.2f} < {TARGET_RECALL}")
        if st["healthy_alarm"] or st["healthy_alarm_baseline"]:
            missed.append(f"{p}: warnings on healthy runs")
        if st["cause_total"] and st["cause_right"] / st["cause_total"] < TARGET_CAUSE:
            missed.append(f"{p}: named cause right {st['cause_right'] / st['cause_total']:.2f} < {TARGET_CAUSE}")
    if missed:
        print("\ntargets missed:\n  - " + "\n  - ".join(missed))
        return 1
    print("\nall targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
