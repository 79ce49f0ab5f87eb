"""Every relative link in the repository's Markdown resolves: the file exists, and a `#fragment` names a heading
of that file (GitHub's anchor rules: lower case, punctuation dropped, spaces to hyphens, repeats numbered). The
docs also stand alone: none names a path outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _markdown_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / p for p in listed if (ROOT / p).is_file()]


def _anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for title in _HEADING.findall(_FENCE.sub("", text)):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", plain.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_and_anchor_resolves() -> None:
    files = _markdown_files()
    assert any(p.name == "README.md" for p in files)
    broken: list[str] = []
    for path in files:
        text = _FENCE.sub("", path.read_text(encoding="utf-8"))
        for target in _LINK.findall(text) + _IMAGE.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http:, https:, mailto: ...
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)} -> {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif (
                fragment
                and dest.suffix == ".md"
                and fragment.lower() not in _anchors(dest.read_text(encoding="utf-8"))
            ):
                broken.append(f"{where}: no such heading")
    assert not broken, "\n".join(broken)


def test_no_document_points_outside_the_repository() -> None:
    outside = re.compile(r"(?<![\w.])(/work/|\.\./shared/|SPEC §)")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _markdown_files()
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if outside.search(line)
    ]
    assert not found, found
