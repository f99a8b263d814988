r"""Parsing of \boxed{...}: the RM verdict and the policy answer, one case per test."""

import pytest

from rlanything.algo.parsing import extract_last_boxed, parse_answer, parse_boxed_answer, parse_step_score

# ---------------------------------------------------------------- extract_last_boxed


def test_extract_last_of_several():
    assert extract_last_boxed(r"first \boxed{a} then \boxed{b} done") == "b"


def test_extract_nested_braces():
    assert extract_last_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"


def test_extract_keeps_whitespace():
    assert extract_last_boxed(r"\boxed{ x }") == " x "


def test_extract_no_box():
    assert extract_last_boxed("the answer is 4") is None


def test_extract_unclosed_last_box_gives_none():
    # the last box was cut off: do not fall back to the earlier complete one
    assert extract_last_boxed(r"\boxed{3} actually \boxed{4") is None


def test_extract_unclosed_nested():
    assert extract_last_boxed(r"\boxed{\frac{1}{2}") is None


def test_extract_box_inside_box_is_content():
    assert extract_last_boxed(r"\boxed{a \boxed{b}}") == r"a \boxed{b}"


def test_extract_empty_box():
    assert extract_last_boxed(r"\boxed{}") == ""


# ---------------------------------------------------------------- parse_step_score


def test_score_plus_one():
    assert parse_step_score(r"Good step. \boxed{1}") == 1


def test_score_explicit_plus_one():
    assert parse_step_score(r"\boxed{+1}") == 1


def test_score_minus_one():
    assert parse_step_score(r"It picked the wrong object. \boxed{-1}") == -1


def test_score_whitespace_allowed():
    assert parse_step_score("\\boxed{ -1 \n}") == -1


def test_score_float_is_unparseable():
    assert parse_step_score(r"\boxed{1.0}") is None


def test_score_fraction_is_unparseable():
    assert parse_step_score(r"\boxed{1/2}") is None


def test_score_zero_is_unparseable():
    assert parse_step_score(r"\boxed{0}") is None


def test_score_empty_box_is_unparseable():
    assert parse_step_score(r"\boxed{}") is None


def test_score_no_box_is_unparseable():
    assert parse_step_score("I think this step is good: 1") is None


def test_score_unclosed_box_is_unparseable():
    assert parse_step_score(r"\boxed{1") is None


def test_score_conflicting_boxes_are_unparseable():
    assert parse_step_score(r"\boxed{1} ... on reflection \boxed{-1}") is None


def test_score_conflicting_boxes_either_order():
    assert parse_step_score(r"\boxed{-1} or \boxed{+1}") is None


def test_score_repeated_equal_boxes_are_fine():
    assert parse_step_score(r"\boxed{-1} so, final: \boxed{-1}") == -1


def test_score_one_and_plus_one_agree():
    assert parse_step_score(r"\boxed{1} final \boxed{+1}") == 1


def test_score_ignores_quoted_action_box():
    # the RM quotes the policy's action box, then gives its verdict
    assert parse_step_score(r"The agent wrote \boxed{go to fridge 1}, which helps. \boxed{1}") == 1


def test_score_last_box_must_be_verdict():
    assert parse_step_score(r"\boxed{1} and the agent wrote \boxed{go north}") is None


def test_score_text_inside_box_is_unparseable():
    assert parse_step_score(r"\boxed{\text{1}}") is None


# ---------------------------------------------------------------- parse_boxed_answer


def test_answer_ok_stripped():
    assert parse_boxed_answer(r"I'll do it: \boxed{ open drawer 1 }") == ("open drawer 1", "ok")


def test_answer_last_box_wins():
    assert parse_boxed_answer(r"\boxed{3} no wait \boxed{5}") == ("5", "ok")


def test_answer_nested():
    assert parse_boxed_answer(r"\boxed{\sqrt{2}}") == (r"\sqrt{2}", "ok")


def test_answer_no_box():
    assert parse_boxed_answer("open drawer 1") == (None, "no_box")


def test_answer_unclosed_box_is_no_box():
    assert parse_boxed_answer(r"\boxed{3} no wait \boxed{5") == (None, "no_box")


def test_answer_empty_box():
    assert parse_boxed_answer(r"\boxed{}") == (None, "empty_box")


def test_answer_whitespace_box_is_empty():
    assert parse_boxed_answer(r"\boxed{   }") == (None, "empty_box")


# ---------------------------------------------------------------- parse_answer (last-number fallback)


def test_fallback_reads_the_last_number_only_without_a_box():
    assert parse_answer("3 + 4 = 7, so the answer is 7.", fallback="last_number") == ("7", "last_number")
    assert parse_answer("0 - 4 = -4", fallback="last_number") == ("-4", "last_number")
    assert parse_answer("about 2.5 apples", fallback="last_number") == ("2.5", "last_number")
    assert parse_answer(r"7 or \boxed{8} then 9", fallback="last_number") == ("8", "ok")  # a box always wins


def test_fallback_keeps_empty_boxes_and_wordless_answers_failures():
    assert parse_answer(r"7 \boxed{ }", fallback="last_number") == (None, "empty_box")  # the policy boxed nothing
    assert parse_answer("no idea", fallback="last_number") == (None, "no_box")
    assert parse_answer("3 + 4 = 7", fallback="none") == (None, "no_box")  # none: boxes only


def test_first_word_fallback_reads_the_first_word_only_without_a_box():
    assert parse_answer("  apple, then pear", fallback="first_word") == ("apple,", "first_word")
    assert parse_answer(r"pear \boxed{apple}", fallback="first_word") == ("apple", "ok")  # a box always wins
    assert parse_answer(r"pear \boxed{ }", fallback="first_word") == (None, "empty_box")
    assert parse_answer(" \n ", fallback="first_word") == (None, "no_box")  # nothing but whitespace


def test_unknown_fallback_is_an_error():
    with pytest.raises(ValueError, match="unknown answer fallback"):
        parse_answer("7", fallback="first_number")


def test_code_block_fallback_reads_the_last_closed_fenced_block_without_a_box():
    text = "First try:\n```python\nprint(1)\n```\nBetter:\n```\nprint(2)\n```\nDone."
    assert parse_answer(text, fallback="code_block") == ("print(2)\n", "code_block")
    assert parse_answer("```py\nx = 1\nprint(x)\n```", fallback="code_block") == ("x = 1\nprint(x)\n", "code_block")
    assert parse_answer("```python\nprint(1)\n```\n\\boxed{print(3)}", fallback="code_block") == ("print(3)", "ok")
    assert parse_answer("```python\nprint(1)\n", fallback="code_block") == (None, "no_box")  # never closed
    assert parse_answer("```python\n\n```", fallback="code_block") == (None, "no_box")  # empty
    assert parse_answer("```python\nprint(1)\n```", fallback="none") == (None, "no_box")  # no fallback: no action
