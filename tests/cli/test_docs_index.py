"""docs/README.md, the index the README sends readers to, lists every page of docs/."""

from __future__ import annotations

import re

from conftest import ROOT


def test_the_docs_index_lists_every_page() -> None:
    """A page added to docs/ but not to the index is one nobody finds from the README."""
    index = (ROOT / "docs/README.md").read_text()
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    pages = {page.name for page in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert len(pages) >= 10 and sorted(pages - listed) == []
