"""The Hierarchical Planner (Mirhoseini et al., ICLR 2018): the algorithm in
:mod:`.planner` (registered as ``hierarchical``), its training - the joint
Grouper + Placer policy and REINFORCE with a baseline - in :mod:`.training`,
the policy networks in :mod:`.model`, features, reward and budget in
:mod:`.features`, :mod:`.reward` and :mod:`.budget`."""

from .planner import hierarchical  # noqa: F401  (registers the algorithm)
