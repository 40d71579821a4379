"""Cheaper construction of the dataclasses the engine makes for every token of every stream.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__`` (a
call per field), and a field with a ``default_factory`` costs another call: building a
``SampleResult``, ``NextToken`` or ``SeqChunk`` takes about a microsecond, and a decode step of
64 streams builds a few hundred of them. ``maker(cls)`` is a constructor of ``cls`` that takes
every field positionally, in declaration order (defaults and factories are the caller's to pass),
and sets them on a new instance without the ``__init__`` call: plain attribute assignments, or
for a frozen class writes into the instance's ``__dict__`` (its ``__setattr__`` refuses them).
The same object as ``cls(...)`` (equal, same repr and hash, ``dataclasses.replace`` works), in
about half the time.

Only for plain dataclasses: no ``__slots__``, no ``__post_init__``, every field in ``__init__``
(``maker`` refuses others, so a class that grows one of these fails at import, not silently).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


def maker(cls: type) -> Callable[..., Any]:
    """``maker(cls)(*values)`` == ``cls(*values)`` for every field's value given, in order."""
    if not dataclasses.is_dataclass(cls) or "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"maker: {cls.__name__} is not a plain dataclass")
    fields = dataclasses.fields(cls)
    frozen = cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    if not frozen and "__setattr__" in cls.__dict__:
        raise TypeError(f"maker: {cls.__name__} has its own __setattr__")
    if any(not f.init for f in fields):
        raise TypeError(f"maker: {cls.__name__} has fields outside __init__")
    names = [f.name for f in fields]
    args = ", ".join(names)
    if frozen:
        body = "    d = o.__dict__\n" + "".join(f"    d[{n!r}] = {n}\n" for n in names)
    else:
        body = "".join(f"    o.{n} = {n}\n" for n in names)
    src = f"def make({args}):\n    o = new(cls)\n{body}    return o\n"
    ns: dict[str, Any] = {"new": object.__new__, "cls": cls}
    exec(src, ns)  # noqa: S102 - generated from the class's own field names, as dataclasses does
    make = ns["make"]
    make.__qualname__ = f"maker({cls.__name__})"
    return make
