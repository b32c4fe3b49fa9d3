"""What every detector family shares: the cap on findings per metric."""
from __future__ import annotations


from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.types import Finding


def top(findings: list[Finding], ctx: Context, key: str) -> list[Finding]:
    """Keep the ``max_findings_per_metric`` findings with the largest ``evidence[key]``."""
    k = ctx.s.max_findings_per_metric
    if len(findings) <= k:
        return findings
    keep = sorted(findings, key=lambda f: -abs(f.evidence.get(key, 0.0)))[:k]
    return sorted(keep, key=lambda f: f.start)
