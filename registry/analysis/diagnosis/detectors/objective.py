"""Objective-layer detectors: the reward becoming zero or constant, staying flat or rising slowly; the advantage
drifting. A falling reward is ``reward_falls``."""
from __future__ import annotations

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.signal import (
    TINY,
    Series,
    rank_corr,
    rolling_median,
    runs,
)
from registry.analysis.diagnosis.types import Finding
from registry.analysis.diagnosis.detectors.common import (
    by_chance,
    gain_in_standard_errors,
    range_words,
    reward_level,
    reward_still_rising,
    top,
)


# ---------------------------------------------------------------------------------------
# Reward: becomes zero or constant; flat (stagnant)
# ---------------------------------------------------------------------------------------
def detect_reward_zero(ctx: Context) -> list[Finding]:
    out = []
    for name in ctx.role("reward_family"):
        opened = ctx.opening(name)
        if opened is None:
            continue
        sr, n, M = opened
        y = sr.y
        scale = float(np.quantile(np.abs(y), 0.9))
        if scale <= 0:
            continue
        tol = ctx.s.zero_rel_tol * scale
        found: list[Finding] = []
        zero = np.abs(y) <= tol
        for a, b in runs(zero, M):
            if a == 0:
                continue
            pre = y[max(0, a - M):a]
            if np.median(np.abs(pre)) <= tol or by_chance(ctx, zero, a, b):
                continue
            to_end = b == n - 1
            found.append(ctx.finding(
                "reward_zero", name, sr.step(a), sr.step_end(b), "critical" if to_end else "warning",
                f"reward dropped to zero from {float(np.median(pre)):.4g} and "
                + ("stays there" if to_end else f"stayed there for {b - a + 1} points"),
                evidence={"level_before": float(np.median(pre)), "level_after": float(np.median(y[a:b + 1])),
                          "points": (b - a + 1) * sr.bin_size, "persists_to_end": float(to_end)},
                causes=(["the reward function crashed or returns a default of 0",
                         "the environment or its reward wrapper changed (episodes end at once)"]
                        if ctx.run_kind == "control" else
                        ["the reward function crashed or returns a default of 0",
                         "the data pipeline feeds empty/truncated responses or wrong labels",
                         "a reward-model server stopped answering"]),
                check=["raw reward-function outputs for a batch at this step",
                       "reward components (accuracy/format) and response samples",
                       "logs of the reward service / dataset loader around this step"],
                action="fix the reward function or data pipeline before training further",
                detected_at=sr.step(min(a + M - 1, n - 1)),
                related=["reward_std", "advantage_std"]))
        const = np.concatenate([[False], np.abs(np.diff(y)) <= ctx.s.constant_rel_tol * scale])
        worst = float(np.min(y)) if ctx.higher_is_better(name) else float(np.max(y))
        for a, b in runs(const, M):
            a0 = a - 1                               # first point of the constant stretch
            level = float(y[a])
            if a0 == 0 or abs(level) <= tol or ctx.reward_saturated(name, level):
                continue
            pre = y[max(0, a0 - M):a0]
            to_end = b == n - 1
            if ctx.run_kind == "control":
                found.append(_episode_stats_constant(ctx, name, sr, a0, b, level, pre, worst, to_end))
                continue
            if level >= float(np.max(y)) - tol or by_chance(ctx, np.abs(y - level) <= tol, a0, b):
                # The best value the reward ever took, held by every sample of the batch (a component such as a
                # format check that every completion passes: TRL's rewards/format_reward/mean at 1), or a value
                # a batch mean takes often enough to repeat by chance: not a fault.
                continue
            found.append(ctx.finding(
                "reward_zero", name, sr.step(a0), sr.step_end(b), "critical" if to_end else "warning",
                f"reward became exactly constant at {level:.4g} (below its ceiling) for {b - a0 + 1} points",
                evidence={"level_before": float(np.median(pre)), "constant_level": level,
                          "points": (b - a0 + 1) * sr.bin_size, "persists_to_end": float(to_end)},
                causes=["the reward function returns a fixed default (exception swallowed, format penalty only)",
                        "the same batch is replayed (data loader stuck)",
                        "metric logging is stale (the value is not recomputed)"],
                check=["raw reward-function outputs and a few responses at this step",
                       "whether prompts/batches change between steps",
                       "reward components (accuracy/format)"],
                action="fix the reward function or data pipeline before training further",
                detected_at=sr.step(min(a0 + M - 1, n - 1))))
        out.extend(top(found, ctx, "points"))
    return out


def _episode_stats_constant(ctx: Context, name: str, sr, a0: int, b: int, level: float, pre: np.ndarray,
                            worst: float, to_end: bool) -> Finding:
    """An episode return that repeats exactly over a stretch of a control run.

    Episode statistics repeat legitimately: SB3 logs ``rollout/ep_rew_mean`` as
    ``safe_mean([ep_info["r"] for ep_info in self.ep_info_buffer])``, a deque of the last
    ``stats_window_size`` (100) finished episodes extended only when an episode ends
    (stable-baselines3 2.9.2, common/on_policy_algorithm.py ``_dump_logs``, common/base_class.py
    ``_setup_learn`` / ``_update_info_buffer``), so the value repeats whenever no new episode
    changed the window; a per-episode log repeats when episodes end alike. The return is the
    environment's own, so "a reward function returning a default" does not apply. A repeat at
    the run's worst level after it had been better is a policy stuck failing every episode the
    same way, and a repeat that lasts to the end of the run has stopped moving for good: both
    are problems. A repeat in between, after which the return moves again, says only that the
    statistic was not re-measured for a while (information).
    """
    n = sr.n
    span = max(float(np.ptp(sr.y)), TINY)
    at_worst = abs(level - worst) <= 0.02 * span and float(np.median(pre)) != level
    points = (b - a0 + 1) * sr.bin_size
    ev = {"level_before": float(np.median(pre)), "constant_level": level, "points": points,
          "persists_to_end": float(to_end), "run_worst": worst}
    lname = "episode_length_mean" if name != "episode_length_mean" else None
    if lname is not None and ctx.series(lname) is not None:
        lv = ctx.values_between(lname, sr.step(a0), sr.step_end(b))
        if lv.size:
            ev["episode_length_min"], ev["episode_length_max"] = float(lv.min()), float(lv.max())
    if not at_worst and not to_end:
        return ctx.finding(
            "reward_zero", name, sr.step(a0), sr.step_end(b), "info",
            f"episode return repeated exactly at {level:.4g} for {b - a0 + 1} points: the mean over the last "
            f"finished episodes did not change (no new episode entered the window, or the new ones ended alike)",
            evidence=ev, check=["episode length over the same steps"],
            action="nothing to fix: the statistic was not re-measured, not the reward",
            detected_at=sr.step(min(a0 + ctx.persist(n) - 1, n - 1)))
    where = "the run's worst level" if at_worst else "to the end of the run"
    return ctx.finding(
        "reward_zero", name, sr.step(a0), sr.step_end(b), "critical" if to_end else "warning",
        f"episode return stuck exactly at {level:.4g} ({where}) for {b - a0 + 1} points after "
        f"{float(np.median(pre)):.4g}: every episode in the window ends the same way, or none ends",
        evidence=ev,
        causes=["the policy collapsed to one behaviour that ends every episode alike (entropy near 0)",
                "episodes all run into the time limit without reaching the goal",
                "the environment or its reward wrapper changed (every episode scored alike)"],
        check=["entropy and KL just before the stretch", "episode length (at the time limit?)"],
        action="resume from a checkpoint before the collapse with the cause below fixed",
        detected_at=sr.step(min(a0 + ctx.persist(n) - 1, n - 1)), related=["entropy", "episode_length_mean"])


def detect_reward_flat(ctx: Context) -> list[Finding]:
    name = ctx.first("reward")
    # A drop or a stuck reward speaks for the reward; an episode mean merely not re-measured for a few
    # updates (reward_zero as information) says nothing about whether the run learned. A language model's
    # reward component that hit zero for a while (its accuracy, during a blow-up) does not speak for the
    # total over the run, nor does a fall of the total it climbed out of (a blow-up at steps 62-86 of 300).
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    to_the_end = sr.step_end(max(0, n - 1 - ctx.persist(n)))
    if any(f.at_least("warning") and (ctx.run_kind == "control" or f.metric == name and f.end >= to_the_end)
           for d in ("reward_drop", "reward_zero") for f in ctx.overlapping(d, -2**62, 2**62)):
        return []
    if n < 6:
        return []
    hib = ctx.higher_is_better(name)
    sign = 1.0 if hib else -1.0
    y = sign * sr.y
    low, high = ctx.range(name)
    if not hib:
        low, high = (None if high is None else -high), (None if low is None else -low)
    st = ctx.s

    def judge(p: int) -> tuple[bool, float, float, float, float, tuple[float, float] | None, float | None]:
        e = ctx.early(p)
        early, late = reward_level(ctx, y[:e]), reward_level(ctx, y[p - e:p])
        kept = _entropy_kept(ctx, sr, p)
        if low is not None and high is not None and high > low:
            width = high - low
            imp, level = (late - early) / width, (late - low) / width
            enough = st.flat_unsharpened_improvement if kept else st.flat_min_improvement
            return imp < enough and level < st.flat_max_level, early, late, imp, level, kept, None
        rel = (late - early) / max(abs(early), abs(late), TINY)
        enough = st.flat_unsharpened_improvement if kept else st.flat_min_rel_improvement
        t = gain_in_standard_errors(ctx, y[:e], y[p - e:p])
        return (rel < enough or t is not None and t < st.flat_llm_gain_se), early, late, rel, float("nan"), kept, t

    flat, early, late, imp, level, kept, t = judge(n)
    if not flat:
        return _reward_plateau(ctx, name, sr, y, sign, low, high)
    healthy_gain = _healthy_runs_gain(ctx, name)
    if healthy_gain is not None and sign * (late - early) >= 0.5 * healthy_gain:
        return []
    grid = np.unique(np.linspace(max(6, min(n, st.flat_min_points)), n, num=20).round().astype(int))
    ok = np.array([judge(int(p))[0] for p in grid])
    bad = np.flatnonzero(~ok)
    p_first = int(grid[bad[-1] + 1]) if bad.size else int(grid[0])
    sev = "warning" if n >= st.flat_min_points else "info"
    ranged = not np.isnan(level)
    title = (f"reward barely improves: {sign * early:.4g} -> {sign * late:.4g}"
             + (f" ({100 * imp:.1f}% of {range_words(ctx, name)}, at {100 * level:.0f}% of it)" if ranged
                else f" ({100 * imp:.1f}% relative, {t:.1f} standard errors of its batch noise: a gain chance "
                     f"could make)" if t is not None and t < st.flat_llm_gain_se
                else f" ({100 * imp:.1f}% relative)")
             + (f", and the policy ends as random as it started (entropy {kept[0]:.3g} -> {kept[1]:.3g})"
                if kept else ""))
    return [ctx.finding(
        "reward_flat", name, sr.step(0), sr.step_end(n - 1), sev, title,
        evidence={"early_level": sign * early, "late_level": sign * late, "improvement": imp,
                  "level_in_range": level, "range_low": low if low is not None else float("nan"),
                  "range_high": high if high is not None else float("nan"),
                  "entropy_early": kept[0] if kept else None, "entropy_late": kept[1] if kept else None},
        causes=["the learning rate or update size is too small (see clip fraction / KL)",
                "the reward is too sparse for the exploration the policy does",
                "the algorithm's defaults do not suit the task (e.g. PPO defaults on Pendulum)",
                "entropy is collapsing before the task is learned"],
        check=["advantage std and reward std (is there a learning signal?)",
               "entropy trend", "clip fraction and KL (is the policy moving at all?)",
               "runs of the same task that succeeded (baseline)"],
        action="tune the task's hyper-parameters (learning rate, batch/rollout size, gamma, "
               "entropy bonus) or shape the reward; compare with a solved configuration",
        detected_at=sr.step_end(p_first - 1), layer=ctx.layer(name))]


def _healthy_runs_gain(ctx: Context, name: str) -> float | None:
    """What the task's healthy runs gained (their late band's mean over their early one's) when a
    language model's reward is judged against a baseline; None otherwise. A batch reward over a few
    completions spreads its healthy band over its noise, so a range learned from it is far wider than
    what runs gain, and a healthy seed's slow rise reads as flat on it; half the healthy runs' own gain is
    the yardstick there. A control run's windowed episode mean has a band close to its level."""
    base = ctx.baseline
    if ctx.run_kind == "control" or base is None or getattr(base, "weak", False) or name not in base.metrics:
        return None
    mb = base.metrics[name]
    if mb.early is None or mb.late is None:
        return None
    early, late = ((mb.early.mean, mb.late.mean) if mb.early.mean is not None and mb.late.mean is not None
                   else (mb.early.median, mb.late.median))
    gain = (late - early) * (1.0 if ctx.higher_is_better(name) else -1.0)
    return gain if gain > 0 else None


def _entropy_kept(ctx: Context, reward: Series, p: int) -> tuple[float, float] | None:
    """(early, late) entropy over the reward's first ``p`` points when a control run's policy ended
    as random as it started; None otherwise (an LLM's token entropy often stays level in healthy
    training, and a policy that sharpened has learned something however slowly its reward moves)."""
    if ctx.run_kind != "control" or p < ctx.s.flat_min_points:
        return None
    name = ctx.first("entropy")
    if name is None:
        return None
    e = ctx.early(p)
    # As it started: its first few updates, not the early window's median (over a long run's first 15%
    # a policy that learns has already sharpened, and "as random as that" would be a learned policy).
    first = ctx.values_between(name, reward.step(0), reward.step_end(e - 1))
    first = first[:ctx.persist(ctx.series(name).n)]
    early = float(np.median(first)) if first.size else None
    late = ctx.median_between(name, reward.step(p - e), reward.step_end(p - 1))
    if early is None or late is None or early <= TINY or late <= TINY:
        return None  # a Gaussian policy's entropy can be negative: a ratio would mean nothing
    return (early, late) if late >= ctx.s.flat_entropy_kept * early else None


def _reward_plateau(ctx: Context, name: str, sr, y: np.ndarray, sign: float, low: float | None,
                    high: float | None) -> list[Finding]:
    """A reward that learned, then stopped improving well below its task range's top.

    Judged only for control tasks with a task range: over the last ``plateau_frac`` of the
    run the smoothed reward gains less than ``flat_min_improvement`` of the range while it
    sits below ``flat_max_level`` of it. Without a range a plateau cannot be told from
    convergence; for language-model tasks the range's top (every answer right) is rarely
    reached, so a plateau below it is usually convergence too.
    """
    st = ctx.s
    n = sr.n
    info = ctx.metrics.get(name)
    if info is None or info.healthy_low is None or info.healthy_high is None:
        return []                        # only the dictionary's task range says where the top is
    if ctx.run_kind != "control" or low is None or high is None or high <= low or n < st.flat_min_points:
        return []
    width = high - low
    tail = max(st.persist_min_points * 2, int(round(st.plateau_frac * n)))
    if tail >= n:
        return []
    s = rolling_median(y, max(3, ctx.window(name, sr)), "centered")
    seg = s[n - tail:]
    last = float(np.median(y[n - max(1, tail // 4):]))
    gain = (float(np.max(seg[-max(1, tail // 4):])) - float(seg[0])) / width
    level = (last - low) / width
    if gain >= st.flat_min_improvement or level >= st.flat_max_level:
        return []
    if rank_corr(seg) >= st.plateau_max_corr:
        return []                            # still rising steadily, only slowly: not a plateau yet
    best = float(np.max(seg))
    gained = best - float(np.median(y[:ctx.early(n)]))
    if gained > 0 and best - last >= st.drop_frac * gained:
        return []        # fallen at the end by what a slide must lose, not holding: that is the falls detector's
    start = sr.step(n - tail)
    held = sign * last
    annealed = _annealed_with_default_settings(ctx, start, sr.step_end(n - 1))
    if annealed is not None:
        return [ctx.finding(
            "reward_flat", name, start, sr.step_end(n - 1), "info",
            f"reward stopped improving at {held:.4g} ({100 * level:.0f}% of the task range) over the last "
            f"{tail * sr.bin_size} points ({100 * gain:.1f}% of the range gained) while the learning rate was "
            f"annealed to {100 * annealed:.0f}% of its peak (median over that "
            "stretch), with no setting far from its reference: the schedule slows late progress, and only healthy "
            "runs of this task (a baseline) can tell whether this level is low",
            evidence={"plateau_level": held, "level_in_range": level, "improvement": gain,
                      "plateau_points": tail * sr.bin_size, "learning_rate_share": annealed,
                      "range_low": low, "range_high": high},
            check=["the same task's healthy runs (a baseline): did they end higher?"],
            layer=ctx.layer(name))]
    return [ctx.finding(
        "reward_flat", name, start, sr.step_end(n - 1), "warning",
        f"reward stopped improving at {held:.4g} ({100 * level:.0f}% of "
        f"the task range) over the last {tail * sr.bin_size} points ({100 * gain:.1f}% of the range gained)",
        evidence={"plateau_level": held, "level_in_range": level,
                  "improvement": gain, "plateau_points": tail * sr.bin_size,
                  "range_low": low, "range_high": high},
        causes=["exploration that stays too high (an entropy bonus that keeps the policy random)",
                "the learning rate or update size became too small for further progress",
                "the algorithm's defaults do not suit the task"],
        check=["entropy over the plateau (still near its start?)", "clip fraction and KL",
               "runs of the same task that succeeded (baseline)"],
        action="compare the settings with a configuration that solved this task",
        detected_at=sr.step_end(n - 1), layer=ctx.layer(name))]


def _annealed_with_default_settings(ctx: Context, start: int, end: int) -> float | None:
    """The learning rate's median over steps [start, end] as a share of its peak, when the run's schedule
    had annealed it to ``plateau_lr_annealed`` of that peak or below and no setting read from the run is
    far from its reference; None otherwise. A reference configuration whose learning rate is running out
    slows by design (CleanRL anneals it linearly to zero): its own curves cannot tell that from a plateau.
    A setting far off (a short discount, a single epoch) is evidence the plateau is that setting's doing."""
    name = ctx.first("learning_rate")
    if name is None or ctx.hp is None or not ctx.hp.settings:
        return None
    if ctx.hp.off_reference(ctx.s.cause_setting_factor):
        return None
    lr = ctx.values_between(name, start, end)
    peak = float(np.max(ctx.series(name).y))
    if lr.size == 0 or peak <= TINY:
        return None
    share = float(np.median(lr)) / peak
    return share if share <= ctx.s.plateau_lr_annealed else None


def detect_reward_slow(ctx: Context) -> list[Finding]:
    """A control run's reward still rising at its last logged step while its updates were held back
    from the start: a clip_low warning of a clip fraction near zero from the first rollouts
    (``held_back_from_start``), or updates clipped by a narrow bound although the policy barely moves
    (clip_high's effective clip range). Without a baseline the reward's level cannot say the run is
    slow (a healthy LunarLander run is still rising at 100k steps too); the update size beside it
    can. Runs after the clip-fraction detectors and ``detect_reward_flat``, and says nothing when a
    reward finding already speaks for the reward."""
    name = ctx.first("reward")
    if name is None or any(f.at_least("warning") for d in ("reward_flat", "reward_drop", "reward_zero")
                           for f in ctx.overlapping(d, -2**62, 2**62)):
        return []
    rising = reward_still_rising(ctx)
    if rising is None:
        return []
    sr = ctx.series(name)
    early_end = sr.step_end(ctx.early(sr.n) - 1)
    held = [f for f in ctx.findings if f.at_least("warning") and f.start <= early_end and (
        (f.detector == "clip_low" and f.evidence.get("held_back_from_start"))
        or (f.detector == "clip_high" and "effective_clip_range" in f.evidence))]
    if not held:
        return []
    h = max(held, key=lambda f: f.end - f.start)
    how = (f"the clip fraction stayed at {h.evidence['median']:.3g} from the start (its healthy low is "
           f"{h.evidence['healthy_low']:g})" if h.detector == "clip_low" else
           f"a clip fraction of {h.evidence['median']:.3g} with a KL of {h.evidence['kl_median']:.2g} means a clip "
           f"range of about {h.evidence['effective_clip_range']:.2g}")
    return [ctx.finding(
        "reward_slow", name, sr.step(0), sr.step_end(sr.n - 1), "warning",
        f"learning held back by the update size: {rising.words()}, while {how} over steps {h.start}-{h.end}",
        evidence={"reward_from": rising.level_from, "reward_to": rising.level_to, "rising_corr": rising.corr,
                  "rising_points": rising.points, "held_back_by_clip_low": float(h.detector == "clip_low"),
                  "held_back_start": h.start,
                  "held_back_end": h.end},
        causes=["the learning rate is too small for this task (the policy barely moves per update)",
                "the clip range is too narrow (ordinary updates are cut short)",
                "an entropy bonus large enough to hold the policy near random"],
        check=["learning rate, clip range and entropy coefficient against a configuration that solved this task",
               "KL to the old policy (how far each update moves the policy)"],
        action="enlarge the update (learning rate or clip range, whichever is below its usual value), "
               "or train longer",
        detected_at=sr.step_end(sr.n - 1), related=[h.metric], layer=ctx.layer(name))]


def detect_advantage_drift(ctx: Context) -> list[Finding]:
    found = ctx.first_series("advantage_mean")
    if found is None:
        return []
    name, sr, n = found
    st = ctx.s
    M = ctx.persist(n)
    if n < M + 3:
        return []
    info = ctx.metrics.get(name)
    std_name = ctx.first("advantage_std")
    if info is not None and info.healthy_low is not None and info.healthy_high is not None:
        lo, hi = info.healthy_low, info.healthy_high
    elif std_name is not None:
        lvl = float(np.median(ctx.series(std_name).y))
        lo, hi = -st.drift_frac * lvl, st.drift_frac * lvl
        if hi <= TINY:
            lo, hi = ctx.range(name)
    else:
        lo, hi = ctx.range(name)
    if lo is None or hi is None:
        return []
    s = rolling_median(sr.y, max(3, ctx.window(name, sr)), "centered")
    out = []
    width = max(hi - lo, TINY)
    for a, b in runs((s > hi) | (s < lo), M)[: st.max_findings_per_metric]:
        peak = float(s[a:b + 1][np.argmax(np.abs(s[a:b + 1]))])
        sev = "critical" if peak > hi + 2 * width or peak < lo - 2 * width else "warning"
        out.append(ctx.finding(
            "advantage_drift", name, sr.step(a), sr.step_end(b), sev,
            f"advantage mean drifted from 0 to {peak:.3g} (allowed {lo:.3g}..{hi:.3g})",
            evidence={"peak": peak, "allowed_low": lo, "allowed_high": hi, "points": (b - a + 1) * sr.bin_size},
            causes=["a biased baseline/critic (value function lagging the returns)",
                    "advantage normalisation disabled or computed on the wrong axis",
                    "reward scale changing quickly"],
            check=["advantage std and the value loss", "advantage normalisation settings", "reward scale"],
            action="check advantage normalisation and the critic/baseline",
            detected_at=sr.step(min(n - 1, a + M - 1)), related=["advantage_std", "value_loss"]))
    return out
