"""``placer clusters``: list and describe the bundled clusters."""

from __future__ import annotations

import click

from ..log import console as text_console
from ..model.io import DEFAULT_CLUSTER, bundled_cluster, bundled_cluster_names
from .common import emit


def _gib(b: int) -> str:
    return f"{b / 2**30:.0f} GiB" if b % 2**30 == 0 else f"{b / 2**30:.1f} GiB"


def _range(vals, fmt) -> str:
    if not vals:
        return "-"
    lo, hi = vals
    return fmt(lo) if lo == hi else f"{fmt(lo)} – {fmt(hi)}"


def _gbs(x: float) -> str:
    return f"{x / 1e9:.4g} GB/s"


def _us(x: float) -> str:
    return f"{x * 1e6:.3g} µs"


def _list_table() -> None:
    from rich.table import Table

    table = Table(title="bundled clusters (--cluster NAME; placer clusters NAME for details)")
    for col in ("name", "devices", "memory", "links (per direction)", "what it is"):
        table.add_column(col, overflow="fold")
    for name in bundled_cluster_names():
        s = bundled_cluster(name).summary()
        devices = ", ".join(f"{n}x {t}" for t, n in s["types"].items())
        default = " (default)" if name == DEFAULT_CLUSTER else ""
        table.add_row(name + default, devices, _gib(s["memory_bytes"]), _range(s["bandwidth_Bps"], _gbs),
                      s["description"])
    text_console(width=160).print(table)


def _describe(name: str) -> None:
    from rich.table import Table
    from rich.text import Text

    c = bundled_cluster(name)
    s = c.summary()
    console = text_console(width=120)
    console.print(Text.assemble((name, "bold"), f": {s['description']}"), soft_wrap=True)
    t = Table(title="devices")
    for col in ("id", "type", "memory", "speed"):
        t.add_column(col, justify="left" if col in ("id", "type") else "right")
    for d in c.devices:
        t.add_row(d.id, d.type, _gib(d.memory), f"{d.speed:g}")
    console.print(t)
    classes: dict[tuple[float, float], int] = {}
    for a in range(c.k):
        for b in range(c.k):
            if a != b:
                key = (c.bandwidth[a][b], c.latency[a][b])
                classes[key] = classes.get(key, 0) + 1
    lt = Table(title="links (ordered device pairs)")
    for col in ("bandwidth", "latency", "pairs"):
        lt.add_column(col, justify="right")
    for (bw, lat), n in sorted(classes.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        lt.add_row(_gbs(bw), _us(lat), str(n))
    console.print(lt)
    meta = c.doc.get("meta") or {}
    for key, value in meta.items():
        if key == "description":
            continue
        for line in value if isinstance(value, list) else [value]:
            console.print(Text.assemble((key, "bold"), f": {line}"), soft_wrap=True)


class _ClusterName(click.ParamType):
    name = "NAME"

    def convert(self, value, param, ctx):
        names = bundled_cluster_names()
        if value not in names:
            self.fail(f"unknown cluster '{value}' (bundled: {', '.join(names)})", param, ctx)
        return value


@click.command(context_settings={"max_content_width": 100})
@click.argument("name", type=_ClusterName(), required=False)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: for people; json: the cluster document (with NAME) or the list of summaries.")
def clusters(name, fmt):
    """List the bundled clusters, or describe cluster NAME: devices, links
    and where the figures come from.  Any command's --cluster takes a NAME.

    \b
    Examples:
      placer clusters
      placer clusters 8xH100-nvswitch
      placer clusters 2x8xA100-infiniband --format json > my-cluster.json   # a file to edit
      placer place g.json --algo heft --cluster 8xA100-nvswitch
    """
    if fmt == "json":
        if name:
            emit(bundled_cluster(name).to_dict(), "-")
        else:
            emit({"clusters": [bundled_cluster(n).summary() for n in bundled_cluster_names()],
                  "default": DEFAULT_CLUSTER}, "-")
        return
    if name:
        _describe(name)
    else:
        _list_table()
