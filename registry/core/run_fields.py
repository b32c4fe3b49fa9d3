"""The values a run's fields and a registration's options may take (no heavy imports: the CLI's
option choices are built from these at start-up)."""
from __future__ import annotations

RUN_STATUSES = ("running", "finished", "crashed", "incomplete")
VERDICTS = ("success", "failed", "diverged", "inconclusive")
# Run columns a listing can be ordered by (besides param.KEY and metric.NAME.STAT).
ORDERABLE_FIELDS = ("created_at", "updated_at", "name", "project", "algorithm", "framework", "task", "status", "verdict")

# What a registration does with a step that is not after the previous one (see core.series).
ORDER_POLICIES = ("keep-all", "keep-last", "error")
DEFAULT_ORDER_POLICY = "keep-all"
