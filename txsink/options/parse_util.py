"""What every family of options parses with: the error they raise and number checks."""

from __future__ import annotations

import math
import os


class OptionError(ValueError):
    """An option is missing, unknown or has a value that cannot be used."""


def number(name: str, raw: str, kind: type, minimum: float,
           maximum: float = 2**63 - 1) -> int | float:
    """``raw`` as ``kind``, finite and within [minimum, maximum] (nan compares false with
    everything, so it is refused by name here, not deep inside a request)."""
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise OptionError(f"option {name}={raw!r} is not {what}") from None
    if not math.isfinite(value):
        raise OptionError(f"option {name}={raw!r} must be a finite number")
    if value < minimum:
        raise OptionError(f"option {name}={raw!r} must be at least {minimum}")
    if value > maximum:
        raise OptionError(f"option {name}={raw!r} must be at most {maximum}")
    return value


def numbers(values: dict[str, object],
            bounds: tuple[tuple[str, type, float, float], ...]) -> None:
    """Each option of ``bounds`` (name, kind, minimum, maximum) given in ``values``, as
    :func:`number` reads it, in place."""
    for name, kind, minimum, maximum in bounds:
        if name in values:
            values[name] = number(name, str(values[name]), kind, minimum, maximum)


def require_file(label: str, path: object) -> None:
    """Refuse ``label=path`` unless ``path`` is unset or names a file (a CA bundle that
    is missing would otherwise fail only at the first TLS handshake)."""
    if path and not os.path.isfile(str(path)):
        raise OptionError(f"{label}={path!r} is not a readable file")


def choice(values: dict[str, object], name: str, choices: tuple[str, ...],
           default: str) -> str:
    """Option ``name`` lower-cased, one of ``choices`` (``default`` when not given)."""
    value = str(values.get(name, default)).lower()
    if value not in choices:
        raise OptionError(f"option {name}={value!r} is not one of {', '.join(choices)}")
    return value


def given(values: dict[str, object], names: tuple[str, ...]) -> dict[str, object]:
    """The options of ``names`` that ``values`` holds (the others keep their defaults)."""
    return {name: values[name] for name in names if name in values}
