"""The ``rlreg`` command line, one module per command group. A surface: may import any layer."""
