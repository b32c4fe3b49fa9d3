"""Objective-layer detector of a reward that falls: a sudden drop, or a slide back from its best over
several updates; a fall the run climbed back out of, with no sign of unstable updates over it, is
information."""
from __future__ import annotations

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.signal import (
    TINY,
    Series,
    merge_close,
    noise_sigma,
    rolling_median,
    runs,
    shift,
    trend_noise_sigma,
)
from registry.analysis.diagnosis.types import Finding
from registry.analysis.diagnosis.detectors.common import (
    instability_words,
    range_words,
    reward_level,
    rolling_reward_level,
    top,
    unstable_updates,
)


def detect_reward_drop(ctx: Context) -> list[Finding]:
    name = ctx.first("reward")
    if name is None:
        return []
    opened = ctx.opening(name)
    if opened is None:
        return []
    sr, n, M = opened
    hib = ctx.higher_is_better(name)
    sign = 1.0 if hib else -1.0
    y = sign * sr.y
    settled = ctx.settled_from(name)
    if settled is not None:
        # Points before the mean averages enough episodes take its first settled value: they are
        # neither a level the run fell from nor a best it slid back from.
        i0 = int(np.searchsorted(sr.steps, settled, side="left"))
        if i0 >= n - M:
            return []
        y = np.concatenate([np.full(i0, y[i0]), y[i0:]])
    low, high = ctx.range(name)
    floor = (low if hib else (None if high is None else -high))
    B = max(3, ctx.window(name, sr))
    before = shift(rolling_median(y, B, "trailing"), 1)
    after = rolling_median(y, M, "leading")
    if floor is not None:
        den = np.where(before > floor, before - floor, np.abs(before))
    else:
        den = np.abs(before)
    # Noise: the run's own point-to-point noise, or the local noise just before the point
    # (just after the drop window for the first points), whichever is larger.
    noise = np.full(n, noise_sigma(y))
    if n >= 6:
        dd = np.abs(np.diff(y)) * 1.4826 / np.sqrt(2.0)
        K = max(3 * M, 2 * B)
        rm, lm = rolling_median(dd, K, "trailing"), rolling_median(dd, K, "leading")
        idx = np.arange(n)
        local = np.where(idx >= 2, rm[np.clip(idx - 2, 0, n - 2)], lm[np.clip(idx + M, 0, n - 2)])
        noise = np.maximum(noise, local)
    drop = before - after
    idx = np.arange(n)
    cond = (drop >= ctx.s.drop_frac * den) & (drop >= ctx.s.drop_noise_k * noise) & (den > TINY) \
        & (idx <= n - M) & (drop > 0)
    found = []
    for a, b in merge_close(runs(cond), M):
        lo_k, hi_k = max(a, 1), min(n - 1, a + M)
        if hi_k >= lo_k:
            c = lo_k + int(np.argmax(y[lo_k - 1:hi_k] - y[lo_k:hi_k + 1]))
        else:
            c = a
        lvl_before, lvl_after = float(before[a]), float(after[a])
        thr = lvl_before - 0.5 * (lvl_before - lvl_after)
        low_mask = y[c:] < thr
        seg = runs(low_mask)
        end = c + (seg[0][1] if seg and seg[0][0] == 0 else 0)
        lost = (lvl_before - lvl_after) / max(float(den[a]), TINY)
        regained = _regained_level(y, end, M, lvl_before)
        unstable = unstable_updates(ctx, sr.step(c), sr.step_end(end))
        if regained is not None and not unstable:
            found.append(_recovered_dip(ctx, name, sr, c, end, sign, lvl_before, lvl_after, regained, lost))
            continue
        sev = "critical" if lost >= 0.8 or end == n - 1 and lost >= 0.5 else "warning"
        found.append(ctx.finding(
            "reward_drop", name, sr.step(c), sr.step_end(end), sev,
            f"reward fell suddenly from {sign * lvl_before:.4g} to {sign * lvl_after:.4g} "
            f"({100 * lost:.0f}% of its level above the floor) and "
            + ("stayed down" if regained is None else
               f"climbed back to {sign * regained:.4g} by the end, but {instability_words(unstable)} over the fall "
               "say the updates caused it"),
            evidence={"level_before": sign * lvl_before, "level_after": sign * lvl_after,
                      "fraction_lost": lost, "noise_sigma": float(noise[a]),
                      "floor": floor if floor is not None else float("nan")},
            causes=["a destructive policy update (learning rate too high, KL blow-up)",
                    "policy collapse (entropy fell to zero)",
                    "a change in the reward function or data distribution"],
            check=["KL and clip fraction just before the drop", "entropy around the drop",
                   "reward components and sample outputs after the drop"],
            action="resume from a checkpoint before the drop with a lower learning rate or a stronger KL penalty",
            detected_at=sr.step(min(c + M - 1, n - 1)), related=["kl_old_mean", "entropy"]))
    if not any(f.at_least("warning") for f in found):
        # Only dips the run climbed out of so far: a later slide may still stay (a recovered dip it
        # already reported is not said twice).
        slid = _reward_regression(ctx, name, sr, y, sign, low, high)
        found += [f for f in slid if f.at_least("warning") or not any(g.start <= f.end and f.start <= g.end
                                                                         for g in found)]
    return top(found, ctx, "fraction_lost")


def _reward_regression(ctx: Context, name: str, sr: Series, y: np.ndarray, sign: float, low: float | None,
                       high: float | None) -> list[Finding]:
    """A reward that climbed and then slid back over several updates: a drop too gradual for the
    sudden-drop test, whose noise estimate the fast climb before it inflates.

    The smoothed reward falls below its running best by at least ``drop_frac`` of what the run had
    gained over its early level, and by at least ``regress_min_range_frac`` of a scale, for
    ``persist`` points. The scale is the healthy (task) range's width; without a range it is the
    reward's own magnitude (the larger of its early level and its best so far), the yardstick
    :func:`detect_reward_flat` uses for a relative improvement. Either says what a large loss is
    where the noise estimate cannot (a windowed episode mean is smooth). The magnitude is the weaker
    yardstick, so without a range the loss must also still stand at the run's last point (a slide
    back, not a dip the run climbed out of: a slow early phase wobbles by a good share of it) and be
    ``drop_noise_k`` times the reward's noise (a noisy batch reward's running best is a lucky batch,
    not a level the run reached). The noise is read from second differences, because in
    point-to-point steps the climb and the slide themselves would count as noise.
    """
    st = ctx.s
    n = sr.n
    if n < st.min_points_to_judge:
        return []
    ranged = low is not None and high is not None and high > low
    window = max(3, ctx.window(name, sr))
    s = rolling_reward_level(ctx, y, window, "centered")
    y0 = reward_level(ctx, y[:ctx.early(n)])
    best = np.maximum.accumulate(s)
    gain, lost = best - y0, best - s
    scale = np.full(n, high - low) if ranged else np.maximum(abs(y0), np.abs(best))
    cond = (gain > 0) & (lost >= st.drop_frac * gain) & (lost >= st.regress_min_range_frac * scale) & (scale > TINY)
    if not ranged:
        cond &= lost >= st.drop_noise_k * trend_noise_sigma(y)
    elif ctx.run_kind != "control":
        # A language model's reward is a batch mean over a few completions: even smoothed over the window its
        # running best is partly a lucky stretch, so the loss must also clear the smoothed curve's own noise.
        cond &= lost >= st.drop_noise_k * trend_noise_sigma(y) / np.sqrt(window)
    M = ctx.persist(n)
    out = []
    spans = runs(cond, M) if ranged else [(a, b) for a, b in runs(cond, M) if b == n - 1]
    # The first slide that stays (or that unstable updates caused) is the finding; slides the run climbed
    # out of before it are said as information, and do not hide it.
    for a, b in spans:
        peak = int(np.argmax(s[:a + 1]))
        worst = a + int(np.argmin(s[a:b + 1]))
        share = float(lost[worst] / gain[worst])
        regained = _regained_level(y, b, M, float(s[peak]))
        unstable = unstable_updates(ctx, sr.step(peak), sr.step_end(b))
        if regained is not None and not unstable:
            out.append(_recovered_dip(ctx, name, sr, peak, b, sign, float(s[peak]), float(s[worst]), regained,
                                      share))
            continue
        frac = float(lost[worst] / scale[worst])
        yardstick = range_words(ctx, name) if ranged else "its magnitude; no task range"
        out.append(ctx.finding(
            "reward_drop", name, sr.step(peak), sr.step_end(b), "critical" if share >= 0.8 else "warning",
            f"reward slid back from its best {sign * float(s[peak]):.4g} to {sign * float(s[worst]):.4g} over "
            f"{(worst - peak) * sr.bin_size} points, "
            + (f"losing {100 * share:.0f}% of what the run had gained " if share < 1 else
               f"below its early level {sign * y0:.4g} ")
            + f"({100 * frac:.0f}% of {yardstick})"
            + ("" if regained is None else f"; it climbed back to {sign * regained:.4g} by the end, but "
               f"{instability_words(unstable)} over the slide say the updates caused it"),
            evidence={"level_before": sign * float(s[peak]), "level_after": sign * float(s[worst]),
                      "fraction_lost": share, "gradual": 1.0,
                      ("range_fraction_lost" if ranged else "magnitude_fraction_lost"): frac},
            causes=["updates too large for this task (learning rate too high, too many epochs)",
                    "policy collapse (entropy fell to zero)", "a change in the reward function or data distribution"],
            check=["KL and clip fraction from the best point on", "entropy around the slide"],
            action="resume from a checkpoint near the best point with a lower learning rate or fewer epochs",
            detected_at=sr.step(min(a + M - 1, n - 1)), related=["kl_old_mean", "clip_fraction"]))
        break
    return out


def _regained_level(y: np.ndarray, end: int, M: int, level: float) -> float | None:
    """The run's final level (median of its last ``M`` points) when a fall that ended at ``end``
    was climbed out of: the run ends at or above the level it fell from. ``None`` when it did not,
    or when the fall reaches into the last points (a run still down, or still training)."""
    n = len(y)
    if end >= n - M:
        return None
    final = float(np.median(y[n - M:]))
    return final if final >= level else None


def _recovered_dip(ctx: Context, name: str, sr: Series, start: int, end: int, sign: float, level_before: float,
                   level_after: float, final: float, lost: float) -> Finding:
    """A fall the run climbed out of, past the level it fell from, with no sign of unstable updates
    over it: information, not a problem. PPO returns dip and recover mid-run (an unlucky batch of
    updates, a state region being re-learnt); what a user acts on is a fall that stays, or one the
    KL, clip fraction or entropy say the updates caused."""
    return ctx.finding(
        "reward_drop", name, sr.step(start), sr.step_end(end), "info",
        f"reward dipped from {sign * level_before:.4g} to {sign * level_after:.4g} ({100 * lost:.0f}% of its gain "
        f"or level) and recovered: it ends at {sign * final:.4g}, at or above where it fell from",
        evidence={"level_before": sign * level_before, "level_after": sign * level_after, "fraction_lost": lost,
                  "final_level": sign * final, "recovered": 1.0},
        check=["KL and clip fraction around the dip, if it recurs"], related=["kl_old_mean", "clip_fraction"])
