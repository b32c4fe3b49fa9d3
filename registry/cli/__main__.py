"""``python -m registry.cli``: the ``rlreg`` command."""
from registry.cli.main import main

main()
