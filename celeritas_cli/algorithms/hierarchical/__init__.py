"""The Hierarchical Planner (Mirhoseini et al., ICLR 2018): the training loop
in :mod:`.planner` (registered as ``hierarchical``), the policy networks in
:mod:`.model`."""

from .planner import hierarchical  # noqa: F401  (registers the algorithm)
