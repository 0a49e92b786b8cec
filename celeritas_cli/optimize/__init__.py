"""The machinery of ``placer place --algo auto`` (:mod:`celeritas_cli.algorithms.auto`).

* :mod:`.evaluator` - the simulator on the original graph as the judge,
  an evaluation budget capped by the wall clock;
* :mod:`.portfolio` - which registered placers run, on the graph and on
  coarse graphs, and what each costs;
* :mod:`.runner` - running them, each sized before it starts;
* :mod:`.levels` - nested colocation-closed units (heavy-edge matching);
* :mod:`.refine` - critical-path moves and swaps of units, coarse to fine;
* :mod:`.search` - the whole search and its account.
"""
