"""Declarative settings: every field of a role's config declared once, with its TOML key, type, default, bounds and a
one-line doc, then read from one TOML table, the environment (secrets only) and flags, in that order.

A role declares a frozen dataclass over `Settings` whose fields are `setting(...)`s:

    @dataclass(frozen=True)
    class ValidatorSettings(Settings):
        TABLE: ClassVar[str] = "validator"
        grace_seconds: float = setting("seconds before reason 8", default=600.0, key="grace", flag="--grace", above=0)

and loads it with `ValidatorSettings.load(path, flags={"grace_seconds": grace})`. The TOML table must hold only
declared keys, each of its declared type (TOML tells `1` from `1.0` and `true` from `1`, and so does this: a bool
is never an int), inside its bounds; a relative path is resolved against the file's folder. A flag given (not
None) replaces the file's value and is checked the same way. Every refusal is a `ConfigError` whose message names
the file and the key, or the flag. Types: bool, int, float (an int is taken), str, Path, tuple[str, ...], and any
of them `| None` (None: not set; TOML has no null, so only a default can be None). ruff's RUF009 does not see
`setting` as a field specifier across modules: a field of a mutable-looking type (Path) takes `# noqa: RUF009`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, dataclass_transform

from core.errors import InputError

_META = "core.config"


class ConfigError(InputError):
    """A config file, an environment variable or a flag holds what its setting refuses; the message names the file
    and the key, the variable, or the flag, and `where` is that name alone ("FILE: table.key", "$VAR", "--flag")."""

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True)
class Setting:
    """What one field declares beyond its type and default (`setting` builds it)."""

    doc: str  # one line, for people: what the value means and its unit
    key: str = ""  # the TOML key; "" is the field's name
    flag: str | None = None  # the command-line flag that overrides it ("--grace"), for error messages
    minimum: float | None = None  # value >= minimum
    above: float | None = None  # value > above
    maximum: float | None = None  # value <= maximum
    choices: tuple[str, ...] = ()  # a str that must be one of these
    relative: bool = False  # a Path the file gives relative to its own folder
    env: str | None = None  # an environment variable that sets it (secrets only: str fields)


def setting(
    doc: str,
    *,
    default: Any,
    key: str = "",
    flag: str | None = None,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
    relative: bool = False,
    env: str | None = None,
) -> Any:
    """A dataclass field with its declaration as metadata; `default` must be immutable (a tuple, not a list). Type
    checkers know it as a field specifier of `Settings` (`dataclass_transform`), so `default=` is a keyword."""
    if isinstance(default, list | dict | set):
        raise TypeError(f"setting {key or doc!r}: a mutable default; use a tuple")
    declared = Setting(doc, key, flag, minimum, above, maximum, choices, relative, env)
    return field(default=default, metadata={_META: declared})


@dataclass(frozen=True)
class Declared:
    """One declared field as the loader sees it: its name, TOML key, type (without None) and declaration."""

    name: str
    key: str
    kind: Any
    optional: bool
    setting: Setting
    default: Any

    def rule(self) -> str:
        """What a value must be, for people: 'an integer in [1, 64]', 'one of auto, cpu, cuda'."""
        s = self.setting
        if s.choices:
            return "one of " + ", ".join(s.choices)
        noun = _NOUNS.get(self.kind, "a list of strings")
        low = f"[{_num(s.minimum)}" if s.minimum is not None else f"({_num(s.above)}" if s.above is not None else None
        high = f"{_num(s.maximum)}]" if s.maximum is not None else None
        if low and high:
            return f"{noun} in {low}, {high}"
        if low:
            return f"{noun} {'>=' if s.minimum is not None else '>'} {low[1:]}"
        if high:
            return f"{noun} <= {high[:-1]}"
        return noun


_NOUNS: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path"}
_LIST = tuple[str, ...]


def _num(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def declared(cls: type) -> tuple[Declared, ...]:
    """The declared fields of a settings dataclass, in order; a field without `setting(...)` is refused."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if f.name in _HIDDEN:
            continue
        meta = f.metadata.get(_META)
        if not isinstance(meta, Setting):
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting(...)")
        kind, optional = _unwrap(hints[f.name])
        if kind not in _NOUNS and kind != _LIST:
            raise TypeError(f"{cls.__name__}.{f.name}: type {kind} is not one the config layer reads")
        if meta.env is not None and kind is not str:
            raise TypeError(f"{cls.__name__}.{f.name}: only a str (a secret) may come from the environment")
        found.append(Declared(f.name, meta.key or f.name, kind, optional, meta, f.default))
    return tuple(found)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(X, True) for `X | None`, (X, False) for X."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


@dataclass_transform(frozen_default=True, field_specifiers=(setting, field))
@dataclass(frozen=True)
class Settings:
    """Base of a role's declared settings. `origins` maps each field the file, the environment or a flag set to
    where ("FILE: table.key", "$VAR", "--flag"); `file` holds the file's own values by TOML key."""

    TABLE: ClassVar[str] = ""  # the TOML table the role reads ("validator" reads [validator])

    origins: Mapping[str, str] = field(default_factory=dict, kw_only=True, compare=False, repr=False)
    file: Mapping[str, Any] = field(default_factory=dict, kw_only=True, compare=False, repr=False)

    @classmethod
    def load(
        cls,
        path: Path | None,
        *,
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Self:
        """The defaults, then `path`'s [TABLE] (None: no file), then the environment, then `flags` (field name ->
        value; None is a flag not given)."""
        table = read_table(path, cls.TABLE) if path is not None else {}
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        by_key = {d.key: d for d in declared(cls)}
        for key, raw in table.items():
            item = by_key.get(key)
            where = f"{path}: {cls.TABLE}.{key}"
            if item is None:
                raise ConfigError(f"{path}: unknown key {cls.TABLE}.{key}; known: {', '.join(by_key)}", where=where)
            values[item.name] = check(item, raw, where, base=path.parent if path is not None else None)
            origins[item.name] = where
        environ = os.environ if environ is None else environ
        for item in by_key.values():
            if item.setting.env is not None and item.setting.env in environ:
                where = f"${item.setting.env}"
                values[item.name] = check(item, environ[item.setting.env], where)
                origins[item.name] = where
        for name, given in (flags or {}).items():
            if given is None:
                continue
            item = next((d for d in by_key.values() if d.name == name), None)
            if item is None:
                raise TypeError(f"{cls.__name__} declares no field {name!r}")
            where = item.setting.flag or f"--{name.replace('_', '-')}"
            values[name] = check(item, _plain(given), where)
            origins[name] = where
        return cls(**values, origins=origins, file=dict(table))

    def where(self, name: str) -> str | None:
        """Where field `name` was set ("FILE: table.key", "$VAR" or "--flag"); None when it is the default."""
        return self.origins.get(name)


_HIDDEN = frozenset(f.name for f in dataclasses.fields(Settings))


def read_table(path: Path, table: str) -> dict[str, Any]:
    """The `[table]` of the TOML file at `path` ({} when it has none); another top-level table or key is refused."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found", where=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})", where=str(path)) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not readable TOML: {exc}", where=str(path)) from None
    extra = sorted(set(raw) - {table})
    if extra:
        raise ConfigError(f"{path}: unknown table or key {extra[0]!r}; expected [{table}]", where=str(path))
    found = raw.get(table, {})
    if not isinstance(found, dict):
        raise ConfigError(f"{path}: {table} must be a table ([{table}])", where=str(path))
    return found


def _plain(value: Any) -> Any:
    """A flag's value as TOML would give it: a list for a repeated flag, a str for an enum choice."""
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, str):
        return str(value)  # a StrEnum member reads as its value
    if isinstance(value, Path):
        return str(value)
    return value


def check(item: Declared, value: Any, where: str, *, base: Path | None = None) -> Any:
    """`value` as field `item` holds it, or a `ConfigError` naming `where`; a relative path joins `base`."""

    sep = ":" if where.startswith("-") else ""  # "--grace: must be ...", "FILE: validator.grace must be ..."

    def fail() -> typing.NoReturn:
        raise ConfigError(f"{where}{sep} must be {item.rule()}, got {value!r}", where=where)

    kind, s = item.kind, item.setting
    if kind is bool:
        if not isinstance(value, bool):
            fail()
        return value
    if kind is int or kind is float:
        number_ok = isinstance(value, int) or (kind is float and isinstance(value, float))
        if isinstance(value, bool) or not number_ok or (isinstance(value, float) and math.isnan(value)):
            fail()
        low_ok = (s.minimum is None or value >= s.minimum) and (s.above is None or value > s.above)
        if not (low_ok and (s.maximum is None or value <= s.maximum)):
            fail()
        return float(value) if kind is float else value
    if kind == _LIST:
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            fail()
        return tuple(value)
    if not isinstance(value, str):
        fail()
    if s.choices and value not in s.choices:
        fail()
    if kind is Path:
        path = Path(value).expanduser()
        return (base / path).resolve() if s.relative and base is not None and not path.is_absolute() else path
    return value
