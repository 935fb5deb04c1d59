"""Unit tests for tablequeue.gosplit: cutting T-SQL scripts at the GO batch separator."""
from __future__ import annotations

import pytest

from tablequeue.gosplit import Batch, GoSplitError, mask_comments_and_strings, split_batches


def texts(script: str) -> list[str]:
    return [batch.text for batch in split_batches(script)]


# --- what is a separator ------------------------------------------------------------------

def test_plain_go_splits_and_text_before_first_and_after_last_go_are_batches():
    script = "SELECT 1;\nGO\nSELECT 2;\nGO\nSELECT 3;\n"
    assert split_batches(script) == [
        Batch("SELECT 1;", 1, 1), Batch("SELECT 2;", 1, 3), Batch("SELECT 3;", 1, 5),
    ]


def test_go_is_case_insensitive():
    assert texts("SELECT 1\ngo\nSELECT 2\nGo\nSELECT 3\ngO\n") == ["SELECT 1", "SELECT 2", "SELECT 3"]


def test_go_with_surrounding_spaces_and_tabs():
    assert texts("SELECT 1\n  GO  \nSELECT 2\n\tGO\t\nSELECT 3") == ["SELECT 1", "SELECT 2", "SELECT 3"]


def test_go_with_count_repeats_the_batch():
    batches = split_batches("INSERT t DEFAULT VALUES;\nGO 3\nSELECT 1\n  go   12  \n")
    assert [(b.text, b.repeat) for b in batches] == [("INSERT t DEFAULT VALUES;", 3), ("SELECT 1", 12)]


def test_go_with_line_comment():
    batches = split_batches("SELECT 1\nGO -- end of batch one\nSELECT 2\nGO 2 -- twice\nSELECT 3\nGO--tight\n")
    assert [(b.text, b.repeat) for b in batches] == [("SELECT 1", 1), ("SELECT 2", 2), ("SELECT 3", 1)]


def test_go_zero_is_an_error():
    with pytest.raises(GoSplitError, match="positive integer") as info:
        split_batches("SELECT 1\nGO 0\n")
    assert info.value.line == 2


# Decision: `GO;` is NOT a separator. The GO documentation says a semicolon is not permitted
# after GO ("-- Yields an error because ; is not permitted after GO"); sqlcmd/SSMS do not split
# there and the server then reports "Incorrect syntax near 'GO'" without a useful line. Rather
# than send that to the server we refuse the script, naming the line.
@pytest.mark.parametrize("line", ["GO;", "go ;", "  GO;  -- comment", "GO; SELECT 1"])
def test_go_semicolon_is_refused_with_its_line(line):
    with pytest.raises(GoSplitError, match="semicolon is not permitted after GO") as info:
        split_batches(f"SELECT 1\n\n{line}\nSELECT 2\n")
    assert info.value.line == 3
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("line 3: ")


@pytest.mark.parametrize("line", [
    "GOTO done", "go to_label:", "GO5", "GOX", "GO 5 SELECT 1", "GO 2x", "SELECT 1 GO", "xGO",
    "GO /* not a -- comment */",
])
def test_lines_that_only_look_like_go_are_not_separators(line):
    script = f"SELECT 1\n{line}\nSELECT 2"
    assert texts(script) == [script]


def test_goto_label_is_kept_in_the_batch():
    script = "WHILE 1 = 1\nBEGIN\n  GOTO done;\nEND\ndone:\nPRINT 'x';\nGO\n"
    assert texts(script) == ["WHILE 1 = 1\nBEGIN\n  GOTO done;\nEND\ndone:\nPRINT 'x';"]


# --- where GO is not a separator: inside literals and comments -----------------------------

NOT_SPLIT_INSIDE = {
    "single-line string": ("SELECT 'GO' AS x\nGO\n", ["SELECT 'GO' AS x"]),
    "multi-line string": (
        "PRINT 'first line\nGO\nlast line';\nGO\nSELECT 2",
        ["PRINT 'first line\nGO\nlast line';", "SELECT 2"],
    ),
    "doubled quote escape": (
        "SELECT 'it''s\nGO\nstill the string'\nGO\nSELECT 2",
        ["SELECT 'it''s\nGO\nstill the string'", "SELECT 2"],
    ),
    "empty strings": ("SELECT ''\nGO\nSELECT ''''\nGO\n", ["SELECT ''", "SELECT ''''"]),
    "N string over lines": ("SELECT N'ünïcode\nGO\n'\nGO\nSELECT 2", ["SELECT N'ünïcode\nGO\n'", "SELECT 2"]),
    "line comment": ("SELECT 1 -- a comment saying GO\nGO\nSELECT 2", ["SELECT 1 -- a comment saying GO", "SELECT 2"]),
    "quote in line comment": ("SELECT 1 -- don't\nGO\nSELECT 2", ["SELECT 1 -- don't", "SELECT 2"]),
    "block comment": ("/*\nGO\n*/\nSELECT 1\nGO\nSELECT 2", ["/*\nGO\n*/\nSELECT 1", "SELECT 2"]),
    "nested block comments": (
        "/* outer\n/* inner\nGO\n*/\nGO\nstill outer */\nSELECT 1\nGO\nSELECT 2",
        ["/* outer\n/* inner\nGO\n*/\nGO\nstill outer */\nSELECT 1", "SELECT 2"],
    ),
    "quotes and -- in block comment": (
        "/* it's -- not a line comment\nGO\n[ \" */\nSELECT 1\nGO\nSELECT 2",
        ["/* it's -- not a line comment\nGO\n[ \" */\nSELECT 1", "SELECT 2"],
    ),
    "comment markers in strings": ("SELECT '/*'\nGO\nSELECT '*/'\nGO\n", ["SELECT '/*'", "SELECT '*/'"]),
    "bracketed identifier with GO and quote": (
        "CREATE PROCEDURE [tq test].[test it's\nGO\nfine]\nAS SELECT 1;\nGO\nSELECT 2",
        ["CREATE PROCEDURE [tq test].[test it's\nGO\nfine]\nAS SELECT 1;", "SELECT 2"],
    ),
    "bracket escape": ("SELECT 1 AS [a]]\nGO\nb]\nGO\nSELECT 2", ["SELECT 1 AS [a]]\nGO\nb]", "SELECT 2"]),
    "double-quoted identifier": (
        'SELECT 1 AS "x\nGO\n""y"\nGO\nSELECT 2',
        ['SELECT 1 AS "x\nGO\n""y"', "SELECT 2"],
    ),
    "quote in double-quoted identifier": ('SELECT 1 AS "it\'s"\nGO\nSELECT 2', ['SELECT 1 AS "it\'s"', "SELECT 2"]),
}


@pytest.mark.parametrize(("script", "expected"), NOT_SPLIT_INSIDE.values(), ids=NOT_SPLIT_INSIDE.keys())
def test_go_inside_literals_and_comments_is_not_a_separator(script, expected):
    assert texts(script) == expected


# --- batch boundaries and line numbers ------------------------------------------------------

def test_empty_and_whitespace_only_batches_are_dropped():
    assert texts("GO\n\nGO\n   \n\t\nGO 5\nSELECT 1\nGO\nGO\n") == ["SELECT 1"]


def test_empty_script_has_no_batches():
    assert split_batches("") == []
    assert split_batches("\n\n  \n") == []
    assert split_batches("GO") == []


def test_comment_only_batch_is_kept():
    assert texts("-- header\nGO\nSELECT 1") == ["-- header", "SELECT 1"]


def test_batch_line_is_its_first_non_blank_line():
    script = "\n\nSELECT 1\nGO\n\n\n  SELECT 2\n  , 3\nGO\nSELECT 4"
    assert [(b.line, b.text) for b in split_batches(script)] == [
        (3, "SELECT 1"), (7, "  SELECT 2\n  , 3"), (10, "SELECT 4"),
    ]


def test_batch_line_after_multi_line_string_and_comment():
    script = "SELECT 'a\nb\nc'\n/* x\ny */\nGO\nSELECT 2\nGO\n"
    assert [b.line for b in split_batches(script)] == [1, 7]


def test_last_line_go_without_newline():
    assert texts("SELECT 1\nGO") == ["SELECT 1"]


def test_trailing_whitespace_is_stripped_but_inner_text_kept():
    assert texts("SELECT 1   \n\n   \nGO\n") == ["SELECT 1"]


def test_crlf_line_endings():
    script = "SELECT 1\r\nGO\r\nSELECT 'x\r\nGO\r\ny'\r\n  go 2  \r\nSELECT 3\r\n"
    batches = split_batches(script)
    assert [(b.text, b.repeat, b.line) for b in batches] == [
        ("SELECT 1", 1, 1), ("SELECT 'x\r\nGO\r\ny'", 2, 3), ("SELECT 3", 1, 7),
    ]


def test_crlf_go_with_comment_and_semicolon():
    assert texts("SELECT 1\r\nGO -- done\r\nSELECT 2\r\n") == ["SELECT 1", "SELECT 2"]
    with pytest.raises(GoSplitError) as info:
        split_batches("SELECT 1\r\nGO;\r\n")
    assert info.value.line == 2


# --- unterminated constructs ----------------------------------------------------------------

@pytest.mark.parametrize(("script", "line", "what"), [
    ("SELECT 1\nGO\nSELECT 'abc\nGO\nSELECT 2\n", 3, "string literal"),
    ("SELECT N'it''s\n", 1, "string literal"),
    ("SELECT 1\n\nSELECT [abc\nGO\n", 3, "bracketed identifier"),
    ("SELECT [a]]\n", 1, "bracketed identifier"),
    ('SELECT 1\nSELECT "abc\n', 2, "double-quoted identifier"),
    ("SELECT 1\nGO\n/* one\n/* two */\nGO\n", 3, "comment"),
    ("/* a */ SELECT 1\n\n\n/*\n", 4, "comment"),
])
def test_unterminated_constructs_raise_with_the_line_they_start_on(script, line, what):
    with pytest.raises(GoSplitError) as info:
        split_batches(script)
    assert info.value.line == line
    assert what in str(info.value)
    assert str(info.value).startswith(f"line {line}: unterminated")


def test_unterminated_nested_comment_names_missing_closers():
    with pytest.raises(GoSplitError, match="missing 2 closing"):
        split_batches("/* a /* b\n")


def test_line_comment_at_end_without_newline_is_fine():
    assert texts("SELECT 1 -- the end") == ["SELECT 1 -- the end"]


def test_error_is_a_value_error():
    assert issubclass(GoSplitError, ValueError)


# --- mask_comments_and_strings ---------------------------------------------------------------

def test_mask_blanks_comments_and_string_contents_keeping_layout():
    script = "SELECT 'CREATE PROC x' AS s, [col]]x], \"q\" -- note\n/* a /* b */ c */ FROM t\r\nGO\n"
    masked = mask_comments_and_strings(script)
    assert len(masked) == len(script)
    assert masked.splitlines(keepends=True)[1].endswith("\r\n")
    assert "CREATE" not in masked and "note" not in masked and " c " not in masked
    assert "[col]]x]" in masked and '"q"' in masked and "FROM t" in masked and "GO" in masked
    assert masked.count("\n") == script.count("\n")


def test_mask_raises_on_unterminated_string():
    with pytest.raises(GoSplitError):
        mask_comments_and_strings("SELECT 'x")
