"""Analysis: diagnosis, health (findings and baselines) and similar-run search.

Reads and writes through the store, and subscribes to the store's hooks when a registry is
opened (:func:`registry.analysis.subscriptions.subscribe`, called by :func:`registry.open_registry`): the store never imports
this layer.
"""
