r"""Parse ``\boxed{...}`` answers: the RM's step verdict and the policy's answer.

The paper parses the *last* ``\boxed{...}`` of a response; the RM verdict must be
exactly ``1`` or ``-1``, anything else is *unparseable* (step score 0 for the policy,
RM reward -2).

Where we depart from the paper / authors' code, and why:

* Boxes are matched with balanced braces (``\boxed{\frac{1}{2}}`` -> ``\frac{1}{2}``),
  not with a regex, so nested LaTeX is never cut short.
* A response whose last ``\boxed{`` never closes (generation hit the token limit)
  has *no* answer: we do not fall back to an earlier complete box. An earlier box
  may be a draft the model went on to revise; crediting it would be a guess.
* ``+1`` is accepted as ``1`` and whitespace inside the box is ignored.
  ``1.0``, ``1/2``, ``\text{1}`` etc. are unparseable: the judge was told to write
  ``1`` or ``-1``, and a lenient parser would reward not following that.
* A verdict is unparseable when the response holds two verdict boxes that disagree
  (``\boxed{1} ... \boxed{-1}``): a judge that hedges gets no credit for the box
  that happens to come last. Repeated equal verdicts are fine; boxes that are not
  verdicts at all (e.g. the RM quoting the policy's ``\boxed{go north}``) are ignored,
  except that the *last* box must be a verdict.
* Only the literal ``\boxed{`` opens a box (no ``\boxed {``, no ``\fbox``).
"""

from __future__ import annotations

import re

_OPEN = "\\boxed{"
_VERDICTS = {"1": 1, "+1": 1, "-1": -1}


def _top_level_boxes(text: str) -> tuple[list[str], bool]:
    r"""Contents of the top-level ``\boxed{...}`` in order, and whether the last one is unclosed.

    Boxes nested inside a box are part of that box's content.

    >>> _top_level_boxes(r"a \boxed{x} b \boxed{\frac{1}{2}")
    (['x'], True)
    """
    contents: list[str] = []
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            return contents, False
        depth = 1
        i = start + len(_OPEN)
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        if depth != 0:  # ran off the end: the last box is unclosed
            return contents, True
        contents.append(text[start + len(_OPEN) : i])
        pos = i + 1


def extract_last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (balanced braces), or None.

    None when there is no box or when the last box never closes.
    The content is returned as written (not stripped).

    text: str -> str | None

    >>> extract_last_boxed(r"so \boxed{3} or rather \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
    >>> extract_last_boxed(r"\boxed{3} then \boxed{4") is None
    True
    """
    contents, unclosed = _top_level_boxes(text)
    if unclosed or not contents:
        return None
    return contents[-1]


def parse_step_score(text: str) -> int | None:
    r"""RM verdict of one judgment: +1, -1, or None (unparseable).

    The last box must hold exactly ``1``, ``+1`` or ``-1`` (whitespace allowed);
    None also when two verdict boxes disagree.

    text: str -> int | None

    >>> parse_step_score(r"The action opens the drawer. \boxed{ +1 }")
    1
    >>> parse_step_score(r"\boxed{1} hmm, no: \boxed{-1}") is None
    True
    """
    contents, unclosed = _top_level_boxes(text)
    if unclosed or not contents:
        return None
    last = _VERDICTS.get(contents[-1].strip())
    if last is None:
        return None
    verdicts = {_VERDICTS[c.strip()] for c in contents if c.strip() in _VERDICTS}
    if len(verdicts) > 1:
        return None
    return last


def parse_boxed_answer(text: str) -> tuple[str | None, str]:
    r"""The policy's answer in its last box, and a parse status.

    Returns ``(answer, status)`` with status ``"ok"`` (answer = stripped content),
    ``"no_box"`` (no box, or the last box never closes) or ``"empty_box"``
    (only whitespace inside); answer is None unless status is ``"ok"``.

    text: str -> (str | None, str)

    >>> parse_boxed_answer(r"I will \boxed{ take apple from table }")
    ('take apple from table', 'ok')
    >>> parse_boxed_answer(r"\boxed{  }")
    (None, 'empty_box')
    """
    content = extract_last_boxed(text)
    if content is None:
        return None, "no_box"
    answer = content.strip()
    if not answer:
        return None, "empty_box"
    return answer, "ok"


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.S)
FALLBACKS = ("none", "last_number", "first_word", "code_block")
"""`parse_answer`'s fallbacks; every one but "none" is also the action_status of what it read."""


def parse_answer(text: str, *, fallback: str) -> tuple[str | None, str]:
    r"""`parse_boxed_answer`, and with ``fallback="last_number"`` a response without a box is
    read as its last number (status ``"last_number"``). Our departure for small models that
    compute but do not box (SmolLM2-135M gets the last number right about half the time and
    boxes almost never); the status keeps the two apart in rollouts.parquet. With
    ``fallback="first_word"`` it is read as its first whitespace-separated word (status
    ``"first_word"``): one-word answers of models too small to box (the learning check). With
    ``fallback="code_block"`` it is read as the content of its last closed ```` ``` ```` (or
    ```` ```python ````) block (status ``"code_block"``): SmolLM2-135M fences its code and
    boxes 0 of 32 coding answers (measured).

    text: str, fallback: one of FALLBACKS (the config's ``env.answer_fallback``; "none": boxes
    only) -> (str | None, str)

    >>> parse_answer("0 - 4 is -4.", fallback="last_number")
    ('-4', 'last_number')
    >>> parse_answer(r"so \boxed{7}, not 8", fallback="last_number")
    ('7', 'ok')
    >>> parse_answer("0 - 4 is -4.", fallback="none")
    (None, 'no_box')
    >>> parse_answer("  apple pie", fallback="first_word")
    ('apple', 'first_word')
    >>> parse_answer("Here:\n```python\nprint(1)\n```\nDone.", fallback="code_block")
    ('print(1)\n', 'code_block')
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"unknown answer fallback {fallback!r}")
    answer, status = parse_boxed_answer(text)
    if status == "no_box" and fallback == "last_number":
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1], "last_number"
    if status == "no_box" and fallback == "first_word":
        words = text.split()
        if words:
            return words[0], "first_word"
    if status == "no_box" and fallback == "code_block":
        blocks = [b for b in _CODE_BLOCK.findall(text) if b.strip()]
        if blocks:
            return blocks[-1], "code_block"
    return answer, status
