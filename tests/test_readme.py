"""The README stays a front door, not a manual: at most 150 lines, no paragraph or list item over
600 characters, a results table of at most 6 rows each linking into docs/results.md, its test
command is the one CI runs, and every link of the README and docs/results.md (with its #anchor)
leads somewhere."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RESULTS = REPO / "docs" / "results.md"
MAX_LINES = 150
MAX_PARAGRAPH = 600
MAX_RESULT_ROWS = 6
FIRST_SCREEN = 30  # lines

LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+[.)])\s")
HEADING = re.compile(r"#{1,6}\s")
FENCE = "```"


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (a '# comment' inside a code block is none)."""
    return {slug(text.lstrip("#")) for kind, text in blocks(path.read_text()) if kind == "heading"}


def blocks(markdown: str) -> list[tuple[str, str]]:
    """Split markdown into (kind, text) blocks, kind one of heading, code, table, list item and
    paragraph. A paragraph is a run of consecutive non-blank lines that is none of the others; a
    list item runs from its marker to the next marker, blank line or other block, its lines joined
    by single spaces (as for a paragraph) with their indentation dropped."""
    out: list[tuple[str, str]] = []
    kind, lines = "", []

    def flush() -> None:
        nonlocal kind, lines
        if lines:
            out.append((kind, ("\n" if kind in ("code", "table") else " ").join(lines)))
        kind, lines = "", []

    def start(new_kind: str, line: str) -> None:
        nonlocal kind, lines
        flush()
        kind, lines = new_kind, [line]

    for line in markdown.splitlines():
        if kind == "code":
            lines.append(line)
            if line.strip().startswith(FENCE):
                flush()
        elif line.strip().startswith(FENCE):
            start("code", line)
        elif not line.strip():
            flush()
        elif HEADING.match(line):
            start("heading", line)
            flush()
        elif line.lstrip().startswith("|"):
            if kind != "table":
                start("table", line)
            else:
                lines.append(line)
        elif LIST_ITEM.match(line):
            start("list item", line.strip())
        elif kind in ("paragraph", "list item"):
            lines.append(line.strip())
        else:
            start("paragraph", line.strip())
    flush()
    return out


def check_links(path: Path) -> int:
    """Assert that every relative link and image of a markdown file leads to a file or folder, and
    every #anchor to a heading there (an anchor alone: in the same file); return how many."""
    text = path.read_text()
    links = re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text)
    links += [(src, "") for src in re.findall(r'<img src="([^"]+)"', text)]
    checked = 0
    for target, anchor in links:
        if target.startswith(("http://", "https://")):
            continue
        linked = (path.parent / target) if target else path
        assert linked.exists(), f"{path.name}: {target}"
        if anchor:
            assert anchor in anchors(linked), f"{path.name}: {target}#{anchor}"
        checked += 1
    return checked


def results_table(markdown: str) -> list[list[str]]:
    """The rows (cells stripped) of the table whose header is setting | start → after | what does
    not learn, header and separator left out."""
    for kind, text in blocks(markdown):
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()]
        if kind == "table" and rows[0] == ["setting", "start → after", "what does not learn"]:
            return rows[2:]
    raise AssertionError("no results table (setting | start → after | what does not learn)")


def test_the_readme_fits_150_lines():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_no_paragraph_or_list_item_is_over_600_characters():
    long = [
        (kind, len(text), text[:60])
        for kind, text in blocks(README.read_text())
        if kind in ("paragraph", "list item") and len(text) > MAX_PARAGRAPH
    ]
    assert not long


def test_blocks_by_hand():
    markdown = "\n".join(
        [
            "# Title",
            "First line of a paragraph",
            "  and its second line.",
            "",
            "- item one",
            "  continues here",
            "- item two",
            "1. numbered",
            "",
            "```bash",
            "code line",
            "",
            "# a comment, not a heading",
            "```",
            "| a | b |",
            "|---|---|",
            "| 1 | 2 |",
            "After the table.",
            "### Sub",
        ]
    )
    assert blocks(markdown) == [
        ("heading", "# Title"),
        ("paragraph", "First line of a paragraph and its second line."),
        ("list item", "- item one continues here"),
        ("list item", "- item two"),
        ("list item", "1. numbered"),
        ("code", "```bash\ncode line\n\n# a comment, not a heading\n```"),
        ("table", "| a | b |\n|---|---|\n| 1 | 2 |"),
        ("paragraph", "After the table."),
        ("heading", "### Sub"),
    ]


def test_the_first_screen_says_what_learns_and_what_does_not():
    first = README.read_text().splitlines()[:FIRST_SCREEN]
    assert any(line.startswith("**What learns:**") for line in first)
    assert any(line.startswith("**What does not:**") for line in first)


def test_the_results_table_is_short_and_each_row_links_into_results_md():
    rows = results_table(README.read_text())
    assert 1 <= len(rows) <= MAX_RESULT_ROWS
    for row in rows:
        assert len(row) == 3, row
        link = re.search(r"\]\(docs/results\.md#([^)\s]+)\)", row[0])
        assert link, row[0]
        assert link.group(1) in anchors(RESULTS), link.group(1)


def test_results_table_by_hand():
    markdown = "text\n\n| setting | start → after | what does not learn |\n|---|---|---|\n| [a](x.md#a) | 1 → 2 | b |\n"
    assert results_table(markdown) == [["[a](x.md#a)", "1 → 2", "b"]]


def test_ci_runs_the_readmes_test_command():
    assert "make test" in README.read_text()
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"


def test_every_link_into_the_repo_leads_somewhere():
    assert check_links(README) >= 10


def test_every_link_of_the_results_leads_somewhere():
    assert check_links(RESULTS) >= 10


def test_slug_by_hand():
    assert slug("Learning: SmolLM2-135M on two-digit sums") == "learning-smollm2-135m-on-two-digit-sums"
    assert (
        slug("9. Coding variant: the RM as a unit-test generator") == "9-coding-variant-the-rm-as-a-unit-test-generator"
    )
