"""The values a run's fields and a registration's options may take (no heavy imports: the CLI's
option choices are built from these at start-up)."""
from __future__ import annotations

RUN_STATUSES = ("running", "finished", "crashed", "incomplete")
VERDICTS = ("success", "failed", "diverged", "inconclusive")

# What a registration does with a step that is not after the previous one (see core.series).
ORDER_POLICIES = ("keep-all", "keep-last", "error")
DEFAULT_ORDER_POLICY = "keep-all"
