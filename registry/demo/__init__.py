"""The demo registry (``rlreg demo``) and the synthetic runs it and the tests are built from."""
