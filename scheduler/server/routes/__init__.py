"""The API's routes, one module per resource: ``cluster`` (health, nodes, share, events, history,
metrics), ``users`` (who am I, users and their shares), ``agents`` (heartbeats, agent tokens),
``datasets`` (data sets, their replicas, transfers) and ``jobs``.  ``base`` holds what they share: who
may call a route (``Access``), the ``Routes`` each module declares, and the request helpers.
``scheduler.server.app.create_app`` adds them all to one app behind the gate.
"""
