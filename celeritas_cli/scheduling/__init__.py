"""Building blocks shared by the placement algorithms: per-device timelines and
memory, node orders (CPD-TOPO), operation splitting."""
