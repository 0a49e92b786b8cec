"""Building blocks shared by the placement algorithms: per-device timelines
(insertion slots), memory bookkeeping, node orders (CPD-TOPO) and the
METIS / Scotch inputs.  Graph rewrites live in :mod:`celeritas_cli.transform`."""
