"""Reading a ``herdscope report`` HTML file back, for tests/test_report_html.py and
tests/test_report_browser.py: the tags (each with the finding section and the top-level section it
sits in), checked for balance, and every reference that would leave the file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
# attributes through which a document fetches or links something
REFERENCE_ATTRIBUTES = {"src", "href", "xlink:href", "srcset", "action", "data", "poster", "formaction", "background"}
CSS_URL = re.compile(r"url\(\s*['\"]?(?!#)", re.IGNORECASE)  # a CSS url(...) that is not an in-document #id


@dataclass
class Tag:
    name: str
    attrs: dict
    finding: str | None  # data-finding-id of the finding section it is in
    section: str | None  # id of the top-level <section> it is in


@dataclass
class Document:
    tags: list[Tag] = field(default_factory=list)
    text: str = ""

    def named(self, name: str) -> list[Tag]:
        return [t for t in self.tags if t.name == name]

    def findings(self) -> list[Tag]:
        return [t for t in self.tags if t.name == "section" and "finding" in (t.attrs.get("class") or "").split()]

    def external_references(self) -> list[str]:
        """Every attribute that points outside the document (anything but ``#id``), every CSS url()
        that does, and every element that loads or runs something."""
        out = []
        for t in self.tags:
            for k, v in t.attrs.items():
                if k in REFERENCE_ATTRIBUTES and not (v or "").startswith("#"):
                    out.append(f"<{t.name} {k}={v!r}>")
                if k == "style" and CSS_URL.search(v or ""):
                    out.append(f"<{t.name} style={v!r}>")
            if t.name in ("script", "link", "img", "iframe", "object", "embed", "image", "use", "base"):
                out.append(f"<{t.name}>")
        return out


class _Reader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.doc = Document()
        self.stack: list[tuple[str, str | None, str | None]] = []  # (tag, finding, section)
        self.problems: list[str] = []
        self.texts: list[str] = []

    def _context(self):
        return self.stack[-1][1:] if self.stack else (None, None)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        finding, section = self._context()
        if tag == "section":
            if "finding" in (attrs.get("class") or "").split():
                finding = attrs.get("data-finding-id")
            elif section is None:
                section = attrs.get("id")
        self.doc.tags.append(Tag(tag, attrs, finding, section))
        if tag not in VOID:
            self.stack.append((tag, finding, section))

    def handle_startendtag(self, tag, attrs):
        finding, section = self._context()
        self.doc.tags.append(Tag(tag, dict(attrs), finding, section))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1][0] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1][0] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.texts.append(data)


def read(text: str) -> Document:
    """The document's tags; AssertionError when an element is closed out of order or left open."""
    reader = _Reader()
    reader.feed(text)
    reader.close()
    assert not reader.problems, reader.problems[:5]
    assert not reader.stack, f"left open: {[t for t, _, _ in reader.stack]}"
    reader.doc.text = "".join(reader.texts)
    return reader.doc
