"""Core: what every other layer shares and that needs nothing but NumPy and the standard library.

Errors, the series codec and in-memory series, metric semantics vocabulary, hyperparameter
flattening, JSON-safe values, limits and downsampling. Anything in ``registry`` may import it;
it imports nothing else of ``registry``.
"""
