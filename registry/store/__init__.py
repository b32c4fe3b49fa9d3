"""The store: the :class:`~registry.store.facade.Registry` facade, its writes and reads, the filter
language, export/import and accounts. Imports core, db, dictionary and importers; publishes
hooks (:mod:`registry.store.hooks`) instead of importing the analysis layer.
"""
