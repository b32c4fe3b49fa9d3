"""Similar runs on the labelled real SB3 sweep: outcome prediction, "no close match", cross-framework.

The runs are ``tests/data/real/sb3_sweep/<run>/`` (real SB3 2.9.2 PPO event files); their verdicts
come from ``labels.yaml`` (healthy -> success, problem -> failed; borderline runs are registered
without a verdict, so they neither vote nor count in the base rate). ``split.yaml`` says which
runs are held out. The prediction rule (Gaussian kernel with the collection's median
nearest-neighbour distance as bandwidth, at least 2 effective neighbours, ``outcome``) and the
"no close match" rule (best distance above the 95th percentile of the collection's
nearest-neighbour distances, ``closeness``) were fixed before this set was searched; nothing was
tuned on it, so both parts are reported, the held-out one being the one that counts.

Leave-one-out: every labelled run is queried against all the others (a query never finds
itself), k = 10, the default metrics (episode return, KL, entropy), whole runs. Per part:

* weighted prediction: how many runs got a prediction (the rest: "not enough similar runs")
  and how many of those were right;
* the majority verdict of the 10 nearest (the rule it replaces), 1-nearest-neighbour, and the
  base rate (always the most common verdict among the other runs), each over every run;
* the same with ``same_task`` (neighbours of the same environment only).

Then: which queries were flagged "no close match", with the figures; a MountainCar and a Pendulum
run queried against CartPole runs only (``where="task = CartPole-v1"``: a query unlike anything
in that collection); and the CleanRL CartPole run (``tests/data/real/cleanrl_ppo_cartpole``,
per-episode ``charts/episodic_return``) searched among the SB3 runs of its task: its nearest
neighbour, coverage and the concept warning. Last, both labelled sets in one registry: each labelled
run of one framework searched among the other framework's runs of its task only (its own framework's
runs excluded), the outcome predicted from them against that pool's base rate. And the labelled real
TRL GRPO set (``tests/data/real/trl_sweep``, one task): leave-one-out on whole runs and on each run's first
30%, every held-out batch counted as held out.

Run: .venv/bin/python bench/similar_real.py
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry  # noqa: E402
from registry.analysis.similarity import find_similar, refresh_embeddings  # noqa: E402
from registry.analysis.similarity.outcome import MIN_EFFECTIVE  # noqa: E402

RUNS = ROOT / "tests" / "data" / "real" / "sb3_sweep"
CLEANRL = ROOT / "tests" / "data" / "real" / "cleanrl_ppo_cartpole" / "runs"
CLEANRL_SWEEP = ROOT / "tests" / "data" / "real" / "cleanrl_sweep"
TRL_SWEEP = ROOT / "tests" / "data" / "real" / "trl_sweep"
FRAMEWORKS = ("stable-baselines3", "cleanrl")
VERDICT = {"healthy": "success", "problem": "failed"}
K = 10


def labelled_set(root: Path) -> tuple[dict, dict[str, str]]:
    """A labelled set's labels, and each run's part: every held-out batch counts as held out here (the
    outcome vote was not changed for any of them)."""
    labels = yaml.safe_load((root / "labels.yaml").read_text())["runs"]
    split = yaml.safe_load((root / "split.yaml").read_text())
    return labels, {n: ("tuning" if p == "tuning" else "held_out") for p, names in split.items() for n in names}


def logger_run_dir(root: Path, name: str) -> Path:
    """The one run directory a framework's logger made under ``<run>/runs/`` (CleanRL's, transformers')."""
    (inner,) = (root / name / "runs").iterdir()
    return inner


def add_labelled(reg: Registry, truth: dict[str, str | None], name: str, label: str, path: Path, **how) -> None:
    """Register one labelled run with its verdict (none for a borderline run) and its embeddings."""
    res = reg.register(path, name=name, **how)
    truth[name] = VERDICT.get(label)
    if truth[name]:
        reg.set_outcome(name, verdict=truth[name])
    with reg.transaction() as s:
        refresh_embeddings(s, res.run_id)


def build(url: str) -> tuple[Registry, dict[str, str | None], dict[str, str]]:
    labels, part = labelled_set(RUNS)
    reg = Registry(url)
    truth: dict[str, str | None] = {}
    for name, lab in sorted(labels.items()):
        params = json.loads((RUNS / name / "params.json").read_text())
        add_labelled(reg, truth, name, lab["label"], RUNS / name, algorithm="ppo", framework="stable-baselines3",
                     task=params["env"])
    res = reg.register(CLEANRL, name="cleanrl_ppo_cartpole", algorithm="ppo", framework="cleanrl",
                       task="CartPole-v1")
    with reg.transaction() as s:
        refresh_embeddings(s, res.run_id)
    return reg, truth, part


def build_both(url: str) -> tuple[Registry, dict[str, tuple[str, str, str]]]:
    """Both labelled sets in one registry, each run with its verdict: name -> (framework, task, verdict)."""
    reg = Registry(url)
    runs: dict[str, tuple[str, str, str]] = {}
    truth: dict[str, str | None] = {}
    for framework, root in zip(FRAMEWORKS, (RUNS, CLEANRL_SWEEP)):
        for name, lab in sorted(yaml.safe_load((root / "labels.yaml").read_text())["runs"].items()):
            if not (root / name).is_dir():
                continue
            path = root / name if framework == "stable-baselines3" else logger_run_dir(root, name)
            key = f"{framework}:{name}"
            add_labelled(reg, truth, key, lab["label"], path, algorithm="ppo", framework=framework, task=lab["env"])
            if truth[key]:
                runs[key] = (framework, lab["env"], truth[key])
    return reg, runs


def build_trl(url: str) -> tuple[Registry, dict[str, str | None], dict[str, str]]:
    """The labelled real TRL GRPO set (one task), each run with its verdict and its part."""
    labels, part = labelled_set(TRL_SWEEP)
    reg = Registry(url)
    truth: dict[str, str | None] = {}
    for name, lab in sorted(labels.items()):
        params = json.loads((TRL_SWEEP / name / "config.json").read_text())
        add_labelled(reg, truth, name, lab["label"], logger_run_dir(TRL_SWEEP, name), algorithm="grpo",
                     framework="trl", task=lab["env"], params=params)
    return reg, truth, part


def cross_framework(reg: Registry, runs: dict[str, tuple[str, str, str]]) -> None:
    """Each labelled run of one framework searched among the other framework's runs of its task only:
    whether its outcome is predicted from runs logged by another framework under other key names (bound
    to the same canonical metrics), against the base rate of that framework's runs of the task."""
    for framework in FRAMEWORKS:
        other = next(f for f in FRAMEWORKS if f != framework)
        rows = []
        for name, (fw, task, truth) in runs.items():
            pool = Counter(v for n, (f, t, v) in runs.items() if f == other and t == task)
            if fw != framework or not pool:
                continue
            res = find_similar(reg, name, k=K, where=f"framework = {other}", same_task=True)
            ns = res.neighbours
            rows.append({"run": name, "truth": truth, "weighted": res.prediction.get("verdict"),
                         "nn1": next((n.verdict for n in ns if n.verdict), None),
                         "majority": majority([n.verdict for n in ns]), "base": pool.most_common(1)[0][0],
                         "full": sum(n.metrics_compared == len(res.metrics) for n in ns), "k": len(ns),
                         "far": bool(res.closeness.get("no_close_match")), "task": task})
        if not rows:
            continue
        answered = [r for r in rows if r["weighted"]]
        print(f"  {framework} runs among {other} runs of their task: {len(rows)} queries; weighted prediction "
              f"answered {len(answered)}/{len(rows)}, right {sum(r['weighted'] == r['truth'] for r in answered)}/"
              f"{len(answered)}; majority@{K} right {sum(r['majority'] == r['truth'] for r in rows)}/{len(rows)}; "
              f"1-NN right {sum(r['nn1'] == r['truth'] for r in rows)}/{len(rows)}; base rate right "
              f"{sum(r['base'] == r['truth'] for r in rows)}/{len(rows)}; neighbours compared on every metric "
              f"{sum(r['full'] for r in rows)}/{sum(r['k'] for r in rows)}; flagged no close match "
              f"{sum(r['far'] for r in rows)}/{len(rows)}")
        for task in sorted({r["task"] for r in rows}):
            rs = [r for r in rows if r["task"] == task]
            ans = [r for r in rs if r["weighted"]]
            print(f"    {task:15} {len(rs):>3} queries: weighted {sum(r['weighted'] == r['truth'] for r in ans)}/"
                  f"{len(ans)} right ({len(ans)} answered), 1-NN {sum(r['nn1'] == r['truth'] for r in rs)}/{len(rs)}, "
                  f"base rate {sum(r['base'] == r['truth'] for r in rs)}/{len(rs)}")
        for r in rows:
            if r["weighted"] and r["weighted"] != r["truth"]:
                print(f"      wrong: {r['run']} truth {r['truth']}, predicted {r['weighted']}")


def majority(verdicts: list[str | None]) -> str | None:
    known = [v for v in verdicts if v]
    if not known:
        return None
    top = Counter(known).most_common()
    tied = {v for v, c in top if c == top[0][1]}
    return next(v for v in known if v in tied)


def evaluate(reg: Registry, truth: dict[str, str | None], part: dict[str, str], same_task: bool,
             prefix: float | None = None, normalize: str = "z") -> dict:
    rows = []
    for name, verdict in truth.items():
        if verdict is None:
            continue
        res = find_similar(reg, name, k=K, same_task=same_task, prefix=prefix, normalize=normalize)
        ns = res.neighbours
        others = Counter(v for n, v in truth.items() if v and n != name)
        if same_task:
            task = reg.run_detail(name)["task"]
            others = Counter(v for n, v in truth.items() if v and n != name and reg.run_detail(n)["task"] == task)
        rows.append({
            "run": name, "part": part.get(name, "?"), "truth": verdict,
            "weighted": res.prediction.get("verdict"), "n_eff": res.prediction.get("effective_neighbours"),
            "agreement": res.prediction.get("agreement"),
            "majority": majority([n.verdict for n in ns]), "nn1": next((n.verdict for n in ns if n.verdict), None),
            "base": others.most_common(1)[0][0] if others else None,
            "closeness": res.closeness, "bandwidth": res.prediction.get("bandwidth"),
            "neighbours": [(n.verdict, n.distance, n.metrics_compared / len(res.metrics)) for n in ns],
            "counts": dict(others),
        })
    return {"rows": rows}


def report(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    print(f"  {'part':9} {'runs':>4}  {'weighted: answered':>18} {'right':>8}  {'majority@10':>11}  {'1-NN':>6}  "
          f"{'base rate':>9}")
    for p in ("tuning", "held_out"):
        rs = [r for r in rows if r["part"] == p]
        if not rs:
            continue
        answered = [r for r in rs if r["weighted"]]
        right = sum(r["weighted"] == r["truth"] for r in answered)
        maj = sum(r["majority"] == r["truth"] for r in rs)
        nn1 = sum(r["nn1"] == r["truth"] for r in rs)
        base = sum(r["base"] == r["truth"] for r in rs)
        print(f"  {p:9} {len(rs):>4}  {len(answered):>10}/{len(rs):<7} {right:>4}/{len(answered):<3}  "
              f"{maj:>7}/{len(rs):<3}  {nn1:>3}/{len(rs):<2}  {base:>5}/{len(rs):<3}")
    for r in rows:
        n_eff = f"{r['n_eff']:.1f}" if r["n_eff"] is not None else "-"
        agree = f"{r['agreement']:.0%}" if r["agreement"] is not None else "-"
        mark = "" if r["weighted"] is None else ("ok" if r["weighted"] == r["truth"] else "WRONG")
        print(f"    {r['run']:24} {r['part']:8} truth {r['truth']:7} weighted {str(r['weighted']):7} {mark:5} "
              f"n_eff {n_eff:>4} agreement {agree:>4} | majority {str(r['majority']):7} 1-NN {str(r['nn1']):7} "
              f"base {r['base']}  [{r['closeness']['status']}]")


def variants(rows: list[dict]) -> None:
    """Other kernel widths and a class-balanced vote, recomputed from the same neighbours: what the
    shipped rule (width 1 x the median nearest-neighbour distance, unbalanced) would gain or lose.
    Not used to choose the shipped rule (8 tuning runs are too few to choose on)."""
    print("  variants (same neighbours; answered / right per part):")
    for factor in (0.25, 0.5, 1.0):
        for balanced in (False, True):
            cells = []
            for p in ("tuning", "held_out"):
                rs = [r for r in rows if r["part"] == p and r["bandwidth"]]
                answered = right = 0
                for r in rs:
                    total = sum(r["counts"].values())
                    votes: dict[str, float] = {}
                    for v, d, cov in r["neighbours"]:
                        if v:
                            w = cov * float(np.exp(-0.5 * (d / (factor * r["bandwidth"])) ** 2))
                            votes[v] = votes.get(v, 0.0) + (w / (r["counts"].get(v, 0) / total) if balanced and
                                                            r["counts"].get(v) else w)
                    mass = sum(cov * float(np.exp(-0.5 * (d / (factor * r["bandwidth"])) ** 2))
                               for v, d, cov in r["neighbours"] if v)
                    if mass >= MIN_EFFECTIVE and votes:
                        answered += 1
                        right += max(votes, key=votes.get) == r["truth"]
                cells.append(f"{p} {answered:>2}/{len(rs)} answered, {right:>2}/{answered} right")
            print(f"    width {factor:<4} x median, {'balanced  ' if balanced else 'unbalanced'}: " + "; ".join(cells))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        reg, truth, part = build(f"sqlite:///{tmp}/real.db")
        n_verdict = Counter(v for v in truth.values() if v)
        print(f"{len(truth)} labelled real runs ({dict(n_verdict)}; {sum(v is None for v in truth.values())} "
              f"borderline without a verdict) + 1 CleanRL run without a verdict; k = {K}")
        every = evaluate(reg, truth, part, same_task=False)
        report(every["rows"], "Leave-one-out outcome prediction, all runs as candidates")
        variants(every["rows"])
        same = evaluate(reg, truth, part, same_task=True)
        report(same["rows"], "Leave-one-out outcome prediction, same task only")
        variants(same["rows"])

        print("\nNo close match (all runs as candidates):")
        far = [r for r in every["rows"] if r["closeness"].get("no_close_match")]
        print(f"  flagged {len(far)} of {len(every['rows'])} queries")
        for r in far:
            print(f"    {r['run']}: {r['closeness']['message']}")
        for name in ("mountaincar_default_s1", "pendulum_default_s1", "acrobot_default_s1"):
            res = find_similar(reg, name, k=K, where="task = CartPole-v1")
            c = res.closeness
            print(f"  {name} among CartPole runs only: best {c['best_distance']:.3f}, reference median "
                  f"{c['median']:.3f}, p95 {c['p95']:.3f} -> {c['status']}")

        print("\nCross-framework: the CleanRL CartPole run among the SB3 runs of its task")
        res = find_similar(reg, "cleanrl_ppo_cartpole", k=3, same_task=True)
        for n in res.neighbours:
            print(f"  #{n.rank} {n.name} ({n.task}, distance {n.distance:.3f}, {n.coverage}) "
                  f"{'; '.join(n.warnings)[:110]}")
        print(f"  {res.closeness['message']}")
        back = find_similar(reg, "cartpole_default_s1", k=K, same_task=True)
        pos = next((n.rank for n in back.neighbours if n.name == "cleanrl_ppo_cartpole"), None)
        print(f"  cartpole_default_s1 -> cleanrl_ppo_cartpole ranks {pos} of {K} "
              f"({next((n.coverage for n in back.neighbours if n.name == 'cleanrl_ppo_cartpole'), 'not found')})")
        reg.close()
        print("\nCross-framework, both labelled sets (SB3 and CleanRL sweeps) in one registry:")
        both, runs = build_both(f"sqlite:///{tmp}/both.db")
        cross_framework(both, runs)
        both.close()

        trl, truth, part = build_trl(f"sqlite:///{tmp}/trl.db")
        n_verdict = Counter(v for v in truth.values() if v)
        print(f"\nThe labelled real TRL GRPO set: {len(truth)} runs ({dict(n_verdict)}; "
              f"{sum(v is None for v in truth.values())} borderline without a verdict), metrics "
              f"{', '.join(find_similar(trl, 'default_s1', k=1).metrics)}")
        report(evaluate(trl, truth, part, same_task=True)["rows"], "TRL: leave-one-out outcome prediction, whole runs")
        report(evaluate(trl, truth, part, same_task=True, prefix=0.3)["rows"],
               "TRL: leave-one-out outcome prediction from each run's first 30% (a run still training)")
        # Shape alone (z-normalised curves) cannot tell a flat batch reward at 0.6 from a slow rise: the
        # same queries on raw levels, for comparison only (the default was not changed on this set).
        for prefix in (None, 0.3):
            rows = evaluate(trl, truth, part, same_task=True, prefix=prefix, normalize="raw")["rows"]
            cells = []
            for p in ("tuning", "held_out"):
                rs = [r for r in rows if r["part"] == p]
                ans = [r for r in rs if r["weighted"]]
                cells.append(f"{p} weighted {sum(r['weighted'] == r['truth'] for r in ans)}/{len(ans)} right "
                             f"({len(ans)}/{len(rs)} answered), 1-NN {sum(r['nn1'] == r['truth'] for r in rs)}/"
                             f"{len(rs)}, base rate {sum(r['base'] == r['truth'] for r in rs)}/{len(rs)}")
            print(f"  normalize=raw, {'whole runs' if prefix is None else 'first 30%'}: " + "; ".join(cells))
        trl.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
