"""The documentation: the README stays a user's guide, links resolve, and nothing in the
repository cites documents that are not in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_MAX_LINES = 450
#: The design guidance kept outside the repository (spelled in two parts so that this
#: file does not cite it itself).
OUTSIDE_DOC = "DESIGN" + ".md"
#: Abbreviated or full commit hashes: 7-40 hex digits with at least one letter and one
#: digit (plain numbers and words are not hashes).
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
#: Markdown links and images: [text](target) and ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SKIP_DIRS = {".git", ".venv", ".jars", "__pycache__", ".pytest_cache", ".mypy_cache",
             ".ruff_cache", "bench-results", "demo-data", "spark-warehouse", "build", "dist"}


def repository_files() -> list[Path]:
    """The repository's files: tracked and new ones, without ignored ones (a walk that
    skips build and cache folders where git is not available)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO, capture_output=True, check=True, timeout=60).stdout
        files = [REPO / name for name in out.decode().split("\0") if name]
        if files:
            return [f for f in files if f.is_file()]
    except (OSError, subprocess.SubprocessError):
        pass
    return [p for p in REPO.rglob("*")
            if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(REPO).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(REPO).parts)]


def markdown_files() -> list[Path]:
    return [README, REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]


def local_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in ``path`` to something in the repository."""
    out = []
    in_code = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or \
                    target.startswith("#"):
                continue  # a URL or an anchor on the same page
            out.append((n, target))
    return out


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: it is a user's guide; "
        "move details to docs/")


def test_readme_has_no_development_history() -> None:
    text = README.read_text(encoding="utf-8")
    hashes = sorted(set(COMMIT_HASH.findall(text)))
    assert not hashes, f"README.md names commits {hashes}: measurements by commit go to " \
                       "docs/benchmarks.md"
    found = [n for n, line in enumerate(text.splitlines(), 1) if SESSION.search(line)]
    assert not found, f"README.md says 'session' on lines {found}: no development history"


def test_nothing_cites_documents_outside_the_repository() -> None:
    citing = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (images, jars)
        if OUTSIDE_DOC in text:
            citing.append(str(path.relative_to(REPO)))
    assert not citing, f"these files cite {OUTSIDE_DOC}, which is not in the repository " \
                       f"(point to docs/ instead): {citing}"


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, spelled as GitHub makes them."""
    out: set[str] = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n, base = 1, slug
            while slug in out:
                slug, n = f"{base}-{n}", n + 1
            out.add(slug)
    return out


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_local_links_resolve(doc: Path) -> None:
    broken = []
    for n, target in local_links(doc):
        file_part, _, anchor = target.partition("#")
        path = doc.parent / file_part
        if not path.exists():
            broken.append(f"{doc.relative_to(REPO)}:{n}: {target}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{doc.relative_to(REPO)}:{n}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_checker_sees_links() -> None:
    """The checks above are only as good as the link pattern: it finds the README's links
    (the Kafka map links every module) and tells a broken one from a good one."""
    assert len(local_links(README)) >= 10
    sample = REPO / "docs" / "design.md"
    assert any(t.startswith("../txlog/") for _, t in local_links(sample))
    assert LINK.findall("see [a](docs/x.md#y) and ![b](img/c.png)") == ["docs/x.md#y",
                                                                        "img/c.png"]
    assert COMMIT_HASH.findall("commit 13d10b9, offset 1048576, a cafe") == ["13d10b9"]
    assert "the-commit-protocol-step-by-step" in anchors(sample)
    assert "reading-read_committed-at-planning-time" in anchors(sample)
