"""The HTML shell of placer's pages: one self-contained document (inline CSS,
a little inline JavaScript, SVG charts, data as embedded JSON), so a page
opens from a file or an e-mail attachment with no network.

The JavaScript (:data:`SCRIPT`, about 80 lines, no library) does three
things: a tooltip for every element with a ``data-tip`` attribute and for
the Gantt charts' bars (``data-i``: an index into the chart's embedded
JSON, so a 10,000-node chart does not carry 10,000 tooltip strings),
sortable tables (``table.sortable``: click a header; cells sort by their
``data-v`` number, else by text) and the critical-path switch.  Without
JavaScript the page still shows every table and chart.
"""

from __future__ import annotations

import html
import math

import orjson

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1280px;margin:0 auto;padding:16px 24px 48px;background:#fff}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:#555;margin:0 0 10px}.muted{color:#777}.small{font-size:12px}
.kpis{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.kpi{border:1px solid #ddd;border-radius:6px;padding:6px 12px;min-width:120px;background:#fcfcfc}
.kpi b{display:block;font-size:18px}.kpi span{font-size:12px;color:#666}
.bad{color:#b2182b}.ok{color:#1a7f37}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{padding:3px 8px;border-bottom:1px solid #e6e6e6;text-align:right;white-space:nowrap}
th{background:#f2f2f2;position:sticky;top:0}th:first-child,td:first-child{text-align:left}
td.l,th.l{text-align:left}
table.sortable th{cursor:pointer;user-select:none}table.sortable th:hover{background:#e6e6e6}
th.asc:after{content:" \\25B2";font-size:10px}th.desc:after{content:" \\25BC";font-size:10px}
td.best{background:#d9f0d3;font-weight:700}td.oom{color:#b2182b}td.failed{color:#999;font-style:italic}
td a{color:inherit;text-decoration:none}td a:hover{text-decoration:underline}td a[download],td a[href^="#best"]{color:#1f5fbf}
.left2 td:nth-child(2),.left2 th:nth-child(2),.left3 td:nth-child(-n+3),.left3 th:nth-child(-n+3){text-align:left}
td.wrap{white-space:normal;min-width:200px;max-width:360px;text-align:left}
tr.fixed td{background:#f7f7f7;font-style:italic}
.sticky td:first-child,.sticky th:first-child{position:sticky;left:0;z-index:1}.sticky td:first-child{background:#fff}
.scroll{overflow-x:auto;max-width:100%}
.bar{display:inline-block;height:9px;background:#4e79a7;vertical-align:middle;margin-right:4px}
.notes li{margin:3px 0}.tables{display:flex;flex-wrap:wrap;gap:4px 28px;align-items:flex-start}
.tables>div{max-width:100%}.tables h3{font-size:14px;max-width:420px}.dagger{color:#b2182b;font-weight:700}
#tip{position:fixed;pointer-events:none;background:rgba(30,30,30,.92);color:#fff;font-size:12px;padding:6px 8px;
border-radius:4px;max-width:420px;white-space:pre-line;display:none;z-index:10;line-height:1.35}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
.gantt.cp-on rect[data-i]:not(.cp){opacity:.2}.gantt.cp-on rect.cp{stroke:#111;stroke-width:.6}
details{margin:6px 0}summary{cursor:pointer;color:#333}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px;font-size:13px;margin:6px 0}
dl.kv dt{color:#666}dl.kv dd{margin:0}
"""

SCRIPT = r"""
(function(){
  const tip = document.getElementById('tip');
  const data = {};
  function chart(id){
    if(!(id in data)){ const el = document.getElementById(id); data[id] = el ? JSON.parse(el.textContent) : null; }
    return data[id];
  }
  function fmt(t, c){ return (t * c.factor).toPrecision(6).replace(/\.?0+$/, '') + ' ' + c.unit; }
  function bytes(b){
    if(b === null || b === undefined) return '-';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0;
    while(Math.abs(b) >= 1024 && i < u.length - 1){ b /= 1024; i++; }
    return (i ? b.toFixed(2) : String(b)) + ' ' + u[i];
  }
  function ganttTip(el){
    const svg = el.closest('svg[data-chart]'); const c = svg && chart(svg.dataset.chart);
    if(!c) return '';
    const it = c.items[+el.dataset.i];
    const transfer = it[4] >= c.devices, n = it[6];
    const what = transfer ? (n > 1 ? n + ' transfers ' : 'transfer ') : (n > 1 ? n + ' nodes ' : 'node ');
    return what + it[0] + '\n' + (transfer ? (n > 1 ? 'longest: tensor of ' : 'tensor of ') : (n > 1 ?
      'longest: op ' : 'op ')) + it[1] + '\n' + (transfer ? 'link ' : 'device ') + c.lanes[it[4]] +
      '\nstart ' + fmt(it[2], c) + ', end ' + fmt(it[3], c) + ' (' + fmt(it[3] - it[2], c) + ')\n' +
      (transfer ? 'bytes ' : 'memory ') + bytes(it[5]) + (n > 1 ? ' in all' : '') +
      (it[7] ? '\non the critical path' : '') + (n > 1 ? '\n(too narrow to draw apart at this width)' : '');
  }
  document.addEventListener('mousemove', function(e){
    const el = e.target.closest ? e.target.closest('[data-tip],[data-i]') : null;
    if(!el){ tip.style.display = 'none'; return; }
    const text = el.dataset.tip !== undefined ? el.dataset.tip : ganttTip(el);
    if(!text){ tip.style.display = 'none'; return; }
    tip.textContent = text; tip.style.display = 'block';
    const w = tip.offsetWidth, h = tip.offsetHeight;
    let x = e.clientX + 14, y = e.clientY + 14;
    if(x + w > window.innerWidth - 4) x = e.clientX - w - 14;
    if(y + h > window.innerHeight - 4) y = e.clientY - h - 14;
    tip.style.left = x + 'px'; tip.style.top = y + 'px';
  });
  document.querySelectorAll('table.sortable').forEach(function(table){
    table.querySelectorAll('thead th').forEach(function(th, col){
      th.addEventListener('click', function(){
        const asc = !th.classList.contains('asc');
        table.querySelectorAll('thead th').forEach(x => x.classList.remove('asc', 'desc'));
        th.classList.add(asc ? 'asc' : 'desc');
        const body = table.tBodies[0];
        const rows = Array.from(body.rows).filter(r => !r.classList.contains('fixed'));
        const fixed = Array.from(body.rows).filter(r => r.classList.contains('fixed'));
        function key(r){
          const c = r.cells[col]; if(!c) return [2, ''];
          const v = c.dataset.v;
          if(v !== undefined && v !== '' && !isNaN(+v)) return [0, +v];
          return [v === 'x' ? 2 : 1, c.textContent.trim()];
        }
        rows.sort(function(a, b){
          const ka = key(a), kb = key(b);
          if(ka[0] !== kb[0]) return ka[0] - kb[0];
          const d = ka[0] === 0 ? ka[1] - kb[1] : String(ka[1]).localeCompare(String(kb[1]), undefined, {numeric: true});
          return asc ? d : -d;
        });
        rows.concat(fixed).forEach(r => body.appendChild(r));
      });
    });
  });
  document.querySelectorAll('input[data-cp]').forEach(function(box){
    const target = document.getElementById(box.dataset.cp);
    box.addEventListener('change', () => target.classList.toggle('cp-on', box.checked));
  });
})();
"""


def esc(value) -> str:
    """*value* as HTML text (quotes escaped, so it is safe in attributes too).

    Example
    -------
    >>> esc('<a & "b">')
    '&lt;a &amp; &quot;b&quot;&gt;'
    """
    return html.escape(str(value), quote=True)


def json_script(element_id: str, obj) -> str:
    """*obj* as an inline JSON data block that no string inside can end
    early (``<`` is written ``\\u003c``).

    Example
    -------
    >>> json_script("d", {"x": "</script>"})
    '<script type="application/json" id="d">{"x":"\\\\u003c/script>"}</script>'
    """
    text = orjson.dumps(obj).decode().replace("<", "\\u003c")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'


def fmt_s(x: float | None, digits: int = 4) -> str:
    """Seconds to *digits* significant digits, ``-`` for None / not finite.

    Example
    -------
    >>> fmt_s(0.0123456), fmt_s(None), fmt_s(1234.5)
    ('0.01235', '-', '1234')
    """
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-4):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}" if abs(x) < 10 ** digits else f"{x:.0f}"


def fmt_bytes(b: float | None) -> str:
    """Bytes in binary units.

    Example
    -------
    >>> fmt_bytes(512), fmt_bytes(3 * 2**30), fmt_bytes(None)
    ('512 B', '3.00 GiB', '-')
    """
    if b is None:
        return "-"
    value, unit = float(b), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(b)} B" if unit == "B" else f"{value:.2f} {unit}"


def kpis(items: list[tuple[str, str, str]]) -> str:
    """A row of headline numbers: ``(label, value, css class)``."""
    cells = "".join(f'<div class="kpi"><span>{esc(label)}</span><b class="{cls}">{esc(value)}</b></div>'
                    for label, value, cls in items)
    return f'<div class="kpis">{cells}</div>'


def kv_list(pairs: list[tuple[str, str]]) -> str:
    """A two-column definition list (labels left, values right), values as given (HTML)."""
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


#: first item of a table row that stays at the bottom when the table is sorted (a summary row)
FIXED = "<!--fixed-->"


def table(headers: list[str], rows: list[list[str]], *, sortable: bool = True, cls: str = "",
          left: int = 1, element_id: str | None = None) -> str:
    """An HTML table; *rows* hold ready ``<td>`` elements (see :func:`td`;
    a row starting with :data:`FIXED` stays last when sorting); the first
    *left* columns (1 to 3) are left-aligned; ``sortable`` tables sort on a
    header click (:data:`SCRIPT`)."""
    classes = " ".join(c for c in ("sortable" if sortable else "", f"left{left}" if left > 1 else "", cls) if c)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "\n".join(("<tr>" if not r or r[0] != FIXED else '<tr class="fixed">') + "".join(r[r[:1] == [FIXED]:])
                     + "</tr>" for r in rows)
    ident = f' id="{esc(element_id)}"' if element_id else ""
    return (f'<div class="scroll"><table class="{classes}"{ident}><thead><tr>{head}</tr></thead>'
            f"<tbody>\n{body}\n</tbody></table></div>")


def td(text: str, value: float | str | None = None, *, cls: str = "", tip: str | None = None,
       raw: bool = False) -> str:
    """A table cell: *text* (escaped unless *raw*), its sort *value*
    (``data-v``; a number sorts numerically), a CSS class and a tooltip."""
    attrs = ""
    if value is not None:
        attrs += f' data-v="{esc(value)}"'
    if cls:
        attrs += f' class="{esc(cls)}"'
    if tip:
        attrs += f' data-tip="{esc(tip)}"'
    return f"<td{attrs}>{text if raw else esc(text)}</td>"


def page(title: str, body: str, subtitle: str = "") -> str:
    """The whole document: *body* (HTML) under an ``<h1>`` *title*, with the
    style, the tooltip element and the script inline."""
    sub = f'<p class="sub">{esc(subtitle)}</p>' if subtitle else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta name=\"generator\" content=\"placer\"><title>{esc(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body><main>\n<h1>{esc(title)}</h1>{sub}\n{body}\n</main>"
            f'<div id="tip"></div>\n<script>{SCRIPT}</script>\n</body></html>\n')
