"""The static rules of "SQL Server readiness" on the sqlfluff parse tree (DESIGN.md §4's lessons).

Each rule is a function over the tree of one procedure (or one batch, or the model of one file)
returning violations that name the file, the procedure and the line:

readpast            every table hint list with READPAST also has READCOMMITTEDLOCK (READPAST is
                    refused under READ_COMMITTED_SNAPSHOT without it), in the SQL files and in the
                    SQL strings of the tool's Python modules
transaction-guard   BEGIN TRAN only inside IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0 (a manual-commit
                    caller runs with IMPLICIT_TRANSACTIONS ON, where BEGIN TRAN opens two levels:
                    error 266); COMMIT/ROLLBACK only inside IF @started_transaction = 1. A procedure
                    that first THROWs when @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0 (the in-database
                    worker) owns its transactions
xact-abort          SET NOCOUNT ON first. The argument checks (THROWs outside BEGIN TRY before SET
                    XACT_ABORT ON) come after SET XACT_ABORT OFF: THROW honours the session's setting,
                    and under XACT_ABORT ON (the caller's session may have it: engines.connect sets
                    it) it dooms the caller's transaction; the SET is the procedure's own, restored
                    when it returns. Then SET XACT_ABORT ON, before the first statement that reads or
                    writes a table or begins a transaction, and no THROW outside BEGIN TRY after it
                    (state errors are raised in TRY), nor SET XACT_ABORT OFF again, but for one
                    window: SET XACT_ABORT OFF; BEGIN TRY <one statement>; SET XACT_ABORT ON;
                    END TRY BEGIN CATCH SET XACT_ABORT ON; IF ERROR_NUMBER() NOT IN (...) ...
                    THROW; END CATCH, where the statement is an INSERT ... VALUES and the numbers
                    (2601, 2627) (a duplicate key retried without a key-range lock), or the statement
                    EXEC sys.sp_set_session_context and the numbers (15664, 15665) (the look's
                    best-effort record: a read-only key or a full session context). A read-only
                    procedure (it writes table variables only, begins no transaction, calls
                    nothing) may keep XACT_ABORT OFF, so that a lock timeout leaves a caller's
                    transaction as it was, when it reads every table in BEGIN TRY whose CATCH only
                    rethrows (under OFF an error would not end the batch)
updlock             UPDLOCK only in a claim (READPAST + UPDLOCK + ROWLOCK + READCOMMITTEDLOCK in a CTE
                    that the statement UPDATEs or DELETEs; UPDLOCK without READPAST only in the
                    strict FIFO's CTE-then-DELETE; DELETE TOP (n) ... WITH (UPDLOCK)) or with HOLDLOCK
                    (a key-range lock for a uniqueness check): elsewhere it holds U locks to the end
                    of the transaction and blocks others
table-order         a procedure touches a queue's tables in the order queue -> history -> dead (the
                    text order of first reference; OUTPUT ... INTO comes after the statement's own
                    table), so that no two procedures take their locks in opposite orders. The
                    in-database worker (it refuses a caller's transaction: see transaction-guard)
                    owns one transaction per step (claim: queue -> dead; complete: queue ->
                    history; fail: queue -> dead) and releases its locks at each commit: it is
                    checked per transaction, its steps split at its BEGIN / COMMIT / ROLLBACK
batch-cap           a READONLY table-valued parameter is counted and refused (THROW 51001) above
                    1,000 rows before it feeds any write; @batch_size / @page_size are checked
                    BETWEEN 1 AND 1000 (THROW 51001) before use; a purge's chunk (TOP (@v) in a
                    procedure with @max_rows) is only ever set to @@ROWCOUNT or to an expression
                    whose numbers are all at most 1000: beyond ~5,000 row locks SQL Server
                    escalates to a table lock that READPAST cannot skip
transient-retry     a procedure that owns its transactions (the in-database worker, refusing a
                    caller's) rethrows from its outermost CATCH only under IF ERROR_NUMBER() NOT IN
                    (1205, 1222, 3960) OR ...: a deadlock, a lock timeout or a snapshot conflict is
                    retried; one that volunteers as the deadlock victim (SET DEADLOCK_PRIORITY LOW)
                    and begins its own transaction rethrows only under IF ERROR_NUMBER() <> 1205 OR
                    @started_transaction = 0 OR ...: it retries a deadlock in its own transaction,
                    never in a caller's (which the deadlock rolled back)
bury-guard          a DELETE that moves claimed rows (@claimed) to the dead-letter table (OUTPUT INTO
                    ..._dead or @buried) requires previous_visible_at <= @now: only a lease that had
                    expired is spent, a worker's own live lease comes back as it is
nolock              no NOLOCK / READUNCOMMITTED hint: a consumer would see messages whose enqueue
                    has not committed, or was rolled back
select-star         no SELECT * in a procedure: its result columns are the contract
update-payload      no UPDATE sets payload: the work table's CHECK (ISJSON) then runs on every row it
                    updates, where it costs a lease nothing today (storage v4 kept it on SQL Server)
dynamic-sql         EXEC (...) runs one string literal only; no sp_executesql
abs-checksum        no ABS(CHECKSUM(...)): CHECKSUM returns -2147483648 one time in 2^32, whose ABS
                    overflows (8115); take the remainder first, ABS(CHECKSUM(...) % n)
claim-pin           every claim (a claim's hinted read with UPDLOCK) and every probe (a read WITH (ROWLOCK,
                    READPAST, READCOMMITTEDLOCK) outside a claim: wait's, the priority walk's) names its
                    index, INDEX (ix), an index or key the SQL creates on that table, whose key is the
                    read's =-compared columns, then its ORDER BY in one direction (or its range column);
                    a filtered index's filter is repeated in the read's WHERE; FORCESEEK when the WHERE
                    compares the key's first column, never without (no seek plan: 8622); a comparison
                    counts with its column on either side, BETWEEN as a range; OR, IN (a, b) and NOT
                    BETWEEN are refused (several seek ranges, no index order). A plan compiled on an
                    empty queue must still seek at 10^6 rows (docs/queue-kinds.md, "Plans at depth")
options             a file sets ANSI_NULLS ON and QUOTED_IDENTIFIER ON before it creates anything
grants              every procedure (tSQLt test classes apart) is granted EXECUTE exactly once, but an
                    internal one (<q>_process_handler, run AS OWNER) is granted to no role

A table here is a schema-qualified name: table variables, #temp tables and CTEs are not tables.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from sqlfluff.core.parser import BaseSegment

from . import tsqlmodel as m
from .gosplit import mask_comments_and_strings
from .tsqltree import (TsqlParseError, child, children, code, conjuncts, descendants, disjuncts, fold, keywords,
                       kind, line_of, normalised, offset_of, parse_batch, split_name)

BATCH_LIMIT = 1000
CAP_ERROR = "51001"
BATCH_SIZE_PARAMETERS = ("@batch_size", "@page_size")


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    procedure: str | None
    rule: str
    message: str

    def __str__(self) -> str:
        where = f" (procedure {self.procedure})" if self.procedure else ""
        return f"{self.file}:{self.line}: {self.rule}: {self.message}{where}"


@dataclass(frozen=True)
class Claim:
    """A claim statement's hinted read of a table (the claim-hints test reads these)."""

    file: str
    line: int
    procedure: str
    table: str
    hints: tuple[str, ...]


@dataclass(frozen=True)
class IndexKey:
    """An index or key constraint the SQL creates: what a claim's INDEX hint is matched against."""

    file: str
    table: str                              # folded schema.table
    name: str                               # folded
    columns: tuple[tuple[str, bool], ...]   # the key: (folded column, descending)
    filter: tuple[str, ...]                 # a filtered index's WHERE conjuncts, normalised, aliases removed


@dataclass(frozen=True)
class PinnedRead:
    """A claim or probe of a table: its pin (INDEX, FORCESEEK) and what its index has to serve."""

    file: str
    line: int
    procedure: str
    what: str                               # "claim" or "probe"
    table: str                              # folded schema.table
    indexes: tuple[str, ...]                # folded names in INDEX (...), none without the hint
    forceseek: bool
    equal: tuple[str, ...]                  # columns compared with = (column on the left)
    ranged: tuple[str, ...]                 # columns compared with <, <=, >, >=
    order: tuple[tuple[str, bool], ...]     # ORDER BY: (folded column, descending)
    conditions: tuple[str, ...]             # every WHERE conjunct, normalised, aliases removed
    disjunctive: tuple[str, ...] = ()       # conjuncts (or the whole WHERE) with OR, IN (a, b), NOT BETWEEN


# ------------------------------------------------------------------------------------------------
# A procedure as a sequence of steps


@dataclass(frozen=True)
class Step:
    """A statement that is not control flow, or the condition of an IF / WHILE, in text order."""

    segment: BaseSegment
    kind: str                                # the statement's type, or "condition"
    guards: tuple[BaseSegment, ...]          # conditions of the IFs whose THEN branch holds the step
    in_try: bool
    in_catch: bool

    @property
    def line(self) -> int:
        return line_of(self.segment)

    @property
    def text(self) -> str:
        return normalised([self.segment])


def steps(segment: BaseSegment, guards: tuple[BaseSegment, ...] = (), in_try: bool = False,
          in_catch: bool = False) -> Iterator[Step]:
    for statement in children(segment, "statement"):
        yield from _statement_steps(statement, guards, in_try, in_catch)


def _statement_steps(statement: BaseSegment, guards, in_try, in_catch) -> Iterator[Step]:
    body = code(statement)[0]
    k = kind(body)
    if k == "begin_end_block":
        yield from steps(body, guards, in_try, in_catch)
    elif k == "try_catch":
        words: list[str] = []
        for c in code(body):
            if kind(c) == "keyword":
                words.append(c.raw.upper())
            elif kind(c) == "statement":
                section = words[-1] if words else ""
                yield from _statement_steps(c, guards, in_try or section == "TRY", in_catch or section == "CATCH")
    elif k == "if_then_statement":
        condition = None
        for c in code(body):
            if kind(c) == "if_clause":
                condition = child(c, "expression")
                yield Step(condition, "condition", guards, in_try, in_catch)
            elif kind(c) == "statement":
                yield from _statement_steps(c, guards + (condition,) if condition is not None else guards,
                                            in_try, in_catch)
                condition = None
            elif kind(c) == "keyword" and c.raw.upper() == "ELSE":
                condition = None
    elif k == "while_statement":
        yield Step(child(body, "expression"), "condition", guards, in_try, in_catch)
        yield from steps(body, guards, in_try, in_catch)
    else:
        yield Step(body, k, guards, in_try, in_catch)


@dataclass
class Procedure:
    file: str
    first_line: int
    name: str
    segment: BaseSegment
    steps: list[Step]

    def line(self, segment_or_line: BaseSegment | int) -> int:
        line = segment_or_line if isinstance(segment_or_line, int) else line_of(segment_or_line)
        return self.first_line + line - 1

    def violation(self, at: BaseSegment | int, rule: str, message: str) -> Violation:
        return Violation(self.file, self.line(at), self.name, rule, message)

    @property
    def parameters(self) -> list[tuple[str, set[str]]]:
        """(folded @name, keywords such as READONLY) of each parameter."""
        out: list[tuple[str, set[str]]] = []
        parameter_list = child(self.segment, "procedure_parameter_list")
        for c in code(parameter_list) if parameter_list is not None else []:
            if kind(c) == "parameter":
                out.append((fold(c.raw), set()))
            elif kind(c) == "keyword" and out:
                out[-1][1].add(c.raw.upper())
        return out


def procedures(tree: BaseSegment, file: str, first_line: int) -> list[Procedure]:
    out = []
    for segment in descendants(tree, "create_procedure_statement"):
        name = ".".join(c.raw for c in code(child(segment, "object_reference")) if kind(c) != "dot")
        body = child(segment, "procedure_statement")
        out.append(Procedure(file, first_line, name, segment, list(steps(body)) if body is not None else []))
    return out


def tables(segment: BaseSegment) -> list[tuple[str, BaseSegment]]:
    """Schema-qualified tables a step reads or writes, in the order it touches them: text order,
    except that OUTPUT ... INTO comes after the statement's own tables."""
    own, output = [], []
    for reference in descendants(segment, "table_reference"):
        parts = [c for c in code(reference) if kind(c) in m.IDENTIFIER_LEAVES]
        if len(parts) >= 2:
            own.append((".".join(fold(p.raw) for p in parts), reference))
    output_spans = [(offset_of(o), o.pos_marker.source_slice.stop) for o in descendants(segment, "output_clause")]
    for entry in list(own):
        start = offset_of(entry[1])
        if any(a <= start < b for a, b in output_spans):
            own.remove(entry)
            output.append(entry)
    return own + output


def hint_lists(segment: BaseSegment, nested: bool = True) -> Iterator[tuple[BaseSegment, list[str]]]:
    """Every table hint list below ``segment`` (only its own if not ``nested``): (the bracketed list,
    its hints upper case)."""
    posts = descendants(segment, "post_table_expression") if nested else children(segment, "post_table_expression")
    for post in posts:
        for bracketed in children(post, "bracketed"):
            hints = [normalised([h]) for h in children(bracketed, "query_hint_segment")]
            if hints:
                yield bracketed, hints


def _is_begin(step: Step) -> bool:
    return step.kind == "transaction_statement" and keywords(step.segment)[:1] == ["BEGIN"]


def _ends_transaction(step: Step) -> bool:
    return step.kind == "transaction_statement" and keywords(step.segment)[:1] in (["COMMIT"], ["ROLLBACK"])


def _touches(step: Step) -> bool:
    return _is_begin(step) or bool(tables(step.segment))


def _throw_with_arguments(step: Step) -> bool:
    return step.kind == "throw_statement" and len(code(step.segment)) > 1


def _in_then_branch(step: Step, condition: BaseSegment) -> bool:
    return any(guard is condition for guard in step.guards)


def _throws(procedure: Procedure, condition: BaseSegment, number: str | None = None) -> bool:
    """Whether the THEN branch of the IF with this condition THROWs (error ``number``, if given)."""
    return any(_in_then_branch(s, condition) and s.kind == "throw_statement" and
               (number is None or normalised(code(s.segment)[1:2]) == number) for s in procedure.steps)


# ------------------------------------------------------------------------------------------------
# Procedure rules


GUARD = ("@@TRANCOUNT = 0", "(@@OPTIONS & 2) = 0")
REFUSAL = ("@@TRANCOUNT > 0", "(@@OPTIONS & 2) <> 0")


def refuses_open_transaction(procedure: Procedure) -> bool:
    """It THROWs when @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0, before any BEGIN TRANSACTION."""
    for step in procedure.steps:
        if _is_begin(step):
            return False
        if step.kind == "condition" and not step.guards:
            texts = {d.text for d in disjuncts(step.segment)}
            if set(REFUSAL) <= texts and _throws(procedure, step.segment):
                return True
    return False


def rule_transaction_guard(procedure: Procedure) -> list[Violation]:
    if refuses_open_transaction(procedure):
        return []
    out = []
    for step in procedure.steps:
        guards = [{c.text for c in conjuncts(g) or []} for g in step.guards]
        if _is_begin(step) and not any(set(GUARD) <= g for g in guards):
            out.append(procedure.violation(step.segment, "transaction-guard",
                                           "BEGIN TRANSACTION outside IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0: "
                                           "a caller with IMPLICIT_TRANSACTIONS ON gets two levels (error 266)"))
        if _ends_transaction(step) and not any("@STARTED_TRANSACTION = 1" in g for g in guards):
            out.append(procedure.violation(step.segment, "transaction-guard",
                                           f"{keywords(step.segment)[0]} outside IF @started_transaction = 1: "
                                           "it would end a transaction the procedure did not begin"))
    return out


def _sets(step: Step, text: str) -> bool:
    return step.kind == "set_segment" and step.text == text


DUPLICATE_KEY = "ERROR_NUMBER() NOT IN (2601, 2627)"
SESSION_CONTEXT_REFUSED = "ERROR_NUMBER() NOT IN (15664, 15665)"


def _try_catch_sections(block: BaseSegment) -> dict[str, list[BaseSegment]]:
    """The statements of a BEGIN TRY ... END TRY BEGIN CATCH ... END CATCH block, by section ("TRY",
    "CATCH"): each one's own segment (its first code child)."""
    sections: dict[str, list[BaseSegment]] = {}
    words: list[str] = []
    for c in code(block):
        if kind(c) == "keyword":
            words.append(c.raw.upper())
        elif kind(c) == "statement":
            sections.setdefault(words[-1] if words else "", []).append(code(c)[0])
    return sections


def _duplicate_key_window(procedure: Procedure, at: int) -> bool:
    """Whether the SET XACT_ABORT OFF at body[at] opens one of the windows the rule allows: an insert
    that may meet a duplicate key and retry (the grouped producer's new group row; a range-locked check
    would wait for the neighbouring key's holder), or the look's record in the session context, which a
    read-only key or a full session context refuses (the session then looks again). Exactly

        SET XACT_ABORT OFF;
        BEGIN TRY
            INSERT INTO ... VALUES (...);           -- or EXEC sys.sp_set_session_context ...;
            SET XACT_ABORT ON;
            ...                                      -- anything more, under XACT_ABORT ON
        END TRY
        BEGIN CATCH
            SET XACT_ABORT ON;
            IF ERROR_NUMBER() NOT IN (2601, 2627) OR ... THROW;   -- (15664, 15665) for the EXEC
        END CATCH;

    so one statement (no SELECT) runs under XACT_ABORT OFF, the error it may meet leaves the
    transaction committable, and anything else is rethrown under XACT_ABORT ON."""
    window = procedure.steps[at + 1:]
    if len(window) < 2:
        return False
    insert, on_in_try = window[:2]
    statement_kind = "insert_statement" if insert.kind == "insert_statement" else "execute_script_statement"
    block = next((b for b in descendants(procedure.segment, "try_catch")
                  if any(s is insert.segment for s in descendants(b, statement_kind))
                  and not any(s is insert.segment for inner in descendants(b, "try_catch")
                              for s in descendants(inner, statement_kind))), None)
    if block is None:
        return False
    sections = _try_catch_sections(block)
    in_try = len(sections.get("TRY", []))
    if in_try < 2 or len(window) < in_try + 3:
        return False
    on_in_catch, condition, throw = window[in_try:in_try + 3]
    if insert.kind == "insert_statement":
        allowed = DUPLICATE_KEY
        statement_fits = "VALUES" in insert.text.split() and "SELECT" not in insert.text.split()
    else:
        allowed = SESSION_CONTEXT_REFUSED
        # That procedure exactly, and never making a key read-only (which would refuse every later write).
        statement_fits = (_compact(insert.text).startswith("EXECSYS.SP_SET_SESSION_CONTEXT@")
                          and "@READ_ONLY" not in _compact(insert.text))
    # After XACT_ABORT is ON again, the TRY may go on (what it does runs under ON).
    return (statement_fits
            and [s.segment for s in (insert, on_in_try)] == sections.get("TRY", [])[:2]
            and _sets(on_in_try, "SET XACT_ABORT ON") and _sets(on_in_catch, "SET XACT_ABORT ON")
            and sections.get("CATCH", [None])[0] is on_in_catch.segment and len(sections.get("CATCH", [])) == 2
            and condition.kind == "condition"
            and _compact(allowed) in {_compact(d.text) for d in disjuncts(condition.segment)}
            and throw.kind == "throw_statement" and not _throw_with_arguments(throw)
            and any(g is condition.segment for g in throw.guards))


# Hints that keep a read's lock to the end of the transaction, or take more than a row's shared lock.
HOLDING_HINTS = frozenset({"HOLDLOCK", "SERIALIZABLE", "REPEATABLEREAD", "UPDLOCK", "XLOCK", "TABLOCK",
                           "TABLOCKX", "PAGLOCK"})


def _read_only_unfit(procedure: Procedure) -> tuple[BaseSegment, str] | None:
    """Why the procedure may not run without SET XACT_ABORT ON (None: it may). A verb that changes
    nothing (lease_status) stays under XACT_ABORT OFF, so that a lock timeout in its reads leaves a
    caller's transaction as it was: it writes only table variables, begins no transaction, calls
    nothing, sets XACT_ABORT OFF before anything, reads every table inside BEGIN TRY (OFF, a
    statement's error would not end the batch: the procedure would go on and answer from half its
    reads) and every CATCH of it only rethrows; it runs at READ COMMITTED and reads every table
    with READCOMMITTEDLOCK and no hint that keeps the lock (the waits it promises, no lock kept)."""
    body = procedure.steps
    off = next((s for s in body if _sets(s, "SET XACT_ABORT OFF")), None)
    if off is None or offset_of(off.segment) > offset_of(body[1].segment if len(body) > 1 else off.segment):
        return (procedure.segment, "SET XACT_ABORT OFF is not its second statement")
    for step in body:
        if _is_begin(step) or _ends_transaction(step):
            return (step.segment, "it begins or ends a transaction")
        if step.kind == "execute_script_statement":
            return (step.segment, "it calls a procedure")
        if step.kind in ("update_statement", "delete_statement", "merge_statement", "insert_statement"):
            target = child(step.segment, "table_reference")
            if target is None or not target.raw.startswith("@"):
                return (step.segment, "it writes a table")
        if tables(step.segment) and (not step.in_try or step.in_catch):
            return (step.segment, "it reads a table outside BEGIN TRY")
    if not any(s.text == "SET TRANSACTION ISOLATION LEVEL READ COMMITTED" for s in body):
        return (procedure.segment, "it does not SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    for element in descendants(procedure.segment, "from_expression_element"):
        reference = next(descendants(element, "table_reference", stop=("select_statement",)), None)
        if reference is None or reference.raw.startswith(("@", "#")):
            continue
        hints = [h for _, listed in hint_lists(element, nested=False) for h in listed]
        if "READCOMMITTEDLOCK" not in hints or set(hints) & HOLDING_HINTS:
            return (element, "a table read without READCOMMITTEDLOCK (under READ_COMMITTED_SNAPSHOT it would "
                             "answer from row versions without waiting) or with a hint that keeps its lock")
    for block in descendants(procedure.segment, "try_catch"):
        caught = _try_catch_sections(block).get("CATCH", [])
        if len(caught) != 1 or kind(caught[0]) != "throw_statement" or len(code(caught[0])) > 1:
            return (block, "its CATCH does more than THROW; (or less: an empty one swallows the error)")
    return None


def rule_xact_abort(procedure: Procedure) -> list[Violation]:
    rule = "xact-abort"
    body = procedure.steps
    if not body or body[0].text != "SET NOCOUNT ON":
        at = body[0].segment if body else procedure.segment
        return [procedure.violation(at, rule, "the first statement is not SET NOCOUNT ON")]
    xact = next((s for s in body if _sets(s, "SET XACT_ABORT ON")), None)
    if xact is None:
        unfit = _read_only_unfit(procedure)
        if unfit is None:
            return []
        at, why = unfit
        return [procedure.violation(at, rule, f"no SET XACT_ABORT ON, and not read-only under TRY: {why}")]
    out = []
    at = offset_of(xact.segment)
    xact_line = procedure.line(xact.segment)
    checks = [s for s in body if _throw_with_arguments(s) and not s.in_try and offset_of(s.segment) < at]
    if checks and not any(_sets(s, "SET XACT_ABORT OFF") and offset_of(s.segment) < offset_of(checks[0].segment)
                          for s in body):
        out.append(procedure.violation(checks[0].segment, rule, "argument check THROW without SET XACT_ABORT OFF "
                                                                "before it: a caller whose session has XACT_ABORT "
                                                                "ON would have its transaction doomed; start with "
                                                                "SET NOCOUNT ON; SET XACT_ABORT OFF;"))
    for step in body:
        if offset_of(step.segment) <= at:
            continue
        if _throw_with_arguments(step) and not step.in_try:
            out.append(procedure.violation(step.segment, rule, f"THROW outside BEGIN TRY after SET XACT_ABORT ON "
                                                               f"(line {xact_line}): it dooms the caller's "
                                                               "transaction; check arguments before SET XACT_ABORT "
                                                               "ON, raise state errors in TRY"))
        elif _sets(step, "SET XACT_ABORT OFF") and not _duplicate_key_window(procedure, body.index(step)):
            out.append(procedure.violation(step.segment, rule, f"SET XACT_ABORT OFF after SET XACT_ABORT ON (line "
                                                               f"{xact_line}): the procedure's work must run under "
                                                               "XACT_ABORT ON"))
    first = next((s for s in body if _touches(s)), None)
    if first is not None and offset_of(first.segment) < at:
        out.append(procedure.violation(first.segment, rule, f"reads or writes a table or begins a transaction "
                                                            f"before SET XACT_ABORT ON (line "
                                                            f"{procedure.line(xact.segment)})"))
    return out


def claims(procedure: Procedure) -> list[tuple[BaseSegment, list[str], str, BaseSegment]]:
    """(hint list, hints, table, statement) of every claim: a hinted read in a CTE that the statement
    UPDATEs or DELETEs, or the target of DELETE TOP (n)."""
    out = []
    for with_statement in descendants(procedure.segment, "with_compound_statement"):
        body = next((c for c in code(with_statement) if kind(c) in ("update_statement", "delete_statement")), None)
        if body is None:
            continue
        target = child(body, "table_reference")
        target_name = fold(target.raw) if target is not None else None
        for cte in children(with_statement, "common_table_expression"):
            name = fold(child(cte, "naked_identifier", "quoted_identifier").raw)
            query = next(descendants(cte, "select_statement"), None)
            if name != target_name or query is None:
                continue
            from_clause = child(query, "from_clause")
            elements = descendants(from_clause, "from_expression_element", stop=("select_statement",)) \
                if from_clause is not None else []
            for element in elements:
                reference = next(descendants(element, "table_reference", stop=("select_statement",)), None)
                for bracketed, hints in hint_lists(element, nested=False):
                    out.append((bracketed, hints, reference.raw if reference is not None else "", body))
    for delete in descendants(procedure.segment, "delete_statement"):
        if "TOP" in keywords(delete):
            for bracketed, hints in hint_lists(delete, nested=False):
                out.append((bracketed, hints, child(delete, "table_reference").raw, delete))
    return out


def rule_updlock(procedure: Procedure) -> list[Violation]:
    rule = "updlock"
    out = []
    claimed = {id(bracketed): (hints, body) for bracketed, hints, _, body in claims(procedure)}
    for bracketed, hints in hint_lists(procedure.segment):
        if "UPDLOCK" not in hints or "HOLDLOCK" in hints:
            continue
        if id(bracketed) not in claimed:
            out.append(procedure.violation(bracketed, rule, f"UPDLOCK outside a claim (WITH ({', '.join(hints)})): "
                                                            "a look-up holds U locks to the end of the transaction; "
                                                            "probe with READPAST, READCOMMITTEDLOCK, or lock a key "
                                                            "with UPDLOCK, HOLDLOCK"))
            continue
        _, body = claimed[id(bracketed)]
        if "READPAST" not in hints and kind(body) != "delete_statement":
            out.append(procedure.violation(bracketed, rule, "a claim without READPAST is only the strict FIFO's "
                                                            "CTE-then-DELETE"))
        missing = [h for h in ("ROWLOCK", "READCOMMITTEDLOCK") if h not in hints]
        if missing:
            out.append(procedure.violation(bracketed, rule, f"a claim without {' and '.join(missing)}"))
    return out


QUEUE_TABLE_SUFFIXES = (("_history", 1), ("_dead", 2))


def _queue_table(name: str) -> tuple[str, int]:
    """(the queue's table, rank in the lock order): s.q -> (s.q, 0), s.q_history -> 1, s.q_dead -> 2.
    (Told apart by name, so a queue named like another's history table would be mistaken for it.)"""
    for suffix, rank in QUEUE_TABLE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], rank
    return name, 0


def own_transactions(procedure: Procedure) -> list[list[Step]]:
    """The steps of a procedure that owns its transactions, split at its BEGIN / COMMIT / ROLLBACK
    TRANSACTION: one part per transaction (and the parts between, which hold none)."""
    parts: list[list[Step]] = [[]]
    for step in procedure.steps:
        if _is_begin(step) or _ends_transaction(step):
            parts.append([])
        else:
            parts[-1].append(step)
    return parts


def rule_table_order(procedure: Procedure) -> list[Violation]:
    out = []
    parts = own_transactions(procedure) if refuses_open_transaction(procedure) else [procedure.steps]
    for part in parts:
        first: dict[str, BaseSegment] = {}      # table -> where the part first touches it, in order
        for step in part:
            for name, reference in tables(step.segment):
                first.setdefault(name, reference)
        order = list(first)
        for index, name in enumerate(order):
            base, rank = _queue_table(name)
            earlier = next((e for e in order[:index] if _queue_table(e)[0] == base and _queue_table(e)[1] > rank),
                           None)
            if earlier is not None:
                out.append(procedure.violation(first[earlier], "table-order",
                                               f"touches {earlier} before {name} (line "
                                               f"{procedure.line(first[name])}): the lock order is queue -> history "
                                               "-> dead-letter"))
    return out


def _mentions(step: Step, parameter: str) -> bool:
    return any(fold(p.raw) == parameter for p in descendants(step.segment, "parameter")) or (
        kind(step.segment) == "parameter" and fold(step.segment.raw) == parameter)


def _writes(step: Step) -> bool:
    return step.kind in ("insert_statement", "update_statement", "delete_statement", "merge_statement") or (
        step.kind == "with_compound_statement" and any(
            kind(c) in ("insert_statement", "update_statement", "delete_statement", "merge_statement")
            for c in code(step.segment)))


def _counts(segment: BaseSegment, parameter: str) -> bool:
    """A SELECT COUNT(...) / COUNT_BIG(...) FROM the parameter somewhere in ``segment``."""
    for select in descendants(segment, "select_statement"):
        functions = [f for f in descendants(child(select, "select_clause"), "function")]
        sources = [fold(r.raw) for r in descendants(select, "table_reference")]
        if parameter in sources and any(normalised([child(f, "function_name")]) in ("COUNT", "COUNT_BIG")
                                         for f in functions):
            return True
    return False


def _caps(condition: BaseSegment, subject: str) -> bool:
    """Whether a disjunct of the condition is ``subject`` (normalised text) above 1000."""
    above = (f"{subject} > {BATCH_LIMIT}", f"{subject} >= {BATCH_LIMIT + 1}", f"{BATCH_LIMIT} < {subject}")
    return any(d.text in above or (d.text.startswith(subject + " ") and
                                   d.text.endswith(f"NOT BETWEEN 1 AND {BATCH_LIMIT}"))
               for d in disjuncts(condition))


def _lower_bound(condition: BaseSegment, subject: str) -> bool:
    """Whether a disjunct of the condition is ``subject`` below 1."""
    below = (f"{subject} < 1", f"{subject} <= 0", f"{subject} NOT BETWEEN 1 AND {BATCH_LIMIT}")
    return any(d.text in below for d in disjuncts(condition))


def _count_text(condition: BaseSegment, parameter: str) -> str:
    """The normalised text of the bracketed COUNT subquery over ``parameter`` in a condition."""
    for operand in disjuncts(condition):
        for segment in operand.segments:
            if kind(segment) == "bracketed" and _counts(segment, parameter):
                return normalised([segment])
    return ""


def _row_count_check(procedure: Procedure, parameter: str) -> Step | None:
    """The IF that THROWs 51001 when the table-valued parameter holds more than 1000 rows: its COUNT
    compared in the condition, or a variable set from that COUNT (DECLARE @n int = (SELECT COUNT...))."""
    counters = set()
    for step in procedure.steps:
        if step.kind in ("declare_segment", "set_local_variable_segment") and _counts(step.segment, parameter):
            counters.add(next(descendants(step.segment, "parameter")).raw.upper())
    for step in procedure.steps:
        if step.kind != "condition" or not _throws(procedure, step.segment, CAP_ERROR):
            continue
        if _counts(step.segment, parameter) and _caps(step.segment, _count_text(step.segment, parameter)):
            return step
        if any(_caps(step.segment, counter) for counter in counters):
            return step
    return None


def _size_check(procedure: Procedure, parameter: str) -> Step | None:
    """The IF that THROWs 51001 unless @batch_size / @page_size is BETWEEN 1 AND 1000."""
    subject = parameter.upper()
    return next((s for s in procedure.steps if s.kind == "condition" and _caps(s.segment, subject) and
                 _lower_bound(s.segment, subject) and _throws(procedure, s.segment, CAP_ERROR)), None)


def _bounded_chunk(expression: BaseSegment) -> bool:
    """@@ROWCOUNT (no more than the chunk before), or numbers that are all at most 1000 (and one)."""
    if normalised([expression]) == "@@ROWCOUNT":
        return True
    numbers = [int(n.raw) for n in descendants(expression, "integer_literal")]
    return bool(numbers) and max(numbers) <= BATCH_LIMIT


def _assignments(procedure: Procedure, variable: str) -> Iterator[tuple[Step, BaseSegment]]:
    """(step, value) of every DECLARE with a value and SET of the local variable."""
    for step in procedure.steps:
        if step.kind not in ("declare_segment", "set_local_variable_segment"):
            continue
        named = next(descendants(step.segment, "parameter"), None)
        value = next(descendants(step.segment, "expression"), None)
        if named is not None and fold(named.raw) == variable and value is not None:
            yield step, value


def _purge_chunks(procedure: Procedure) -> list[Violation]:
    """A purge (a procedure with @max_rows) deletes in chunks of TOP (n) or TOP (@v): n, and every
    value @v is given, at most 1000."""
    out = []
    own = {name for name, _ in procedure.parameters}
    chunks: dict[str, str] = {}     # folded variable -> as written
    for modifier in descendants(procedure.segment, "select_clause_modifier"):
        if keywords(modifier)[:1] != ["TOP"]:
            continue
        expression = next(descendants(modifier, "expression"), None)
        inner = code(expression) if expression is not None else []
        if len(inner) != 1:
            continue
        if kind(inner[0]) == "integer_literal" and int(inner[0].raw) > BATCH_LIMIT:
            out.append(procedure.violation(modifier, "batch-cap", f"a purge chunk of TOP ({inner[0].raw}): at most "
                                                                  f"{BATCH_LIMIT} rows per chunk"))
        elif kind(inner[0]) == "parameter" and fold(inner[0].raw) not in own:
            chunks.setdefault(fold(inner[0].raw), inner[0].raw)
    for variable, written in chunks.items():
        for step, value in _assignments(procedure, variable):
            if not _bounded_chunk(value):
                out.append(procedure.violation(step.segment, "batch-cap", f"the purge chunk TOP ({written}) is set to "
                                               f"{' '.join(value.raw.split())}: it must stay at most {BATCH_LIMIT} "
                                               f"rows (every number in it at most {BATCH_LIMIT})"))
    return out


def rule_batch_cap(procedure: Procedure) -> list[Violation]:
    rule = "batch-cap"
    out = _purge_chunks(procedure) if any(name == "@max_rows" for name, _ in procedure.parameters) else []
    for name, words in procedure.parameters:
        if "READONLY" in words:
            check = _row_count_check(procedure, name)
            if check is None:
                out.append(procedure.violation(procedure.segment, rule,
                                               f"{name} READONLY is not refused above {BATCH_LIMIT} rows (IF (SELECT "
                                               f"COUNT(*) FROM {name}) > {BATCH_LIMIT} THROW {CAP_ERROR})"))
                continue
            write = next((s for s in procedure.steps if _writes(s) and _mentions(s, name)), None)
            if write is not None and offset_of(write.segment) < offset_of(check.segment):
                out.append(procedure.violation(write.segment, rule, f"{name} feeds a write before its row count is "
                                                                    f"checked (line {procedure.line(check.segment)})"))
        elif name in BATCH_SIZE_PARAMETERS:
            check = _size_check(procedure, name)
            if check is None:
                out.append(procedure.violation(procedure.segment, rule, f"{name} is not checked BETWEEN 1 AND "
                                                                        f"{BATCH_LIMIT} (THROW {CAP_ERROR})"))
                continue
            for step in procedure.steps:
                if offset_of(step.segment) >= offset_of(check.segment):
                    break
                # SET @batch_size = COALESCE(@batch_size, 1) before the check is not a use.
                assigns = step.kind == "set_local_variable_segment" and fold(
                    next(descendants(step.segment, "parameter")).raw) == name
                if _mentions(step, name) and not assigns:
                    out.append(procedure.violation(step.segment, rule, f"{name} is used before its check (line "
                                                                       f"{procedure.line(check.segment)})"))
                    break
    return out


TRANSIENT_ERRORS = "ERROR_NUMBER() NOT IN (1205, 1222, 3960)"
DEADLOCK_RETRY = ("ERROR_NUMBER() <> 1205", "@STARTED_TRANSACTION = 0")


def _compact(text: str) -> str:
    return text.replace(" ", "").upper()


def rule_transient_retry(procedure: Procedure) -> list[Violation]:
    owner = refuses_open_transaction(procedure)
    victim = any(_sets(s, "SET DEADLOCK_PRIORITY LOW") for s in procedure.steps) and any(
        _is_begin(s) for s in procedure.steps)
    if not owner and not victim:
        return []
    required = (TRANSIENT_ERRORS,) if owner else DEADLOCK_RETRY
    out = []
    for step in procedure.steps:
        # The outermost CATCH: a THROW in a CATCH inside a TRY goes to the retrying CATCH around it.
        if step.kind != "throw_statement" or not step.in_catch or step.in_try:
            continue
        if not any({_compact(r) for r in required} <= {_compact(d.text) for d in disjuncts(guard)}
                   for guard in step.guards):
            out.append(procedure.violation(step.segment, "transient-retry",
                                           f"THROW in the outermost CATCH without IF {' OR '.join(required)} OR ...: "
                                           + ("a deadlock, lock timeout or snapshot conflict of the worker's own "
                                              "transaction must be retried" if owner else
                                              "a deadlock of the procedure's own transaction must be retried "
                                              "(and only of its own)")))
    return out


def rule_bury_guard(procedure: Procedure) -> list[Violation]:
    out = []
    for delete in descendants(procedure.segment, "delete_statement"):
        sources = {fold(r.raw) for r in descendants(delete, "table_reference")}
        targets = {fold(r.raw) for o in descendants(delete, "output_clause") for r in descendants(o, "table_reference")}
        if "@claimed" not in sources - targets or not any(t.endswith("_dead") or t == "@buried" for t in targets):
            continue
        where = child(delete, "where_clause")
        if where is None or "PREVIOUS_VISIBLE_AT <= @NOW" not in normalised([where]):
            out.append(procedure.violation(delete, "bury-guard", "claimed rows moved to the dead-letter table without "
                                                                 "previous_visible_at <= @now: a worker's own live "
                                                                 "lease would be buried"))
    return out


def rule_select_star(procedure: Procedure) -> list[Violation]:
    return [procedure.violation(star, "select-star", "SELECT *: a procedure names the columns it returns")
            for star in descendants(procedure.segment, "wildcard_expression")]


def rule_update_payload(procedure: Procedure) -> list[Violation]:
    out = []
    for update in descendants(procedure.segment, "update_statement"):
        for clause in descendants(update, "set_clause"):
            target = child(clause, "column_reference")
            if target is not None and fold(code(target)[-1].raw) == "payload":
                out.append(procedure.violation(clause, "update-payload",
                                               "an UPDATE sets payload: SQL Server then checks ck_<queue>_payload_json "
                                               "(an ISJSON parse) on every row it updates, and a queue never "
                                               "changes a message's payload"))
    return out


PROCEDURE_RULES = (rule_transaction_guard, rule_xact_abort, rule_updlock, rule_table_order, rule_batch_cap,
                   rule_transient_retry, rule_bury_guard, rule_select_star, rule_update_payload)
# The rules about a procedure's own work; tSQLt test procedures are exempt (they are not the contract).
# Procedures of a queue that no role may call: process reaches its handler check (EXECUTE AS OWNER)
# through the ownership chain.
INTERNAL_PROCEDURE_SUFFIXES = ("_process_handler",)
PROCEDURE_RULE_NAMES = {"transaction-guard", "xact-abort", "updlock", "table-order", "batch-cap", "transient-retry",
                        "bury-guard", "select-star", "update-payload", "claim-pin"}


# ------------------------------------------------------------------------------------------------
# Batch rules


def rule_readpast(tree: BaseSegment, where) -> list[Violation]:
    out = []
    for bracketed, hints in hint_lists(tree):
        if "READPAST" in hints and "READCOMMITTEDLOCK" not in hints:
            out.append(where(bracketed, "readpast", f"READPAST without READCOMMITTEDLOCK (WITH ({', '.join(hints)})) "
                                                    "is refused under READ_COMMITTED_SNAPSHOT"))
    return out


def rule_nolock(tree: BaseSegment, where) -> list[Violation]:
    return [where(bracketed, "nolock", f"WITH ({', '.join(hints)}) reads uncommitted rows")
            for bracketed, hints in hint_lists(tree) if {"NOLOCK", "READUNCOMMITTED"} & set(hints)]


def rule_dynamic_sql(tree: BaseSegment, where) -> list[Violation]:
    out = []
    for statement in descendants(tree, "execute_script_statement"):
        reference = child(statement, "object_reference")
        bracketed = child(statement, "bracketed")
        if reference is None and bracketed is not None:
            inner = [c for c in code(bracketed) if kind(c) not in ("start_bracket", "end_bracket")]
            if len(inner) != 1 or kind(inner[0]) != "quoted_literal":
                out.append(where(statement, "dynamic-sql", "EXEC (...) of text built at run time"))
        elif reference is not None and fold(reference.raw.split(".")[-1]) == "sp_executesql":
            out.append(where(statement, "dynamic-sql", "sp_executesql runs text built at run time"))
    return out


def rule_abs_checksum(tree: BaseSegment, where) -> list[Violation]:
    out = []
    for function in descendants(tree, "function"):
        if normalised([child(function, "function_name")]) != "ABS":
            continue
        argument = next(descendants(function, "expression"), None)
        inner = code(argument) if argument is not None else []
        if len(inner) == 1 and kind(inner[0]) == "function" and normalised(
                [child(inner[0], "function_name")]) in ("CHECKSUM", "BINARY_CHECKSUM"):
            written = " ".join(function.raw.split())
            out.append(where(function, "abs-checksum", f"{written} overflows (8115) when CHECKSUM returns "
                                                       "-2147483648: take the remainder first, ABS(CHECKSUM(...) % n)"))
    return out


# ------------------------------------------------------------------------------------------------
# Pins: every claim and probe names the index its plan must seek on (checked once every batch is
# read: the index is created in another batch, of the same file or, failing that, of another)


PROBE_HINTS = {"ROWLOCK", "READPAST", "READCOMMITTEDLOCK"}
_ALIAS = re.compile(r"\b\w+ \. ")      # normalised text spells m.col as "M . COL"
_COMPARISON = re.compile(r"(\w+) (=|<=|<|>=|>) .+")
# The column on the right (@now >= visible_at): the comparison read from the column's side.
_REVERSED = re.compile(r"(?!\w+ (?:=|<=|<|>=|>) ).+ (=|<=|<|>=|>) ([A-Z_][A-Z0-9_]*)", re.IGNORECASE)
_FLIPPED = {"=": "=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_BETWEEN = re.compile(r"(\w+) (NOT )?BETWEEN .+ AND .+", re.IGNORECASE)
_IN = re.compile(r"(\w+) (NOT )?IN \((.+)\)", re.IGNORECASE)


def _table_name(reference: BaseSegment) -> str:
    return ".".join(fold(p.raw) for p in code(reference) if kind(p) in m.IDENTIFIER_LEAVES)


def _key_columns(segment: BaseSegment) -> tuple[tuple[str, bool], ...]:
    return tuple((fold(next(i for i in code(c) if kind(i) in m.IDENTIFIER_LEAVES).raw), "DESC" in keywords(c))
                 for c in descendants(segment, "index_column_definition"))


def _conditions(where: BaseSegment | None) -> tuple[str, ...]:
    expression = child(where, "expression") if where is not None else None
    parts = conjuncts(expression) if expression is not None else []
    return tuple(_ALIAS.sub("", p.text) for p in parts or [])


def index_keys(tree: BaseSegment, file: str) -> list[IndexKey]:
    """The indexes and key constraints (PRIMARY KEY, UNIQUE) a batch creates."""
    out = []
    for statement in descendants(tree, "create_index_statement"):
        name = next(i for i in code(child(statement, "index_reference")) if kind(i) in m.IDENTIFIER_LEAVES)
        out.append(IndexKey(file, _table_name(child(statement, "table_reference")), fold(name.raw),
                            _key_columns(statement), _conditions(child(statement, "where_clause"))))
    for statement in descendants(tree, "create_table_statement"):
        table = _table_name(child(statement, "table_reference"))
        for constraint in descendants(statement, "table_constraint"):
            name = child(constraint, "object_reference")
            if name is not None and {"PRIMARY", "UNIQUE"} & set(keywords(constraint)):
                out.append(IndexKey(file, table, fold(name.raw), _key_columns(constraint), ()))
    return out


def _order(select: BaseSegment) -> tuple[tuple[str, bool], ...]:
    clause = child(select, "orderby_clause")
    order: list[list] = []
    for c in code(clause) if clause is not None else []:
        if kind(c) == "column_reference":
            order.append([fold(code(c)[-1].raw), False])
        elif kind(c) == "keyword" and c.raw.upper() == "DESC" and order:
            order[-1][1] = True
    return tuple((column, descending) for column, descending in order)


def _pinned_read(procedure: Procedure, what: str, bracketed: BaseSegment, hints: list[str],
                 reference: BaseSegment, select: BaseSegment | None,
                 join_on: BaseSegment | None = None) -> PinnedRead:
    """join_on: the ON of the join whose table this is: its comparisons serve the seek as the WHERE's do."""
    indexes = tuple(fold(r.raw) for q in children(bracketed, "query_hint_segment") if keywords(q)[:1] == ["INDEX"]
                    for r in descendants(q, "index_reference"))
    where = child(select, "where_clause") if select is not None else None
    conditions = _conditions(where) + _conditions(join_on)
    compared, disjunctive = _compared(conditions)
    expression = child(where, "expression") if where is not None else None
    if expression is not None and conjuncts(expression) is None:      # a top-level OR
        disjunctive.append(_ALIAS.sub("", normalised([expression])))
    return PinnedRead(procedure.file, procedure.line(bracketed), procedure.name, what, _table_name(reference),
                      indexes, "FORCESEEK" in hints, tuple(c.lower() for c, op in compared if op == "="),
                      tuple(c.lower() for c, op in compared if op != "="),
                      _order(select) if select is not None else (), conditions, tuple(disjunctive))


def _compared(conditions: tuple[str, ...]) -> tuple[list[tuple[str, str]], list[str]]:
    """The (column, operator) pairs a seek can use, with the column on either side (BETWEEN: a range,
    IN with one value: =), and the conjuncts that are no single seek range: OR, IN (a, b) or
    IN (SELECT ...), NOT BETWEEN. NOT IN and <> are residual predicates: neither."""
    compared: list[tuple[str, str]] = []
    disjunctive: list[str] = []
    for text in conditions:
        between, listed = _BETWEEN.fullmatch(text), _IN.fullmatch(text)
        comparison, reversed_ = _COMPARISON.fullmatch(text), _REVERSED.fullmatch(text)
        if re.search(r"\bOR\b", mask_comments_and_strings(text), re.IGNORECASE):
            disjunctive.append(text)
        elif listed:
            if listed[2]:
                continue
            if "," in mask_comments_and_strings(listed[3]) or re.match(r"SELECT\b", listed[3], re.IGNORECASE):
                disjunctive.append(text)
            else:
                compared.append((listed[1], "="))
        elif between:
            if between[2]:
                disjunctive.append(text)
            else:
                compared.append((between[1], ">="))
        elif comparison:
            compared.append(comparison.groups())
        elif reversed_:
            compared.append((reversed_[2], _FLIPPED[reversed_[1]]))
    return compared, disjunctive


def pinned_reads(procedure: Procedure) -> list[PinnedRead]:
    """The claims (claims() whose hints take UPDLOCK: a purge's chunk is not one), the probes, and
    every other read that names an index (INDEX (...): a plain read pinned to its key, e.g. dead_list's
    pages) of a procedure."""
    claimed = {id(bracketed): hints for bracketed, hints, _, _ in claims(procedure)}
    out = []
    for select in descendants(procedure.segment, "select_statement"):
        from_clause = child(select, "from_clause")
        joined = {id(child(join, "from_expression_element")): child(join, "join_on_condition")
                  for join in descendants(from_clause, "join_clause", stop=("select_statement",))} \
            if from_clause is not None else {}
        for element in descendants(from_clause, "from_expression_element", stop=("select_statement",)) \
                if from_clause is not None else []:
            reference = next(descendants(element, "table_reference", stop=("select_statement",)), None)
            for bracketed, hints in hint_lists(element, nested=False):
                if id(bracketed) in claimed:
                    what = "claim" if "UPDLOCK" in hints else None
                elif PROBE_HINTS <= set(hints) and "UPDLOCK" not in hints:
                    what = "probe"
                else:
                    what = "read" if any(h.startswith("INDEX") for h in hints) else None
                if what is not None and reference is not None:
                    out.append(_pinned_read(procedure, what, bracketed, hints, reference, select,
                                            joined.get(id(element))))
    for delete in descendants(procedure.segment, "delete_statement"):     # DELETE TOP (n) FROM t WITH (...)
        if "TOP" in keywords(delete):
            for bracketed, hints in hint_lists(delete, nested=False):
                if "UPDLOCK" in hints:
                    out.append(_pinned_read(procedure, "claim", bracketed, hints, child(delete, "table_reference"),
                                            None))
    return out


def _written(columns) -> str:
    return ", ".join(f"{c}{' DESC' if d else ''}" for c, d in columns)


def _key_mismatch(key: IndexKey, read: PinnedRead) -> str | None:
    """Why the index cannot hand the read its rows in order with one seek, or None."""
    columns = key.columns
    equal = len(read.equal)
    if {c for c, _ in columns[:equal]} != set(read.equal):
        return f"does not start with the columns the {read.what} compares with = ({', '.join(read.equal)})"
    rest = columns[equal:]
    if read.order:
        head = rest[:len(read.order)]
        if [c for c, _ in head] != [c for c, _ in read.order] or len(
                {kd != od for (_, kd), (_, od) in zip(head, read.order)}) > 1:
            return (f"is not, after the =-compared columns, the ORDER BY {_written(read.order)} in one direction: "
                    "a sort of every matching row")
    if read.ranged and (len(set(read.ranged)) > 1 or not rest or rest[0][0] != read.ranged[0]):
        return (f"does not have the range column{'s' if len(set(read.ranged)) > 1 else ''} "
                f"{', '.join(sorted(set(read.ranged)))} next after the =-compared columns: no range seek")
    missing = [f for f in key.filter if f not in read.conditions]
    if missing:
        return (f"is filtered (WHERE {' AND '.join(key.filter)}) and the {read.what} does not repeat "
                f"{' AND '.join(missing)}: the optimizer cannot use the index (8622)")
    return None


def check_pins(reads: Iterable[PinnedRead], indexes: Iterable[IndexKey]) -> list[Violation]:
    """The claim-pin rule: each read's INDEX hint against the indexes created (by its own file when
    that creates the index, or else by any)."""
    indexes = list(indexes)
    out = []
    for read in reads:
        def violation(message: str, read: PinnedRead = read) -> Violation:
            return Violation(read.file, read.line, read.procedure, "claim-pin", message)

        if len(read.indexes) != 1:
            out.append(violation(f"a {read.what} of {read.table} without INDEX (ix): a plan compiled on an empty queue "
                                 "may scan it at depth; name the index whose key is its WHERE and ORDER BY"
                                 if not read.indexes else
                                 f"a {read.what} of {read.table} names {len(read.indexes)} indexes in INDEX (...)"))
            continue
        if read.disjunctive:
            out.append(violation(f"a {read.what} of {read.table} whose WHERE has {' AND '.join(read.disjunctive)}: "
                                 "OR, IN (a, b) and NOT BETWEEN are several seek ranges, whose rows come back in no "
                                 "index order (a sort of every matching row); claim each in a statement of its own"))
            continue
        name = read.indexes[0]
        found = [i for i in indexes if i.table == read.table and i.name == name]
        key = ([i for i in found if i.file == read.file] or found or [None])[-1]
        if key is None:
            out.append(violation(f"INDEX ({name}) names no index created on {read.table}"))
            continue
        mismatch = _key_mismatch(key, read)
        if mismatch:
            out.append(violation(f"INDEX ({name}): its key ({_written(key.columns)}) {mismatch}"))
            continue
        leading = key.columns[0][0] if key.columns else None
        seekable = leading in read.equal or leading in read.ranged
        if seekable and not read.forceseek:
            out.append(violation(f"a {read.what} that compares {leading}, the first key column of {name}, without "
                                 "FORCESEEK: a plan compiled on an empty queue may scan the index at depth"))
        elif read.forceseek and not seekable:
            out.append(violation(f"FORCESEEK on a {read.what} that does not compare {leading}, the first key column "
                                 f"of {name}: no seek plan exists (8622)"))
    return out


def _fake_table(model: m.BatchModel, statement: m.Exec) -> str | None:
    """The table a tSQLt.FakeTable call fakes (folded schema.table), None for any other statement."""
    names = [t.name for t in model.tokens]
    if [names[i] for i in statement.procedure or ()] != ["tsqlt", "faketable"]:
        return None
    named = {names[a.name]: a.literal for a in statement.arguments if a.name is not None}
    positional = [a.literal for a in statement.arguments if a.name is None]
    table = named.get("@tablename") or (positional[0] if positional else None)
    schema = named.get("@schemaname") or (positional[1] if len(positional) > 1 else None)
    if table is None:
        return None
    parts = [fold(p) for p in split_name(table)]
    return ".".join(([fold(schema)] if schema and len(parts) == 1 else []) + parts)


def check_fakes(models: Iterable[m.BatchModel], reads: Iterable[PinnedRead],
                test_classes: set[str]) -> list[Violation]:
    """Rule fake-pin: tSQLt.FakeTable replaces a table with a heap that has no index, so a test that
    fakes a table and then runs a procedure whose claims or probes pin an index of it (directly or
    through the procedures it runs) must build that index on the fake in between (itself or through
    a helper procedure): Msg 308 otherwise, in every such test."""
    bodies: dict[str, tuple[m.BatchModel, list[m.Statement], str]] = {}
    for model in models:
        statements = model.statements
        start = next((i for i, s in enumerate(statements) if isinstance(s, m.CreateProcedure)), None)
        if start is not None:
            names = [t.name for t in model.tokens]
            key = ".".join(names[i] for i in statements[start].name)
            display = ".".join(model.tokens[i].raw for i in statements[start].name)
            bodies[key] = (model, statements[start + 1:], display)
    direct: dict[str, set[tuple[str, str]]] = {}
    for read in reads:
        for index in read.indexes:
            direct.setdefault(".".join(fold(p) for p in split_name(read.procedure)), set()).add((read.table, index))

    def calls(key: str) -> list[str]:
        model, statements, _ = bodies.get(key, (None, [], ""))
        names = [t.name for t in model.tokens] if model is not None else []
        execs = [s.exec if isinstance(s, m.Insert) else s for s in statements]
        return [".".join(names[i] for i in s.procedure) for s in execs if isinstance(s, m.Exec) and s.procedure]

    def reached(key: str, own: dict[str, set[tuple[str, str]]]) -> set[tuple[str, str]]:
        seen, todo, out = {key}, [key], set()
        while todo:
            current = todo.pop()
            out |= own.get(current, set())
            for callee in calls(current):
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        return out

    created: dict[str, set[tuple[str, str]]] = {}
    for key, (model, statements, _) in bodies.items():
        names = [t.name for t in model.tokens]
        for s in statements:
            if isinstance(s, m.CreateIndex):
                created.setdefault(key, set()).add((".".join(names[i] for i in s.table), names[s.name]))
    out = []
    for key, (model, statements, display) in bodies.items():
        if key.split(".")[0] not in test_classes or not key.split(".")[-1].startswith("test"):
            continue
        names = [t.name for t in model.tokens]
        faked: dict[str, set[str]] = {}         # faked table: the indexes built on the fake so far
        for s in statements:
            if isinstance(s, m.CreateIndex):
                faked.get(".".join(names[i] for i in s.table), set()).add(names[s.name])
            if isinstance(s, m.Insert) and s.exec is not None:     # INSERT INTO #Actual EXEC verb
                s = s.exec
            if not isinstance(s, m.Exec) or not s.procedure:
                continue
            table = _fake_table(model, s)
            if table is not None:
                faked[table] = set()
                continue
            callee = ".".join(names[i] for i in s.procedure)
            for table, index in reached(callee, created):
                if table in faked:
                    faked[table].add(index)
            for table, index in sorted(reached(callee, direct)):
                if table in faked and index not in faked[table]:
                    out.append(Violation(model.file, s.line, display, "fake-pin",
                                         f"runs {'.'.join(model.tokens[i].raw for i in s.procedure)}, whose reads "
                                         f"pin INDEX ({index}) on {table}, after tSQLt.FakeTable of {table} without "
                                         "building that index on the fake (Msg 308 at the first call)"))
                    faked[table].add(index)     # once per test and index
    return out


def check_batch(tree: BaseSegment, file: str, first_line: int
                ) -> tuple[list[Violation], list[Claim], list[PinnedRead], list[IndexKey]]:
    """Every rule on one parsed batch, the claims it makes, its claims' and probes' pins and the
    indexes it creates (the claim-pin rule runs per file: check_pins). Test-class procedures are
    included: tsqlcheck leaves out their procedure rules (it knows the tSQLt classes of all files)."""
    found = procedures(tree, file, first_line)

    def where(segment: BaseSegment, rule: str, message: str) -> Violation:
        start = offset_of(segment)
        owner = next((p.name for p in found if offset_of(p.segment) <= start < p.segment.pos_marker.source_slice.stop),
                     None)
        return Violation(file, first_line + line_of(segment) - 1, owner, rule, message)

    violations = (rule_readpast(tree, where) + rule_nolock(tree, where) + rule_dynamic_sql(tree, where)
                  + rule_abs_checksum(tree, where))
    found_claims = []
    reads = []
    for procedure in found:
        for rule in PROCEDURE_RULES:
            violations.extend(rule(procedure))
        for bracketed, hints, table, _ in claims(procedure):
            found_claims.append(Claim(file, procedure.line(bracketed), procedure.name, table, tuple(hints)))
        reads.extend(pinned_reads(procedure))
    return violations, found_claims, reads, index_keys(tree, file)


# ------------------------------------------------------------------------------------------------
# File rules (over the model of every batch of one file)


def check_file(models: list[m.BatchModel], test_classes: set[str]) -> list[Violation]:
    out: list[Violation] = []
    if not models:
        return out
    file = models[0].file
    options: set[str] = set()
    creates = (m.CreateTable, m.CreateType, m.CreateProcedure, m.CreateIndex, m.CreateNamed)
    first_create = next(((model, s) for model in models for s in model.statements if isinstance(s, creates)), None)
    if first_create is not None:
        for model in models:
            for statement in model.statements:
                if statement is first_create[1]:
                    break
                if isinstance(statement, m.SetOption):
                    options.add(statement.text)
            else:
                continue
            break
        for option in ("SET ANSI_NULLS ON", "SET QUOTED_IDENTIFIER ON"):
            if option not in options:
                out.append(Violation(file, first_create[1].line, None, "options",
                                     f"no {option} before the first CREATE (filtered indexes need it when the "
                                     "procedures that write the table are created)"))
    grants: dict[str, list[int]] = {}
    procedures_: list[tuple[str, str, int]] = []
    for model in models:
        names = [t.name for t in model.tokens]
        for statement in model.statements:
            if isinstance(statement, m.Grant) and statement.securable == "OBJECT" and statement.permission == "EXECUTE":
                grants.setdefault(".".join(names[i] for i in statement.name), []).extend(statement.roles)
            elif isinstance(statement, m.CreateProcedure):
                key = ".".join(names[i] for i in statement.name)
                if len(statement.name) < 2 or names[statement.name[0]] not in test_classes:
                    procedures_.append((key, ".".join(model.tokens[i].raw for i in statement.name), statement.line))
    for key, display, line in procedures_:
        count = len(grants.get(key, []))
        if key.endswith(INTERNAL_PROCEDURE_SUFFIXES):
            if count:
                out.append(Violation(file, line, display, "grants",
                                     f"granted EXECUTE {count} times in its file: an internal procedure (run AS "
                                     "OWNER) is reached through the ownership chain and granted to no role"))
        elif count != 1:
            out.append(Violation(file, line, display, "grants",
                                 f"granted EXECUTE {count} times in its file (once, to one role, is the contract)"))
    return out


# ------------------------------------------------------------------------------------------------
# SQL in the tool's Python modules


SQL_STATEMENT_STARTS = ("SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "WITH", "EXEC", "DECLARE", "SET", "IF")


def python_sql_strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, T-SQL text) of every SQL string of a Python module that mentions READPAST.

    A SQL string starts with a statement keyword (docstrings and messages do not); a string built
    with + or an f-string counts as one, its computed parts becoming the identifier ``x``, and DB-API
    ``?`` markers become the variable ``@p``: the hints, which the rule reads, are literal text.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    inner: set[int] = set()
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        text = _string_text(node, inner)
        if text is None:
            continue
        words = text.split(None, 1)
        if "READPAST" in text.upper() and words and words[0].upper() in SQL_STATEMENT_STARTS:
            yield node.lineno, _qmark_to_variables(text)


def _string_text(node: ast.AST, inner: set[int]) -> str | None:
    """The text of a string expression (literal, f-string, or + of them), None for anything else;
    the nodes inside it are added to ``inner`` so that they are not read again on their own."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        inner.update(id(n) for n in ast.walk(node) if n is not node)
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_text(node.left, inner), _string_text(node.right, inner)
        if left is None and right is None:
            return None
        inner.update(id(n) for n in ast.walk(node) if n is not node)
        return (left if left is not None else "x") + (right if right is not None else "x")
    return None


def _qmark_to_variables(text: str) -> str:
    try:
        masked = mask_comments_and_strings(text)
    except ValueError:          # not T-SQL: the parser says so with a line
        return text
    return "".join("@p" if masked[i] == "?" else ch for i, ch in enumerate(text))


def check_python(paths: Iterable[Path]) -> list[Violation]:
    """The readpast rule on the T-SQL strings of Python modules (the tool's own queries)."""
    out = []
    for path in paths:
        for line, text in python_sql_strings(path):
            try:
                tree = parse_batch(text)
            except TsqlParseError as exc:
                out.append(Violation(str(path), line, None, "readpast", f"a string with READPAST that is not "
                                                                        f"T-SQL sqlfluff can parse ({exc})"))
                continue

            def where(segment, rule, message, line=line):
                return Violation(str(path), line + line_of(segment) - 1, None, rule, message)

            out.extend(rule_readpast(tree, where))
    return out
