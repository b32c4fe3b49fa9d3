"""The metric dictionary: canonical definitions, framework aliases and the binding of logged keys.

Imports :mod:`registry.core` and :mod:`registry.db`.
"""
