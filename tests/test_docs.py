"""docs/ARCHITECTURE.md stays a short, true map: at most 300 lines, every path and link it names exists.

Paths in the map are under src/phasescope/ unless they start with a top-level folder of the repository
(tests/, benchmarks/, docs/, ...). A bare module name (`page.py`) must exist somewhere in the package. The
design notes in docs/design/ are all reachable from the map, and their own links resolve.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAP = DOCS / "ARCHITECTURE.md"
PACKAGE = ROOT / "src" / "phasescope"
MAX_LINES = 300
ROOT_FOLDERS = ("src", "tests", "benchmarks", "docs", "deploy", "data")

# Named by the map while issue 17 lands them in the same round (relative to the repository). Each entry must
# still be missing: once the file exists, remove it here, as import-linter does with a stale ignore.
PENDING: set[str] = set()

_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path with at least one folder (`live/state.py`, `sources/replay/`, `docs/FORMATS.md`), or a bare module.
_PATH = re.compile(
    r"(?<![\w./:-])((?:[a-z_][\w-]*/)+(?:[\w-]+(?:\.[\w-]+)*\.\w+)?|[a-z_]\w*\.py)(?![\w/-])"
)


def named_paths(text: str) -> list[str]:
    """Every path-like token of `text`, link targets left out (they are checked as links)."""
    return _PATH.findall(_LINK.sub("]", text))


def missing_paths(text: str) -> list[str]:
    """The named paths that exist neither in the repository (nor beside the map) nor in PENDING."""
    missing = []
    for token in named_paths(text):
        if "/" not in token:
            found = any(PACKAGE.rglob(token)) or any(Path(p).name == token for p in PENDING)
        else:
            rel = token if token.split("/")[0] in ROOT_FOLDERS else f"src/phasescope/{token}"
            # `design/x.md` is relative to the map's own folder, as its links are
            found = (ROOT / rel).exists() or (DOCS / token).exists() or rel.rstrip("/") in PENDING
        if not found:
            missing.append(token)
    return missing


def broken_links(doc: Path) -> list[str]:
    """Relative links of `doc` whose target is outside the repository, or neither in it nor in PENDING."""
    broken = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        inside = path.is_relative_to(ROOT)
        if not inside or (not path.exists() and path.relative_to(ROOT).as_posix() not in PENDING):
            broken.append(target)
    return broken


def test_the_map_is_at_most_300_lines() -> None:
    n = len(MAP.read_text().splitlines())
    assert n <= MAX_LINES, f"docs/ARCHITECTURE.md: {n} lines, expected at most {MAX_LINES} (detail: design/)"


def test_every_path_the_map_names_exists() -> None:
    text = MAP.read_text()
    # The map names the code it describes; an empty find means the pattern broke, not that all is well.
    assert len(set(named_paths(text))) >= 60
    assert missing_paths(text) == []


def test_a_missing_path_is_caught() -> None:
    text = "see `live/nowhere.py`, `classify/` and `tests/nowhere/`, `ghost.py`, not `live/state.py`"
    assert missing_paths(text) == ["live/nowhere.py", "tests/nowhere/", "ghost.py"]


def test_pending_entries_are_still_pending_and_named() -> None:
    text = MAP.read_text()
    for rel in sorted(PENDING):
        assert not (ROOT / rel).exists(), f"{rel} exists now: remove it from PENDING in tests/test_docs.py"
        assert Path(rel).name in text, f"{rel} is in PENDING but docs/ARCHITECTURE.md does not name it"


@pytest.mark.parametrize("doc", [MAP, *sorted((DOCS / "design").glob("*.md"))], ids=lambda p: p.name)
def test_links_resolve(doc: Path) -> None:
    assert broken_links(doc) == []


def test_every_design_note_is_on_the_map() -> None:
    linked = {Path(t).name for t in _LINK.findall(MAP.read_text()) if t.startswith("design/")}
    notes = {p.name for p in (DOCS / "design").glob("*.md")}
    assert notes - linked == set(), "design notes docs/ARCHITECTURE.md does not link"


def test_the_map_stays_inside_the_repository() -> None:
    # It used to open by pointing at ../shared/DESIGN.md, which a reader of the repository does not have.
    assert "../" not in MAP.read_text()
