"""``placer clusters``: list and describe the bundled clusters; ``placer clusters make`` writes a cluster of servers."""

from __future__ import annotations

import click

from ..log import console as text_console
from ..model.io import DEFAULT_CLUSTER, bundled_cluster, bundled_cluster_names
from ..model.servers import FABRICS, GPUS, NICS
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
    from rich.text import Text

    c = bundled_cluster(name)
    s = c.summary()
    console = text_console(width=120)
    console.print(Text.assemble((name, "bold"), f": {s['description']}"), soft_wrap=True)
    meta = c.doc.get("meta") or {}
    if c.servers is not None:
        _describe_servers(c, console)
    else:
        _describe_links(c, console)
    for key, value in meta.items():
        if key == "description":
            continue
        for line in value if isinstance(value, list) else [value]:
            console.print(Text.assemble((key, "bold"), f": {line}"), soft_wrap=True)


def _describe_servers(c, console) -> None:
    """A cluster of servers: per server type its GPUs, fabric and NICs; the network."""
    from rich.table import Table

    srv = c.servers
    d = srv.describe()
    t = Table(title=f"servers ({len(srv.server_types)} servers, {d['gpus']} GPUs)")
    for col in ("servers", "type", "GPUs", "fabric (per direction)", "NICs (per direction)", "rails"):
        t.add_column(col)
    for name, n in d["servers"].items():
        x = d["types"][name]
        fabric = f"{_gbs(x['fabric_bw'])}, {_us(x['fabric_lat'])}"
        nics = f"{x['nics']}x {_gbs(x['nic_bw'])}, {_us(x['nic_lat'])}" if x["nics"] else "-"
        t.add_row(str(n), name, f"{x['gpus']}x {x['gpu']} ({_gib(x['memory'])}, speed {x['speed']:g})", fabric,
                  nics, str(x.get("rails", "-")))
    console.print(t)
    net = c.doc["servers"].get("network") or {}
    console.print(f"network: {net.get('topology', 'fat-tree')}, oversubscription {d['oversubscription']:g} "
                  f"({'non-blocking' if d['oversubscription'] == 1 else 'blocking'})")
    pairs = (c.doc.get("links") or {}).get("pairs") or []
    if pairs:
        console.print(f"explicit pairs: {len(pairs)} (they override the servers' figures)")


def _describe_links(c, console) -> None:
    """A pairwise cluster: its devices and its classes of links."""
    from rich.table import Table

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


class _ClusterName(click.ParamType):
    name = "NAME"

    def convert(self, value, param, ctx):
        names = bundled_cluster_names()
        if value not in names:
            self.fail(f"unknown cluster '{value}' (bundled: {', '.join(names)})", param, ctx)
        return value


class _Clusters(click.Group):
    """``placer clusters [NAME]`` and ``placer clusters make``: a word that is not a
    subcommand is the NAME of a bundled cluster to describe."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "show", self.commands["show"], args
        return super().resolve_command(ctx, args)

    def format_usage(self, ctx, formatter):
        formatter.write_usage(ctx.command_path, "[NAME] [--format table|json] | make [OPTIONS]")


_FORMAT = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default=None,
                       help="table: for people; json: the cluster document (with NAME) or the list of summaries.  "
                            "[default: table]")


@click.group(cls=_Clusters, invoke_without_command=True, context_settings={"max_content_width": 100})
@_FORMAT
@click.pass_context
def clusters(ctx, fmt):
    """List the bundled clusters, or describe cluster NAME: devices, links
    (or servers, fabric, NICs and network) and where the figures come from.
    Any command's --cluster takes a NAME.  `placer clusters make` writes a
    cluster of servers.

    \b
    Examples:
      placer clusters
      placer clusters 8xH100-nvswitch
      placer clusters 16xDGX-A100
      placer clusters 2x8xA100-infiniband --format json > my-cluster.json   # a file to edit
      placer clusters make --servers 16 --gpus-per-server 8 --gpu A100-80GB --intra nvswitch \\
          --inter ib-hdr-200 --nics 8 -o c.json
      placer place g.json --algo heft --cluster 8xA100-nvswitch
    """
    ctx.ensure_object(dict)["fmt"] = fmt
    if ctx.invoked_subcommand is None:
        if (fmt or "table") == "json":
            emit({"clusters": [bundled_cluster(n).summary() for n in bundled_cluster_names()],
                  "default": DEFAULT_CLUSTER}, "-")
        else:
            _list_table()


class _ShowContext(click.Context):
    @property
    def command_path(self) -> str:   # `placer clusters NAME`: the hidden subcommand has no word of its own
        return self.parent.command_path if self.parent else super().command_path


class _Show(click.Command):
    context_class = _ShowContext


@clusters.command("show", cls=_Show, hidden=True)
@click.argument("name", type=_ClusterName())
@_FORMAT
@click.pass_context
def show(ctx, name, fmt):
    """Describe the bundled cluster NAME."""
    fmt = fmt or ctx.obj.get("fmt") or "table"
    if fmt == "json":
        emit(bundled_cluster(name).to_dict(), "-")
    else:
        _describe(name)


@clusters.command("make", context_settings={"max_content_width": 100})
@click.option("--servers", type=click.IntRange(1), required=True, help="Number of servers.")
@click.option("--gpus-per-server", type=click.IntRange(1), default=8, show_default=True)
@click.option("--gpu", type=click.Choice(list(GPUS)), default="A100-80GB", show_default=True,
              help="GPU preset (docs/design.md, Clusters of servers; figures and sources in the file).")
@click.option("--intra", type=click.Choice(["nvswitch", *FABRICS]), default="nvswitch", show_default=True,
              help="Fabric inside a server (nvswitch: the GPU's generation, NVLink 3 on A100, NVLink 4 on H100).")
@click.option("--inter", type=click.Choice(list(NICS)), default="ib-hdr-200", show_default=True,
              help="NICs between servers (InfiniBand HDR 200 Gb/s, NDR 400 Gb/s).")
@click.option("--nics", type=click.IntRange(1), default=None, help="NICs per server  [default: one per GPU]")
@click.option("--rails", type=click.IntRange(1), default=None,
              help="Rails (separate networks; GPU i uses NIC i on rail i)  [default: one per NIC]")
@click.option("--oversubscription", type=click.FloatRange(1.0), default=1.0, show_default=True,
              help="Of the fat tree between servers (1: non-blocking).")
@click.option("--name", default=None, help="The cluster's name  [default: SERVERSxGPU]")
@click.option("-o", "--output", default="-", show_default=True, help="Where to write the cluster (- = stdout).")
def make(servers, gpus_per_server, gpu, intra, inter, nics, rails, oversubscription, name, output):
    """Write a cluster of identical servers (placer.cluster/v1, servers form):
    O(servers + GPUs) bytes; every pair's link is resolved from the servers.

    \b
    Examples:
      placer clusters make --servers 16 --gpus-per-server 8 --gpu A100-80GB --intra nvswitch \\
          --inter ib-hdr-200 --nics 8 -o c.json
      placer clusters make --servers 128 --gpu H100-80GB --inter ib-ndr-400 --oversubscription 2
    """
    from ..model.cluster import Cluster
    from ..model.servers import make_doc

    doc = make_doc(name=name or f"{servers}x{gpus_per_server}x{gpu}", servers=servers,
                   gpus_per_server=gpus_per_server, gpu=gpu, intra=intra, inter=inter, nics=nics, rails=rails,
                   oversubscription=oversubscription)
    Cluster.from_dict(doc, "placer clusters make")   # refuses what no file may hold (size, rails, ...)
    emit(doc, output)
