"""What a placement is checked against before it runs, and where it runs:
the captured graph (:func:`check_same_graph`, :func:`check_graph_file`), the
torch device of each cluster device (:func:`default_device_map`) and the
torch.distributed backend of a set of ranks (:func:`dist_backend`), and what
every rank of every plan is told of them (:func:`job_core`).

Shared by the one-process-per-device runs (:mod:`.api`, :mod:`.dist`) and
data parallelism (:mod:`.data_parallel`), which import it instead of each
other.
"""

from __future__ import annotations

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.placement import Placement


def check_same_graph(step_doc: dict, placement: Placement, label: str, graph: Graph | None = None,
                     graph_label: str = "graph") -> None:
    """Refuse a placement (or graph file) made for another graph than the captured one.

    Raises
    ------
    InvalidInput
        One line naming the first node that differs and how to capture the right graph.
    """
    ids = [n["id"] for n in step_doc["nodes"]]
    known = set(ids)
    how = "capture with the --model, --config and --batch-size the graph file was made with"
    if placement.split_graph is not None or placement.derivation is not None:
        raise InvalidInput(f"{label}: the placement transforms the graph ({placement.algorithm}); placer run executes "
                           f"placements of the captured graph and plain data parallelism")
    made, now = _name_batch(placement.graph), _name_batch(step_doc["name"])
    if made and now and made[0] == now[0] and made[1] != now[1]:
        raise InvalidInput(f"{label} was made for graph '{placement.graph}' (batch {made[1]}), the capture is "
                           f"'{step_doc['name']}' (batch {now[1]}): the simulated step would be another batch's; "
                           f"run with -b {made[1]}")
    extra = [nid for nid in placement.assignment if nid not in known]
    missing = [nid for nid in ids if nid not in placement.assignment]
    if extra or missing:
        what = (f"it places node '{extra[0]}', which the capture does not have" if extra else
                f"it does not place node '{missing[0]}' of the capture")
        raise InvalidInput(f"{label} was made for graph '{placement.graph}' ({len(placement.assignment)} nodes), "
                           f"the capture is '{step_doc['name']}' ({len(ids)} nodes): {what}; {how}")
    if graph is not None:
        check_graph_file(step_doc, graph, graph_label)


def _name_batch(name: str) -> tuple[str, int] | None:
    """``"net_b8"`` -> ``("net", 8)``: the batch ``placer profile`` writes into a graph's name."""
    base, sep, tail = str(name).rpartition("_b")
    return (base, int(tail)) if sep and base and tail.isdigit() else None


def check_graph_file(step_doc: dict, graph: Graph, graph_label: str = "graph") -> None:
    """Refuse a graph file (``--graph``) of another model, batch or phase than the capture.

    Raises
    ------
    InvalidInput
        One line naming the first node or edge that differs.
    """
    known = {n["id"] for n in step_doc["nodes"]}
    how = "capture with the --model, --config and --batch-size the graph file was made with"
    if (graph.meta or {}).get("phase") == "inference":
        raise InvalidInput(f"{graph_label}: is an inference graph; placer run executes training steps (profile "
                           f"without --phase inference)")
    if graph.is_coarse:
        raise InvalidInput(f"{graph_label}: is a coarse graph; give the original graph file the placement "
                           f"was expanded to (--graph)")
    if set(graph.ids) != known:
        other = next(iter(set(graph.ids) ^ known))
        raise InvalidInput(f"{graph_label}: graph '{graph.name}' differs from the captured '{step_doc['name']}': "
                           f"node '{other}' is in only one of them; {how}")
    mine = {(e["src"], e["dst"], e.get("tensor")) for e in step_doc["edges"]}
    theirs = {(graph.ids[graph.edge_src[e]], graph.ids[graph.edge_dst[e]]) for e in range(graph.m)}
    diff = {(s, d) for s, d, _ in mine} ^ theirs
    if diff:
        s, d = sorted(diff)[0]
        raise InvalidInput(f"{graph_label}: graph '{graph.name}' differs from the captured '{step_doc['name']}': "
                           f"edge {s}->{d} is in only one of them; {how}")


def default_device_map(cluster: Cluster, used: list[int], given: dict[str, str] | None) -> dict[int, str]:
    """Cluster device index -> torch device string: *given* (``{"gpu0": "cuda:0"}``),
    else device *i* -> ``cuda:i`` when this machine has it, else ``cpu``.

    Raises
    ------
    InvalidInput
        An unknown cluster device id, a malformed torch device, a CUDA device this machine lacks.
    """
    import torch

    given = dict(given or {})
    for did in given:
        if did not in cluster.index:
            raise InvalidInput(f"--device-map names '{did}', which is not a device of cluster '{cluster.name}' "
                               f"({', '.join(cluster.ids)})")
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out: dict[int, str] = {}
    for d in used:
        did = cluster.ids[d]
        spec = given.get(did, f"cuda:{d}" if d < n_cuda else "cpu")
        try:
            dev = torch.device(spec)
        except (RuntimeError, TypeError) as exc:
            raise InvalidInput(f"--device-map {did}={spec}: not a torch device ({exc})") from None
        if dev.type == "cuda":
            idx = 0 if dev.index is None else dev.index
            if idx >= n_cuda:
                raise InvalidInput(f"--device-map {did}={spec}: this machine has {n_cuda} CUDA device(s)")
            spec = f"cuda:{idx}"
        elif dev.type != "cpu":
            raise InvalidInput(f"--device-map {did}={spec}: only cpu and cuda devices are supported")
        out[d] = spec
    return out


def dist_backend(tdev: dict[int, str], ranks: list[int]) -> str:
    """``"nccl"`` when every rank's torch device is a distinct GPU, else ``"gloo"``.

    >>> dist_backend({0: "cuda:0", 1: "cuda:1"}, [0, 1]), dist_backend({0: "cuda:0", 1: "cpu"}, [0, 1])
    ('nccl', 'gloo')
    """
    cuda = [tdev[d] for d in ranks if tdev[d].startswith("cuda")]
    return "nccl" if len(cuda) == len(ranks) and len(set(cuda)) == len(cuda) else "gloo"


def job_core(step, ranks: list[int], tdev: dict[int, str], rng_states, *, steps: int, warmup: int, threads: int,
             timeout: float) -> dict:
    """What every rank of every plan needs: the model to capture again (*step*'s), the ranks'
    cluster and torch devices, the process group's backend (:func:`dist_backend`), the
    generator states to replay, the step counts."""
    return {"spec": step.spec, "config": step.config, "seed": step.seed, "ids": step.sm.ids, "ranks": ranks,
            "torch_devices": tdev, "rank_devices": {r: tdev[d] for r, d in enumerate(ranks)},
            "dist_backend": dist_backend(tdev, ranks), "rng_states": rng_states, "steps": steps, "warmup": warmup,
            "threads": threads, "timeout": timeout}
