"""A structural reading of placer's HTML pages for the tests: every element
properly nested and closed, ids unique, nothing fetched from the network, and
the elements with their attributes and text for queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr",
        "circle", "line", "path"}  # SVG shapes are written self-closed or empty


@dataclass
class Element:
    tag: str
    attrs: dict
    parent: "Element | None" = None
    children: list = field(default_factory=list)
    text: str = ""

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class _Reader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]
        self.all: list[Element] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        el = Element(tag, dict(attrs), self.stack[-1])
        self.stack[-1].children.append(el)
        self.all.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        el = Element(tag, dict(attrs), self.stack[-1])
        self.stack[-1].children.append(el)
        self.all.append(el)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self.stack[-1].tag != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1].tag}>")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.stack[-1].text += data


@dataclass
class Page:
    html: str
    elements: list[Element]

    def find(self, tag: str | None = None, cls: str | None = None, **attrs) -> list[Element]:
        out = []
        for el in self.elements:
            if tag is not None and el.tag != tag:
                continue
            if cls is not None and cls not in el.classes():
                continue
            if all(el.attrs.get(k.replace("_", "-")) == v if v is not True else k.replace("_", "-") in el.attrs
                   for k, v in attrs.items()):
                out.append(el)
        return out

    def by_id(self, ident: str) -> Element:
        found = [el for el in self.elements if el.attrs.get("id") == ident]
        assert len(found) == 1, (ident, len(found))
        return found[0]


def parse(html: str) -> Page:
    """Read *html*, asserting it is well formed, self-contained and has unique ids."""
    reader = _Reader()
    reader.feed(html)
    reader.close()
    assert not reader.problems, reader.problems[:5]
    assert [el.tag for el in reader.stack] == ["#root"], "unclosed: " + ", ".join(el.tag for el in reader.stack)
    ids = [el.attrs["id"] for el in reader.all if "id" in el.attrs]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for el in reader.all:  # self-contained: no script, style sheet, image or frame from elsewhere
        for key in ("src", "href"):
            value = el.attrs.get(key) or ""
            assert not value.startswith(("http:", "https:", "//")), (el.tag, value)
        assert not (el.tag == "link" and el.attrs.get("rel") == "stylesheet")
    return Page(html, reader.all)
