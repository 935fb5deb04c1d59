"""The sqlfluff parse tree of rendered T-SQL, shared by `check-tsql` and its rules.

sqlfluff's tsql dialect is the parser (DacFx and ScriptDom are not available here). Parsing is the
slow part (seconds per thousand lines), so callers parse each GO batch once: ``parse_batch`` keeps
the trees of this process by the text's hash, and ``map_batches`` spreads many batches over worker
processes and brings back only what a function extracted from each tree.

Expressions come out of sqlfluff flat (``a = 0 AND (b & 2) = 0`` is one ``expression`` with its
operands and operators side by side), so the helpers here split them at top-level operators.
"""
from __future__ import annotations

import functools
import hashlib
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

from sqlfluff.core import FluffConfig, Linter
from sqlfluff.core.parser import BaseSegment

from .distribution import checkout_root

# Segments that carry no code: layout, comments and the parser's indentation markers.
_NON_CODE = {"whitespace", "newline", "indent", "dedent", "inline_comment", "block_comment", "comment",
             "end_of_file", "implicit_indent"}

T = TypeVar("T")
A = TypeVar("A")


class TsqlParseError(ValueError):
    """sqlfluff could not parse part of a batch; ``line`` is the batch line where it starts."""

    def __init__(self, line: int, text: str) -> None:
        first = " ".join(text.split())[:80]
        super().__init__(f"line {line}: unparsable T-SQL: {first}")
        self.line = line
        self.text = text

    def __reduce__(self):
        # Raised in a worker process of map_batches: it must come back whole (pickled from its
        # __init__ arguments), or the pool breaks and hides which batch did not parse.
        return type(self), (self.line, self.text)


@functools.cache
def _linter() -> Linter:
    # The repository's .sqlfluff (as `make lint` uses it) with the tsql dialect; the raw templater
    # whatever the configuration says, because rendered SQL contains no template code. An installed
    # package has no checkout: sqlfluff's defaults then, which parse the same.
    overrides = {"dialect": "tsql", "templater": "raw"}
    root = checkout_root()
    config = (FluffConfig.from_path(str(root), overrides=overrides) if root is not None
              else FluffConfig(overrides=overrides))
    return Linter(config=config)


_TREES: dict[str, BaseSegment] = {}


def parse_batch(text: str) -> BaseSegment:
    """The parse tree of one batch (no GO inside); the same text is parsed once per process."""
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()
    tree = _TREES.get(key)
    if tree is None:
        tree = _linter().parse_string(text).tree
        for bad in tree.recursive_crawl("unparsable"):
            raise TsqlParseError(line_of(bad), bad.raw)
        _TREES[key] = tree
    return tree


def map_batches(function: Callable[[A], T], items: Iterable[A], size: Callable[[A], int],
                processes: int | None = None) -> list[T]:
    """``function(item)`` for every item (a batch to parse), in order, on worker processes.

    ``function`` must be a module-level function that parses with ``parse_batch`` and returns
    something small and picklable (a tree is neither: it stays in the worker). ``size`` orders the
    work longest first, so that one large procedure does not finish alone at the end.
    """
    items = list(items)
    processes = processes or min(len(items), os.cpu_count() or 1, 4)
    if processes <= 1 or len(items) < 8:
        return [function(item) for item in items]
    order = sorted(range(len(items)), key=lambda i: -size(items[i]))
    with ProcessPoolExecutor(processes) as pool:
        results = list(pool.map(function, [items[i] for i in order], chunksize=2))
    out: list[T] = [None] * len(items)  # type: ignore[list-item]
    for index, result in zip(order, results):
        out[index] = result
    return out


# ------------------------------------------------------------------------------------------------
# Tree helpers


def kind(segment: BaseSegment) -> str:
    return segment.get_type()


def code(segment: BaseSegment) -> list[BaseSegment]:
    """The children that carry code (no layout, comments or indentation markers)."""
    return [child for child in segment.segments if child.get_type() not in _NON_CODE and not child.is_meta]


def child(segment: BaseSegment, *types: str) -> BaseSegment | None:
    return next((c for c in segment.segments if c.get_type() in types), None)


def children(segment: BaseSegment, *types: str) -> list[BaseSegment]:
    return [c for c in segment.segments if c.get_type() in types]


def line_of(segment: BaseSegment) -> int:
    return segment.pos_marker.working_line_no


def offset_of(segment: BaseSegment) -> int:
    return segment.pos_marker.source_slice.start


def descendants(segment: BaseSegment, *types: str, stop: tuple[str, ...] = ()) -> Iterator[BaseSegment]:
    """Every segment of these types below ``segment``, in text order, not entering ``stop`` types."""
    for c in segment.segments:
        t = c.get_type()
        if t in types:
            yield c
        if c.segments and t not in stop:
            yield from descendants(c, *types, stop=stop)


def keywords(segment: BaseSegment) -> list[str]:
    """The upper-cased keywords that are direct children of ``segment``."""
    return [c.raw.upper() for c in segment.segments if c.get_type() == "keyword"]


def unquote(raw: str) -> str:
    """An identifier's name: ``[a]]b]`` -> ``a]b``, ``"x"`` -> ``x``, others as they are."""
    if len(raw) >= 2 and raw[0] == "[" and raw[-1] == "]":
        return raw[1:-1].replace("]]", "]")
    if len(raw) >= 2 and raw[0] == '"' and raw[-1] == '"':
        return raw[1:-1].replace('""', '"')
    return raw


def fold(raw: str) -> str:
    """Identifiers compare case-insensitively (the default collations of SQL Server)."""
    return unquote(raw).casefold()


def string_value(raw: str) -> str | None:
    """The value of a T-SQL string literal (``N'it''s'`` -> ``it's``), None if ``raw`` is not one."""
    body = raw[1:] if raw[:1] in ("N", "n") else raw
    if len(body) >= 2 and body[0] == "'" and body[-1] == "'":
        return body[1:-1].replace("''", "'")
    return None


def split_name(text: str) -> list[str]:
    """``[a].[b.c]`` -> ``['a', 'b.c']``: a multi-part name as written in a string (OBJECT_ID's argument)."""
    parts, current, quoted = [], [], False
    i = 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "]" and text[i + 1:i + 2] == "]":
                current.append("]")
                i += 1
            elif ch == "]":
                quoted = False
            else:
                current.append(ch)
        elif ch == "[":
            quoted = True
        elif ch == ".":
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return parts


@dataclass(frozen=True)
class Operand:
    """One operand of a flat sqlfluff expression split at an operator: its segments and text."""

    segments: tuple[BaseSegment, ...]

    @property
    def text(self) -> str:
        """Upper-cased code with one space between tokens: ``( @@options &2 )=0`` -> ``(@@OPTIONS & 2) = 0``."""
        return normalised(self.segments)

    @property
    def line(self) -> int:
        return line_of(self.segments[0])


def leaves(segment: BaseSegment) -> Iterator[BaseSegment]:
    """The code tokens of ``segment`` in text order (``<=`` is one token, not two)."""
    if not segment.segments or segment.get_type() == "comparison_operator":
        if segment.get_type() not in _NON_CODE and not segment.is_meta:
            yield segment
        return
    for c in segment.segments:
        yield from leaves(c)


def _raw_code(segment: BaseSegment) -> str:
    return "".join(leaf.raw for leaf in leaves(segment)) if segment.segments else segment.raw


def normalised(segments: Iterable[BaseSegment]) -> str:
    """Upper-cased code, one space between tokens and none inside brackets: for comparing code."""
    text = " ".join(_raw_code(leaf) for s in segments for leaf in leaves(s)).upper()
    return text.replace("( ", "(").replace(" )", ")")


def split_operands(expression: BaseSegment, operator: str) -> list[Operand]:
    """The top-level operands of ``expression`` between its ``operator`` (AND / OR) binary operators.

    A bracketed operand that is itself only an expression is unwrapped once, so that ``(a AND b)``
    yields its own parts when split again. ``BETWEEN x AND y`` is not split: sqlfluff makes that
    AND a keyword, not a binary operator.
    """
    parts: list[list[BaseSegment]] = [[]]
    for c in code(expression):
        if c.get_type() == "binary_operator" and c.raw.upper() == operator:
            parts.append([])
        else:
            parts[-1].append(c)
    return [Operand(tuple(p)) for p in parts if p]


def conjuncts(expression: BaseSegment) -> list[Operand] | None:
    """The AND-ed conjuncts of a condition, looking into brackets; None if it has a top-level OR."""
    if len(split_operands(expression, "OR")) > 1:
        return None
    out: list[Operand] = []
    for operand in split_operands(expression, "AND"):
        inner = _bracketed_expression(operand)
        nested = conjuncts(inner) if inner is not None else None
        out.extend(nested if nested is not None else [operand])
    return out


def disjuncts(expression: BaseSegment) -> list[Operand]:
    """The OR-ed disjuncts of a condition, looking into brackets."""
    out: list[Operand] = []
    for operand in split_operands(expression, "OR"):
        inner = _bracketed_expression(operand)
        out.extend(disjuncts(inner) if inner is not None and len(split_operands(inner, "OR")) > 1 else [operand])
    return out


def _bracketed_expression(operand: Operand) -> BaseSegment | None:
    if len(operand.segments) == 1 and operand.segments[0].get_type() == "bracketed":
        inner = code(operand.segments[0])
        if len(inner) == 3 and inner[1].get_type() == "expression":
            return inner[1]
    return None
