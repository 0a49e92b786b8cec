"""HTML pages of placer's results: one self-contained file (inline CSS,
JavaScript, SVG and data; nothing fetched from the network) that people
share like a paper's figure or a Perfetto trace.

* :mod:`.page` - the document shell, tables, the tooltip / sorting script;
* :mod:`.charts` - the SVG charts: Gantt chart with hover details and the
  critical path, memory over time per device, strip plots;
* :mod:`.placement` - one simulated placement (``placer simulate --format
  html``).

``placer compare --format html`` builds its page in
:mod:`celeritas_cli.compare.html` from these parts.
"""

from .placement import placement_page, placement_sections

__all__ = ["placement_page", "placement_sections"]
