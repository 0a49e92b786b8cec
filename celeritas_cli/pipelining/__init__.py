"""Pipeline parallelism: stages, schedules and the one builder.

The layers (:mod:`.layers`: the layer sequence every pipeline planner cuts),
the cuts of a forward order into stages (:mod:`.cuts`), the schedules
(:mod:`.schedules`: one :class:`~.schedules.Schedule` object each for GPipe,
1F1B and interleaved 1F1B, with its per-rank table of actions, in-flight
count, bubble, shape rule and torch class; the registry
:data:`~.schedules.SCHEDULES`), the pipeline parameters declared once
(:mod:`.params`: micro-batch count, schedule, recomputation) and the one
builder (:mod:`.builder`: :func:`~.builder.staged_plan`) that turns stages,
their devices, a schedule and a micro-batch count into a placement whose
recipe the simulator rebuilds.  The planners that search this space are
:mod:`celeritas_cli.algorithms.pipelines`; what runs a plan is
:mod:`celeritas_cli.run`.
"""
