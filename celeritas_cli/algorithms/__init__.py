"""Placement algorithms, one module each, discovered by :mod:`celeritas_cli.registry`.

Three families, one subpackage each, and ``auto`` over all of them:

- :mod:`.placers`: the papers' operator placers (Celeritas, Moirai, FastT,
  FD-DPS, the Hierarchical Planner) and their baselines;
- :mod:`.pipelines`: pipeline planners (placer's ``pipeline`` with its cost
  model and search, and the peers' rows ``gpipe``, ``pipedream``,
  ``alpa-stages``);
- :mod:`.sharding`: data parallelism and sharded data parallelism (``fsdp``).
"""
