"""The ``placer`` command line: a thin layer over the library.

Each subcommand lives in its own module here and only parses arguments,
calls the library and writes the result.  Domain errors
(:class:`~celeritas_cli.errors.PlacerError`) become a one-line message and
exit code 1 in one place, :meth:`PlacerGroup.invoke`; usage errors exit 2.
"""

from __future__ import annotations

import gc
import importlib

import click

from .. import __version__
from ..errors import PlacerError
from . import common
from .common import one_line

COMMANDS = ("profile", "coarsen", "place", "simulate", "run", "export", "calibrate", "compare", "clusters")


class PlacerGroup(click.Group):
    """Turns library errors into ``Error: <file>: <what>`` and exit 1, and
    keeps every error one line (:func:`~.common.one_line`: control
    characters in ids, file names and messages escaped), usage errors too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:
            exc.message = one_line(exc.message)
            raise

    def invoke(self, ctx: click.Context):
        # a command builds large acyclic structures once and exits: the cyclic collector would
        # rescan them many times over (a fifth of `placer coarsen` on a 36k-node graph) for nothing
        gc.set_threshold(max(gc.get_threshold()[0], 100_000), 50, 50)
        try:
            return super().invoke(ctx)
        except PlacerError as exc:
            raise click.ClickException(one_line(str(exc))) from None
        except click.ClickException as exc:  # usage errors quote what the user typed
            exc.message = one_line(exc.message)
            raise
        except BrokenPipeError:  # e.g. `placer ... | head`: stdout is already detached (jsonio)
            raise SystemExit(1) from None

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        try:
            module = importlib.import_module(f"celeritas_cli.cli.{name}_cmd")
        except ModuleNotFoundError:
            return None
        return getattr(module, name)


@click.group(cls=PlacerGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="placer")
def main() -> None:
    """Decide which GPU runs each operator of a large dataflow graph.

    Pipeline stages read and write JSON files (`-` = stdin/stdout):

    \b
      placer profile --synthetic layered --nodes 36000 > g.json
      placer coarsen g.json | placer place --algo adjusting > p.json
      placer simulate g.json --placement p.json --format table
      placer compare sample_graphs/ --cluster 4xV100-pcie --algos adjusting,heft
      placer clusters                      # the bundled clusters, e.g. 8xH100-nvswitch

    Only JSON goes to stdout; progress and warnings go to stderr.
    """


def run() -> None:
    """The ``placer`` process (console script, ``python -m celeritas_cli``):
    :func:`main`, ending the process as soon as a large command's result is
    written (:func:`~.common.finish`), or its one-line error said: freeing
    a large graph object by object on the way out would count against
    ``--time-limit``."""
    common.FAST_EXIT = True
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            common.finish(exc.code or 0)
        raise
