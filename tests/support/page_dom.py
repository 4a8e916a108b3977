"""The report page's DOM as a test reads it: every start tag with its attributes, and the text
of each <title> (tooltips) and <td> (summary cells); used on the page as written and on the
DOM a browser rendered (tests/commands/test_report_page.py, tests/integration/test_report_browser.py)."""

from __future__ import annotations

from html.parser import HTMLParser


class PageDom(HTMLParser):
    """Every start tag as (tag, attrs), and each element's direct text for <title> and <td>."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.titles: list[str] = []
        self.cells: list[str] = []
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        self._open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in self._open:
            while self._open.pop() != tag:
                pass

    def handle_data(self, data):
        if self._open and self._open[-1] == "title":
            self.titles.append(data)
        elif self._open and self._open[-1] == "td":
            self.cells.append(data)

    def of_class(self, name: str) -> list[dict[str, str]]:
        return [attrs for _, attrs in self.elements if name in attrs.get("class", "").split()]
