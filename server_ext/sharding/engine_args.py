"""A tokenizer for ClickHouse expression text: engine arguments, names and literals.

Reads ``engine_full`` of ``system.tables`` (the arguments of ``Distributed(...)``) and
sharding-key expressions: quoted strings and names (backslash escapes and doubled quotes),
words and punctuation. Commas and parentheses inside quotes or nested calls do not split.
"""

from __future__ import annotations

from collections.abc import Iterator

from server_ext.errors import ShardingError
from server_ext.sql import is_bare_identifier

_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "b": "\b", "f": "\f",
                   "a": "\a", "v": "\v", "e": "\x1b"}


def engine_arguments(engine_full: str) -> list[str]:
    """The top-level arguments of ``Engine(a, 'b', f(c, d))`` as source text, stripped.

    Commas and parentheses inside quotes, backquotes or nested calls do not split.
    """
    start = engine_full.find("(")
    if start < 0:
        return []
    args: list[str] = []
    depth, begin = 0, start + 1
    for token, position in tokens(engine_full, start):
        if token in "([":
            depth += 1
        elif token in ")]":
            depth -= 1
            if depth == 0:
                args.append(engine_full[begin:position].strip())
                return args if args != [""] else []
        elif token == "," and depth == 1:
            args.append(engine_full[begin:position].strip())
            begin = position + 1
    raise ShardingError(f"unbalanced parentheses in engine definition: {engine_full}")


def tokens(text: str, start: int = 0) -> Iterator[tuple[str, int]]:
    """(token, position) of punctuation, quoted strings/names and words in ``text``."""
    i = start
    while i < len(text):
        ch = text[i]
        if ch in "'`\"":
            end = quoted_end(text, i)
            yield text[i:end], i
            i = end
        elif ch.isalnum() or ch == "_":
            end = i
            while end < len(text) and (text[end].isalnum() or text[end] == "_"):
                end += 1
            yield text[i:end], i
            i = end
        elif ch.isspace():
            i += 1
        else:
            yield ch, i
            i += 1


def quoted_end(text: str, start: int) -> int:
    """Index just past the quoted token opening at ``start`` (backslash and doubled quote)."""
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
            else:
                return i + 1
        else:
            i += 1
    raise ShardingError(f"unterminated {quote} in: {text}")


def unquote(token: str) -> str:
    body, out, i = token[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt == "x" and i + 3 < len(body):
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(_STRING_ESCAPES.get(nxt, nxt))
            i += 2
        elif ch == token[0] and i + 1 < len(body) and body[i + 1] == ch:
            out.append(ch)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def name_value(arg: str) -> str | None:
    """The name ``arg`` gives: a quoted string or name unquoted, a bare word as is; else None."""
    arg = arg.strip()
    if len(arg) >= 2 and arg[0] in "'`\"" and quoted_end(arg, 0) == len(arg):
        return unquote(arg)
    return arg if is_bare_identifier(arg) else None
