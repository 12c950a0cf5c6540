"""HTML -> plain text that keeps table cells: tables carry facts users ask about, which a plain get_text()
glues together. A table row becomes one line of " | "-separated cells, block elements become paragraphs,
script/style/nav chrome is dropped. `html_document` also reads the page's <meta name|property=... content=...>
fields (the first of a repeated name) and its canonical URL (<link rel=canonical>, else og:url)."""

from __future__ import annotations

import re

from bs4 import BeautifulSoup

_BLOCKS = ("p", "div", "section", "article", "li", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
           "blockquote", "dd", "dt", "caption", "figcaption")
_DROP = ("script", "style", "noscript", "nav", "footer", "header", "form", "svg", "template")


def html_document(html: str | bytes) -> tuple[str, str, str, dict[str, str]]:
    """(title, text, canonical URL or "", {meta name: content}) of an HTML document."""
    soup = BeautifulSoup(html, "html.parser")
    meta: dict[str, str] = {}
    for tag in soup.find_all("meta"):
        name = tag.get("name") or tag.get("property")
        content = tag.get("content")
        if isinstance(name, str) and name.strip() and isinstance(content, str):
            meta.setdefault(name.strip(), content.strip())
    link = soup.find("link", rel="canonical")
    url = (link.get("href") if link is not None else None) or meta.get("og:url") or ""
    title, text = _text(soup)
    return title, text, url.strip(), meta


def html_to_text(html: str | bytes) -> tuple[str, str]:
    """Return (title, text) for an HTML document."""
    return _text(BeautifulSoup(html, "html.parser"))


def _text(soup: BeautifulSoup) -> tuple[str, str]:
    for tag in soup(_DROP):
        tag.decompose()
    head = soup.title if soup.title and soup.title.get_text(strip=True) else soup.find("h1")
    title = head.get_text(" ", strip=True) if head is not None else ""
    if soup.title:
        soup.title.decompose()
    for table in soup.find_all("table"):
        rows = ([c.get_text(" ", strip=True) for c in tr.find_all(["td", "th"])] for tr in table.find_all("tr"))
        lines = [" | ".join(c for c in cells if c) for cells in rows if any(cells)]
        table.replace_with(soup.new_string("\n\n" + "\n".join(lines) + "\n\n"))
    for line_break in soup.find_all("br"):
        line_break.replace_with("\n")
    for tag in soup.find_all(_BLOCKS):
        tag.insert_before("\n\n")
        tag.insert_after("\n\n")
    text = re.sub(r" *\n *", "\n", re.sub(r"[ \t\r\f\v]+", " ", soup.get_text()))
    return title, re.sub(r"\n{3,}", "\n\n", text).strip()
