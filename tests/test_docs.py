"""The pages a newcomer reads: the README stays a short first page, and no link in it or
in docs/ points at a file that is not there."""

from __future__ import annotations

import re

from conftest import ROOT

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_first_page_and_names_where_the_rest_is():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 350
    for page in ("guide.md", "reference.md", "fidelity.md", "benchmarks.md", "architecture.md", "nccl.md"):
        assert f"(docs/{page})" in text, page
    assert "make demo" in text and "make test" in text


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []
