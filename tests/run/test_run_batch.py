"""`placer run -b N` with a placement (or graph file) made for another batch: one line, not a silent
comparison with another batch's simulated step (issue 24, new-user list)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.model.graph import build  # noqa: E402
from celeritas_cli.model.jsonio import write_json  # noqa: E402
from celeritas_cli.model.placement import Placement  # noqa: E402
from celeritas_cli.run.checks import check_same_graph  # noqa: E402


def test_a_plain_placement_made_for_another_batch_is_refused():
    p = Placement("net_b8", "4xV100-pcie", "heft", {"a": "gpu0"})
    doc = {"name": "net_b4", "nodes": [{"id": "a"}], "edges": []}
    with pytest.raises(InvalidInput, match=r"^p.json was made for graph 'net_b8' \(batch 8\), the capture is "
                                           r"'net_b4' \(batch 4\): .*; run with -b 8$"):
        check_same_graph(doc, p, "p.json")
    check_same_graph({**doc, "name": "net_b8"}, p, "p.json")  # the same batch: fine
    check_same_graph({**doc, "name": "other_b4"}, p, "p.json")  # another name scheme: the node check decides


def test_batch_size_contradicting_the_graph_file_is_a_usage_error(tmp_path):
    g = build("net_b8", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [],
              meta={"source": "profile torch:x.py:Net", "phase": "training", "batch_size": 8})
    write_json(g.to_dict(), tmp_path / "g.json")
    write_json(Placement("net_b8", "4xV100-pcie", "heft", {"a": "gpu0"}).to_dict(), tmp_path / "p.json")
    r = CliRunner().invoke(main, ["run", "--graph", str(tmp_path / "g.json"), "-P", str(tmp_path / "p.json"),
                                  "-b", "4"])
    assert r.exit_code == 2 and r.stdout == ""
    assert "--batch-size 4, but" in r.stderr and "holds costs for a batch of 8" in r.stderr
