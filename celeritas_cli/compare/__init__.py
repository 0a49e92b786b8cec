"""``placer compare``: algorithms x graphs x clusters, judged by the simulator."""

from .core import *  # noqa: F401,F403
