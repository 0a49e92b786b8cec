"""``python -m celeritas_cli`` = ``placer``."""

from .cli import run

run()
