"""Sections of a results page that one benchmark script owns (docs/performance.md).

Several scripts write into one page. Each writes its figures between a pair of
markers, ``<!-- begin NAME -->`` and ``<!-- end NAME -->``, and leaves the rest
of the page as it is; a script that writes a whole page keeps the others'
sections (:func:`keep_sections`).
"""

from __future__ import annotations

import re
from pathlib import Path

_SECTION = re.compile(r"<!-- begin (\S+) -->\n.*?<!-- end \1 -->\n", re.DOTALL)


def write_section(path, name, text):
    """Put ``text`` in the section ``name`` of the page at ``path``.

    Replaces the section where the page has it, and appends it otherwise.
    """
    path = Path(path)
    page = path.read_text() if path.exists() else ""
    block = f"<!-- begin {name} -->\n{text.rstrip()}\n<!-- end {name} -->\n"
    pattern = re.compile(
        rf"<!-- begin {re.escape(name)} -->\n.*?<!-- end {re.escape(name)} -->\n",
        re.DOTALL,
    )
    if pattern.search(page):
        page = pattern.sub(lambda _: block, page)
    else:
        page = page.rstrip() + "\n\n" + block if page else block
    path.write_text(page)


def keep_sections(path, text):
    """``text``, a whole new page, followed by the sections the old page had."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    kept = [match.group(0) for match in _SECTION.finditer(old)]
    return "\n".join([text.rstrip() + "\n", *kept])
