"""The web UI and JSON API (a surface): :func:`registry.web.app.create_app` builds the application.

One module per page group (runs and dashboards, dictionary, baselines, plots, auth) and the
JSON API (reads in ``api``, writes and uploads in ``write_api``); ``context`` holds what
views share at request time, ``security`` who may do what.
"""
