"""Split a T-SQL script into batches on the sqlcmd/SSMS batch separator ``GO``.

``GO`` is not T-SQL: sqlcmd and SSMS cut the script at it and send each piece to the server
on its own. A DB-API driver (pyodbc) sends exactly what it is given, so a script written for
sqlcmd has to be cut here first.

A separator is a line made of, and only of: optional whitespace, ``GO`` (any case), optionally
whitespace and a positive repeat count (``GO 5``), optional whitespace, optionally a ``--``
comment. Such a line only counts when it starts outside any string literal, quoted or bracketed
identifier and comment. The scanner below follows the T-SQL lexical rules that matter for that:

* ``'...'`` string literals (also ``N'...'``), ``''`` inside is a quote, may span lines;
* ``"..."`` quoted identifiers (string literals under QUOTED_IDENTIFIER OFF), ``""`` escape;
* ``[...]`` bracketed identifiers, ``]]`` escape;
* ``--`` comments to the end of the line;
* ``/* ... */`` comments, which NEST in T-SQL (``/* a /* b */ still comment */``).

``GO;`` is refused with an error rather than taken as a separator: the GO documentation says a
semicolon is not permitted after GO, so neither sqlcmd nor SSMS splits there and the server then
fails with a bare "Incorrect syntax near 'GO'". Failing here names the line instead.

Not supported (sqlcmd mode only): ``:r``, ``:setvar``, ``$(variable)`` and other sqlcmd commands
are passed through as text; ``GO`` followed by a ``/* */`` comment is not a separator.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = ["Batch", "GoSplitError", "split_batches", "mask_comments_and_strings", "without_comments"]

# Applied to one physical line (without its line break) that starts outside any literal/comment.
_GO_LINE = re.compile(r"[ \t\f\v]*GO(?:[ \t\f\v]+(?P<count>[0-9]+))?[ \t\f\v]*(?:--.*)?", re.IGNORECASE)
_GO_SEMICOLON = re.compile(r"[ \t\f\v]*GO[ \t\f\v]*;", re.IGNORECASE)


class GoSplitError(ValueError):
    """The script cannot be cut into batches; ``line`` is the 1-based line the problem starts on."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class Batch:
    """One batch to send to the server.

    ``line`` is the script line of the batch's first line, so an error the server reports at
    batch line N is at script line ``line + N - 1``.
    """

    text: str
    repeat: int
    line: int


class _Mode(Enum):
    CODE = "code"
    STRING = "string literal"
    QUOTED_IDENTIFIER = 'double-quoted identifier'
    BRACKET = "bracketed identifier"
    LINE_COMMENT = "-- comment"
    BLOCK_COMMENT = "/* */ comment"


_CLOSERS = {_Mode.STRING: "'", _Mode.QUOTED_IDENTIFIER: '"', _Mode.BRACKET: "]"}
_OPENERS = {"'": _Mode.STRING, '"': _Mode.QUOTED_IDENTIFIER, "[": _Mode.BRACKET}


class _Scanner:
    """Tracks where the scan is (code, literal, comment) across the lines of one script."""

    def __init__(self) -> None:
        self.mode = _Mode.CODE
        self.depth = 0          # nesting depth of /* */ comments
        self.opened_at = 0      # line on which the current literal/comment started

    def at_code(self) -> bool:
        return self.mode is _Mode.CODE

    def scan_line(self, line: str, line_no: int, keep_strings: bool = False) -> str:
        """Advance over one line (its break included, if any); return its *code view*.

        The code view has the same length as ``line`` with the inside of string literals (unless
        keep_strings) and all comment text replaced by spaces (line breaks kept), so a regex over it
        only sees code. Quotes of literals, quoted and bracketed identifiers are kept as they are.
        """
        out: list[str] = []
        i, n = 0, len(line)
        while i < n:
            ch = line[i]
            nxt = line[i + 1] if i + 1 < n else ""
            mode = self.mode
            if mode is _Mode.CODE:
                if ch == "-" and nxt == "-":
                    self._open(_Mode.LINE_COMMENT, line_no)
                    out.append("  ")
                    i += 2
                    continue
                if ch == "/" and nxt == "*":
                    self._open(_Mode.BLOCK_COMMENT, line_no)
                    self.depth = 1
                    out.append("  ")
                    i += 2
                    continue
                if ch in _OPENERS:
                    self._open(_OPENERS[ch], line_no)
                out.append(ch)
                i += 1
            elif mode is _Mode.LINE_COMMENT:
                if ch == "\n":
                    self.mode = _Mode.CODE
                out.append(ch if ch in "\r\n" else " ")
                i += 1
            elif mode is _Mode.BLOCK_COMMENT:
                if ch == "/" and nxt == "*":
                    self.depth += 1
                    out.append("  ")
                    i += 2
                elif ch == "*" and nxt == "/":
                    self.depth -= 1
                    if self.depth == 0:
                        self.mode = _Mode.CODE
                    out.append("  ")
                    i += 2
                else:
                    out.append(ch if ch in "\r\n" else " ")
                    i += 1
            else:  # a quoted construct: STRING, QUOTED_IDENTIFIER or BRACKET
                closer = _CLOSERS[mode]
                if ch == closer and nxt == closer:  # doubled closer: escaped, still inside
                    out.append("  " if mode is _Mode.STRING and not keep_strings else ch * 2)
                    i += 2
                elif ch == closer:
                    self.mode = _Mode.CODE
                    out.append(ch)
                    i += 1
                else:
                    keep = mode is not _Mode.STRING or keep_strings or ch in "\r\n"
                    out.append(ch if keep else " ")
                    i += 1
        return "".join(out)

    def check_finished(self) -> None:
        if self.mode in (_Mode.CODE, _Mode.LINE_COMMENT):
            return
        what = self.mode.value
        if self.mode is _Mode.BLOCK_COMMENT:
            detail = f"unterminated {what}: missing {self.depth} closing '*/' (T-SQL block comments nest)"
        else:
            detail = f"unterminated {what}: the closing {_CLOSERS[self.mode]} is missing"
        raise GoSplitError(
            f"{detail}; it starts here and runs to the end of the script, so any GO after it "
            "was not taken as a batch separator",
            self.opened_at,
        )

    def _open(self, mode: _Mode, line_no: int) -> None:
        self.mode = mode
        self.opened_at = line_no


def _lines(script: str) -> list[str]:
    """Physical lines, each keeping its own break ('\\n' or '\\r\\n'); only '\\n' ends a line."""
    parts = script.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _separator(line: str, line_no: int) -> int | None:
    """The repeat count if ``line`` (starting in code) is a GO separator, else None."""
    body = line.rstrip("\r\n")
    match = _GO_LINE.fullmatch(body)
    if match:
        count = int(match.group("count") or 1)
        if count < 1:
            raise GoSplitError(f"'{body.strip()}': the GO repeat count must be a positive integer", line_no)
        return count
    if _GO_SEMICOLON.match(body):
        raise GoSplitError(
            f"'{body.strip()}' is not a batch separator: a semicolon is not permitted after GO "
            "(sqlcmd and SSMS would send it to the server as text); remove the ';'",
            line_no,
        )
    return None


def _make_batch(lines: list[str], first_line: int, repeat: int) -> Batch | None:
    """Drop leading blank lines (moving ``line`` on) and trailing whitespace; None if empty."""
    skip = 0
    while skip < len(lines) and not lines[skip].strip():
        skip += 1
    text = "".join(lines[skip:]).rstrip()
    if not text:
        return None
    return Batch(text=text, repeat=repeat, line=first_line + skip)


def split_batches(script: str) -> list[Batch]:
    """Cut ``script`` at its GO separators; see the module docstring for the exact rules.

    Raises GoSplitError for ``GO;``, ``GO 0`` and for a string literal, quoted or bracketed
    identifier or block comment still open at the end of the script (with the line it opened on).
    """
    scanner = _Scanner()
    batches: list[Batch] = []
    current: list[str] = []
    first_line = 1
    for line_no, line in enumerate(_lines(script), start=1):
        repeat = _separator(line, line_no) if scanner.at_code() else None
        if repeat is None:
            scanner.scan_line(line, line_no)
            current.append(line)
            continue
        batch = _make_batch(current, first_line, repeat)
        if batch is not None:
            batches.append(batch)
        current, first_line = [], line_no + 1
    scanner.check_finished()
    batch = _make_batch(current, first_line, 1)
    if batch is not None:
        batches.append(batch)
    return batches


def mask_comments_and_strings(script: str) -> str:
    """``script`` with comment text and string-literal contents replaced by spaces.

    Same length and same line breaks as the input, so offsets and line numbers still match;
    identifiers (plain, ``[bracketed]`` or ``"quoted"``) are kept. Useful for searching the code
    of a script with a regex without matching commented-out code or dynamic SQL in strings.
    Raises GoSplitError like split_batches for an unterminated literal or comment.
    """
    scanner = _Scanner()
    masked = [scanner.scan_line(line, line_no) for line_no, line in enumerate(_lines(script), start=1)]
    scanner.check_finished()
    return "".join(masked)


def without_comments(script: str) -> str:
    """``script`` with comment text replaced by spaces and everything else (strings too) as it was.

    Same length and line breaks as the input. Raises GoSplitError like split_batches for an
    unterminated literal or comment.
    """
    scanner = _Scanner()
    kept = [scanner.scan_line(line, line_no, keep_strings=True)
            for line_no, line in enumerate(_lines(script), start=1)]
    scanner.check_finished()
    return "".join(kept)
