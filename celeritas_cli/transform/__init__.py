"""Graph rewrites and their recipes: everything that derives a graph from
another (operation splits, data-parallel replicas, coarse contraction, and
the recipes that rebuild them).  Depends only on :mod:`celeritas_cli.model`
(and ``errors`` / ``log``), so the simulator and every algorithm derive the
same graph from the same recipe (:func:`.derivation.derive`,
:func:`.derivation.rebuild`)."""
