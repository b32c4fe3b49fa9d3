"""Labelled evaluation of run diagnosis (registry.analysis.diagnosis).

The set: the 4 real stable-baselines3 runs in shared/data/sb3_ppo (labels from its README)
and seeded synthetic runs (registry.demo.synthetic) with one injected anomaly each, >= 20 per
anomaly kind, plus healthy runs. Prints per anomaly kind and per detector: precision,
recall, median detection delay (steps and % of the run), false alarms on healthy runs;
then checks the targets and exits non-zero if one is missed:

* recall >= 0.9 per anomaly kind and per detector, precision >= 0.9 per detector (synthetic);
* no finding of severity warning or above on the healthy real run;
* every anomaly label of the real runs detected;
* diagnosing a 100k-step run with 30 metrics in under 1 second.

A finding counts (true positive) when it is of severity warning or above, its detector is
expected for the run's label (or is a known consequence of it, e.g. entropy collapse after
a KL blow-up) and its step range reaches the label's start (minus 2% of the run). Any
other warning-or-above finding is a false positive; on a healthy run it is a false alarm.
Detection delay = the finding's ``detected_at`` minus the label's start step.

Run: .venv/bin/python bench/diagnose_eval.py [--per-kind N] [--healthy N] [--seed S]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry.analysis.diagnosis import diagnose  # noqa: E402
from registry.analysis.diagnosis.fixtures import default_metric_infos, load_sb3_run  # noqa: E402
from registry.demo.synthetic import ANOMALY_KINDS, generate_run  # noqa: E402

REAL_DIR = ROOT.parent / "shared" / "data" / "sb3_ppo"

#: Detectors that detect each kind.
EXPECTED = {
    "kl_blowup": {"kl_spike", "kl_climb"},
    "entropy_collapse": {"entropy_collapse"},
    "reward_std_zero": {"signal_collapse"},
    "length_hacking": {"length_hacking"},
    "value_loss_flat": {"value_loss_flat"},
    "grad_norm_spikes": {"grad_norm_spikes"},
    "reward_zero": {"reward_zero"},
    "nan": {"nan_inf"},
    "clip_high": {"clip_high"},
    "clip_low": {"clip_low"},
    "policy_loss_growing": {"policy_loss_growing"},
    "advantage_mean_drift": {"advantage_drift"},
    "stagnant": {"reward_flat"},
}
#: Findings that are true consequences of a kind (not false positives).
CONSEQUENCES = {
    "kl_blowup": {"clip_high", "entropy_collapse", "reward_drop", "reward_flat", "reward_zero", "grad_norm_spikes",
                  "signal_collapse", "policy_loss_growing", "clip_low"},
    "entropy_collapse": {"reward_flat", "signal_collapse"},
    "reward_std_zero": {"reward_flat", "advantage_degenerate"},  # an exactly-zero advantage std is both
    "length_hacking": {"reward_flat", "reward_drop"},
    "reward_zero": {"signal_collapse", "reward_drop", "reward_flat", "advantage_degenerate"},
    "clip_high": {"kl_climb", "kl_spike"},
    "clip_low": {"reward_flat", "value_loss_flat"},
    # the injected critic failure stalls the return below its ceiling (a flat value loss beside a return at the
    # task's top is information): its plateau, and an entropy still narrowing beside it, are in the curves
    "value_loss_flat": {"reward_flat", "entropy_collapse"},
}
#: Per-detector recall is measured on the runs of its primary kind (and variant).
PRIMARY = {
    "kl_spike": ("kl_blowup", "spike"), "kl_climb": ("kl_blowup", "ramp"),
    "entropy_collapse": ("entropy_collapse", None), "signal_collapse": ("reward_std_zero", None),
    "length_hacking": ("length_hacking", None), "value_loss_flat": ("value_loss_flat", None),
    "grad_norm_spikes": ("grad_norm_spikes", None), "reward_zero": ("reward_zero", None),
    "nan_inf": ("nan", None), "clip_high": ("clip_high", None), "clip_low": ("clip_low", None),
    "policy_loss_growing": ("policy_loss_growing", None), "advantage_drift": ("advantage_mean_drift", None),
    "reward_flat": ("stagnant", None),
}

#: Real runs: name -> (task, [(detector, first step, last step)] each of which must be found).
REAL = {
    "cartpole_healthy_s0": ("CartPole-v1", []),
    "cartpole_lr_too_high_5e-2": ("CartPole-v1", [("kl_spike", 4096, 4096), ("clip_high", 4096, 4096),
                                                 ("entropy_collapse", 4096, 10240), ("reward_drop", 2048, 10240)]),
    "cartpole_tiny_lr_1e-6": ("CartPole-v1", [("clip_low", 4096, 100352)]),
    "pendulum_default_s0": ("Pendulum-v1", [("reward_flat", 2048, 100352)]),
}

TARGET_RECALL = 0.9
TARGET_PRECISION = 0.9
TIME_BUDGET_S = 1.0


def evaluate_synthetic(per_kind: int, n_healthy: int, seed: int):
    base = default_metric_infos()
    rows = []      # (run, findings>=warning, all findings)
    for kind in ("healthy",) + ANOMALY_KINDS:
        for i in range(n_healthy if kind == "healthy" else per_kind):
            run = generate_run(kind, seed + i)
            d = diagnose(run.curves, run.metric_infos(base), checkpoints=run.checkpoints)
            rows.append((run, d.at_least("warning")))
    tp = defaultdict(int)
    fp = defaultdict(int)
    kind_hits = defaultdict(list)
    kind_delay = defaultdict(list)
    det_hits = defaultdict(list)
    det_delay = defaultdict(list)
    healthy_alarm_runs = 0
    healthy_alarm_by_det = defaultdict(int)
    fp_examples = defaultdict(list)
    miss_examples = defaultdict(list)
    for run, warn in rows:
        steps = run.curves[run.reward_metric].steps
        span = int(steps[-1] - steps[0])
        tol = int(0.02 * span)
        if not run.labels:
            if warn:
                healthy_alarm_runs += 1
            for f in warn:
                fp[f.detector] += 1
                healthy_alarm_by_det[f.detector] += 1
                fp_examples[f.detector].append(f"healthy seed {run.seed}: {f.summary()}")
            continue
        lab = run.labels[0]
        ok_dets = EXPECTED[lab.kind] | CONSEQUENCES.get(lab.kind, set())
        hit = [f for f in warn if f.detector in EXPECTED[lab.kind] and f.end >= lab.start - tol]
        kind_hits[lab.kind].append(bool(hit))
        if hit:
            first = min(hit, key=lambda f: (f.detected_at if f.detected_at is not None else f.start))
            kind_delay[lab.kind].append(max(0, (first.detected_at or first.start) - lab.start) / max(1, span))
            kind_delay[lab.kind + ":steps"].append(max(0, (first.detected_at or first.start) - lab.start))
        else:
            miss_examples[lab.kind].append(f"seed {run.seed} {run.algorithm} {run.task} n={run.n_steps} "
                                           f"start={lab.start} {dict(lab.detail)}: "
                                           + "; ".join(f.summary()[:90] for f in warn[:3]))
        for det, (pk, var) in PRIMARY.items():
            if pk == lab.kind and (var is None or lab.detail.get("variant") == var):
                mine = [f for f in hit if f.detector == det]
                det_hits[det].append(bool(mine))
                if mine:
                    det_delay[det].append(max(0, (mine[0].detected_at or mine[0].start) - lab.start))
        for f in warn:
            if f.detector in ok_dets and f.end >= lab.start - tol:
                tp[f.detector] += 1
            else:
                fp[f.detector] += 1
                fp_examples[f.detector].append(f"{lab.kind} seed {run.seed} ({run.algorithm}, start {lab.start}): "
                                               f"{f.summary()}")
    n_healthy_runs = sum(1 for r, _ in rows if not r.labels)
    return dict(tp=tp, fp=fp, kind_hits=kind_hits, kind_delay=kind_delay, det_hits=det_hits, det_delay=det_delay,
                healthy_alarm_runs=healthy_alarm_runs, healthy_alarm_by_det=healthy_alarm_by_det,
                n_healthy=n_healthy_runs, fp_examples=fp_examples, miss_examples=miss_examples, n_runs=len(rows))


def evaluate_real():
    results = []
    if not REAL_DIR.is_dir():
        return None
    for name, (task, labels) in REAL.items():
        d = diagnose(load_sb3_run(REAL_DIR / name), default_metric_infos(task))
        warn = d.at_least("warning")
        found = []
        for det, lo, hi in labels:
            ok = any(f.detector == det and f.start <= hi and f.end >= lo for f in warn)
            found.append((det, ok))
        results.append((name, labels, found, warn, d))
    return results


def time_large() -> tuple[float, int, int]:
    run = generate_run("grad_norm_spikes", seed=7, algorithm="grpo", n_steps=100_000, n_extra_metrics=15)
    infos = run.metric_infos()
    diagnose(run.curves, infos)          # warm-up (imports, caches)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        diagnose(run.curves, infos, checkpoints=run.checkpoints)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), len(run.curves), run.n_steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=24)
    ap.add_argument("--healthy", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--verbose", action="store_true", help="print misses and false positives")
    args = ap.parse_args(argv)
    failures = []
    t0 = time.perf_counter()
    r = evaluate_synthetic(args.per_kind, args.healthy, args.seed)
    elapsed = time.perf_counter() - t0
    print(f"synthetic set: {r['n_runs']} runs ({args.per_kind} per anomaly kind x {len(ANOMALY_KINDS)} kinds, "
          f"{r['n_healthy']} healthy), evaluated in {elapsed:.1f} s\n")
    print(f"{'anomaly kind':<22}{'runs':>6}{'recall':>8}{'median delay (% run)':>22}{'median delay (steps)':>22}")
    for kind in ANOMALY_KINDS:
        hits = r["kind_hits"][kind]
        rec = float(np.mean(hits)) if hits else float("nan")
        dl = r["kind_delay"][kind]
        ds = r["kind_delay"][kind + ":steps"]
        print(f"{kind:<22}{len(hits):>6}{rec:>8.2f}{(100 * np.median(dl) if dl else float('nan')):>21.1f}%"
              f"{(np.median(ds) if ds else float('nan')):>22.0f}")
        if not hits or rec < TARGET_RECALL:
            failures.append(f"recall {rec:.2f} < {TARGET_RECALL} for anomaly kind {kind}")
    print()
    dets = sorted(set(r["tp"]) | set(r["fp"]) | set(PRIMARY))
    print(f"{'detector':<22}{'TP':>6}{'FP':>6}{'precision':>11}{'recall':>8}{'median delay':>14}"
          f"{'healthy FA rate':>17}")
    for det in dets:
        tp_, fp_ = r["tp"][det], r["fp"][det]
        prec = tp_ / (tp_ + fp_) if tp_ + fp_ else float("nan")
        hits = r["det_hits"].get(det, [])
        rec = float(np.mean(hits)) if hits else float("nan")
        dl = r["det_delay"].get(det, [])
        fa = r["healthy_alarm_by_det"][det] / max(1, r["n_healthy"])
        print(f"{det:<22}{tp_:>6}{fp_:>6}{prec:>11.2f}{rec:>8.2f}{(np.median(dl) if dl else float('nan')):>14.0f}"
              f"{fa:>17.3f}")
        if tp_ + fp_ and prec < TARGET_PRECISION:
            failures.append(f"precision {prec:.2f} < {TARGET_PRECISION} for detector {det}")
        if hits and rec < TARGET_RECALL:
            failures.append(f"recall {rec:.2f} < {TARGET_RECALL} for detector {det}")
    all_tp, all_fp = sum(r["tp"].values()), sum(r["fp"].values())
    overall_rec = float(np.mean([h for k in ANOMALY_KINDS for h in r["kind_hits"][k]]))
    print(f"\noverall: precision {all_tp / max(1, all_tp + all_fp):.3f}, recall {overall_rec:.3f}, "
          f"healthy runs with a false alarm: {r['healthy_alarm_runs']}/{r['n_healthy']} "
          f"({r['healthy_alarm_runs'] / max(1, r['n_healthy']):.3f})")
    if args.verbose:
        for det, ex in r["fp_examples"].items():
            for e in ex[:5]:
                print(f"  FP {det}: {e}")
        for kind, ex in r["miss_examples"].items():
            for e in ex[:5]:
                print(f"  MISS {kind}: {e}")

    print("\nreal SB3 runs:")
    real = evaluate_real()
    if real is None:
        print(f"  (skipped: {REAL_DIR} not found)")
    else:
        for name, labels, found, warn, d in real:
            status = "ok"
            if not labels and warn:
                status = "FAIL"
                failures.append(f"{name}: {len(warn)} finding(s) of severity warning or above on a healthy run")
            for det, ok in found:
                if not ok:
                    status = "FAIL"
                    failures.append(f"{name}: label {det} not detected")
            print(f"  {name:<28} {status}: expected {[x[0] for x in labels] or 'nothing'}; "
                  f"found {[f.detector for f in warn] or 'nothing'} "
                  f"({len(d.findings) - len(warn)} info)")

    secs, n_metrics, n_steps = time_large()
    print(f"\ntiming: {n_steps} steps x {n_metrics} metrics diagnosed in {secs * 1000:.0f} ms "
          f"= {secs / TIME_BUDGET_S:.2f} of the {TIME_BUDGET_S:.0f} s budget")
    if secs >= TIME_BUDGET_S:
        failures.append(f"diagnosing {n_steps} steps x {n_metrics} metrics took {secs:.2f} s >= {TIME_BUDGET_S} s")

    if failures:
        print("\nTARGETS MISSED:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("\nall targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
