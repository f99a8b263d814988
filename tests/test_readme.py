"""The README stays a first screen, not a manual: at most 200 lines, its test command is the one
CI runs, and every link into the repo (with its #anchor) leads somewhere."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 200


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)}


def test_the_readme_fits_200_lines():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_ci_runs_the_readmes_test_command():
    assert "make test" in README.read_text()
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"


def test_every_link_into_the_repo_leads_somewhere():
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", README.read_text())
    checked = 0
    for target, anchor in links:
        if target.startswith(("http://", "https://")):
            continue
        path = REPO / target
        assert path.exists(), target
        if anchor:
            assert anchor in anchors(path), f"{target}#{anchor}"
        checked += 1
    assert checked >= 10


def test_slug_by_hand():
    assert slug("Learning: SmolLM2-135M on two-digit sums") == "learning-smollm2-135m-on-two-digit-sums"
    assert (
        slug("9. Coding variant: the RM as a unit-test generator") == "9-coding-variant-the-rm-as-a-unit-test-generator"
    )
