"""The ``rlreg`` command: every command group added to the root group.

Each command module imports what its commands need inside them, so that ``rlreg --help``
(which loads every module to list the commands) does not pay for SQLAlchemy, NumPy and the
analysis layer.
"""
from __future__ import annotations

from registry.cli import accounts, analysis, dictionary, runs, serve, transfer
from registry.cli.app import cli
from registry.cli.follow import follow

for command in (runs.init, runs.register, runs.runs, runs.show, runs.outcome, runs.delete,
                dictionary.dictionary, accounts.user, accounts.token, transfer.export_cmd, transfer.import_cmd,
                analysis.diagnose, analysis.similar, analysis.reindex, analysis.baseline,
                serve.demo, serve.serve, follow):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="rlreg")
