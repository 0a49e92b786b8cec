"""Pipeline parallelism: stages, schedules and the one builder.

The layers (:mod:`.layers`: the layer sequence every pipeline planner cuts),
the cuts of a forward order into stages (:mod:`.cuts`), the schedules
(:mod:`.schedules`: GPipe, 1F1B, interleaved 1F1B as per-rank tables of
actions) and the builder (:mod:`.builder`) that turns stages, replicas, a
schedule and a micro-batch count into a placement whose recipe the simulator
rebuilds.  The planners that search this space are
:mod:`celeritas_cli.algorithms.pipelines`; what runs a plan is
:mod:`celeritas_cli.run`.
"""
