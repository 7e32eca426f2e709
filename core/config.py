"""Declarative settings: every field of a role's config declared once, with its TOML key, type, default, bounds and a
one-line doc, then read from a TOML file, the environment (secrets only) and flags, in that order.

A role declares a frozen dataclass over `Settings` whose fields are `setting(...)`s, and tables of them `table(...)`s:

    @dataclass(frozen=True)
    class ValidatorSettings(Settings):
        TABLE: ClassVar[str] = "validator"
        grace_seconds: float = setting("seconds before reason 8", default=600.0, key="grace", flag="--grace", above=0)

and loads it with `ValidatorSettings.load(path, flags={"grace_seconds": grace})`. A class with a TABLE reads that one
table of the file; one without reads the whole file, its `table(...)` fields each from the table of their key
(trainer.toml's [run], [data], ...), nested as deep as the file is. A table must hold only declared keys, each of
its declared type (TOML tells `1` from `1.0` and `true` from `1`, and so does this: a bool is never an int), inside
its bounds; a relative path is resolved against the file's folder. A flag given (not None) replaces the file's value
and is checked the same way; a flag of a nested field is named by its dotted path ("run.device").

The bounds hold for every instance, not only a loaded one: constructing a settings object in code checks each field
as loading does (a `ConfigError` naming `Class.field`), so no other type need check them again. `to_toml` writes
an instance back as a file that loads to an equal one, for the tools that write a role's config (the devnet).

Every refusal is a `ConfigError` whose message names the file and the key, or the flag. Types: bool, int, float (an
int is taken), str, Path, tuple[str, ...], and any of them `| None` (None: not set; TOML has no null, so only a
default can be None). A field declared `default=REQUIRED` must be given. pyproject.toml tells ruff's RUF009 that
`setting` and `table` build fields, not shared defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
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


class _Required:
    """The default of a setting that has none: the file or the caller must give it."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


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
    table: bool = False  # a nested table: the field's type is a Settings class (`table`)
    below: float | None = None  # value < below


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
    below: float | None = None,
) -> Any:
    """A dataclass field with its declaration as metadata; `default` must be immutable (a tuple, not a list), or
    REQUIRED. Type checkers know it as a field specifier of `Settings` (`dataclass_transform`)."""
    if isinstance(default, list | dict | set):
        raise TypeError(f"setting {key or doc!r}: a mutable default; use a tuple")
    declared = Setting(doc, key, flag, minimum, above, maximum, choices, relative, env, below=below)
    return field(default=default, metadata={_META: declared})


MAX_PORT = 65535


def port_setting(doc: str, *, default: int | None = None, flag: str | None = None, key: str = "") -> Any:
    """A TCP port to listen on, 0 for any free one (None, where that is the default: do not listen)."""
    return setting(doc, default=default, key=key, flag=flag, minimum=0, maximum=MAX_PORT)


def setting_of(cls: type, name: str, doc: str, *, default: Any, flag: str | None = None) -> Any:
    """A setting with the bounds and choices of field `name` of settings class `cls`, another doc and default: a
    role's way to say "the pool's value unless set" (default None) about a field another type declares, without
    writing its bounds again (`same_as` keeps its default too)."""
    item = next((d for d in declared(cls) if d.name == name), None)
    if item is None:
        raise TypeError(f"{cls.__name__} declares no field {name!r}")
    s = item.setting
    return setting(
        doc,
        default=default,
        key=s.key,
        flag=flag or s.flag,
        minimum=s.minimum,
        above=s.above,
        maximum=s.maximum,
        choices=s.choices,
        relative=s.relative,
        below=s.below,
    )


def same_as(cls: type, name: str, doc: str, *, flag: str | None = None) -> Any:
    """Field `name` of settings class `cls` used again, its bounds, choices and default alike, with a doc of its own.
    (Not a field specifier for type checkers, unlike `setting_of`: they take the call for the default it is.)"""
    item = next((d for d in declared(cls) if d.name == name), None)
    if item is None:
        raise TypeError(f"{cls.__name__} declares no field {name!r}")
    return setting_of(cls, name, doc, default=item.default, flag=flag)


def held(doc: str, *, default_factory: Callable[[], Any]) -> Any:
    """A field an instance holds that no file or flag sets (an object of any type, which its class checks): the
    loader and `to_toml` pass it by, and `doc` says what it is."""
    return field(default_factory=default_factory, metadata={_META: _Held(doc)})


@dataclass(frozen=True)
class _Held:
    doc: str


def table(doc: str, kind: type[Settings], *, key: str = "", optional: bool = False) -> Any:
    """A nested table of settings, of type `kind`: its defaults when the file has no such table, or, `optional`,
    None unless the file has one (an empty table then means every default)."""
    declared = Setting(doc, key, table=True)
    if optional:
        return field(default=None, metadata={_META: declared})
    return field(default_factory=kind, metadata={_META: declared})


@dataclass(frozen=True)
class Declared:
    """One declared field as the loader sees it: its name, TOML key, type (without None) and declaration."""

    name: str
    key: str
    kind: Any
    optional: bool
    setting: Setting
    default: Any

    @property
    def is_table(self) -> bool:
        return self.setting.table

    def rule(self) -> str:
        """What a value must be, for people: 'an integer in [1, 64]', 'one of auto, cpu, cuda'."""
        s = self.setting
        if s.table:
            return "a table"
        if s.choices:
            return "one of " + ", ".join(s.choices)
        noun = _NOUNS.get(self.kind, "a list of strings")
        low = f"[{_num(s.minimum)}" if s.minimum is not None else f"({_num(s.above)}" if s.above is not None else None
        high = f"{_num(s.maximum)}]" if s.maximum is not None else f"{_num(s.below)})" if s.below is not None else None
        if low and high:
            return f"{noun} in {low}, {high}"
        if low:
            return f"{noun} {'>=' if s.minimum is not None else '>'} {low[1:]}"
        if high:
            return f"{noun} {'<=' if s.maximum is not None else '<'} {high[:-1]}"
        return noun


_NOUNS: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path"}
_LIST = tuple[str, ...]


def _num(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def declared(cls: type) -> tuple[Declared, ...]:
    """The declared fields of a settings dataclass, in order, tables included; a field without `setting(...)` or
    `table(...)` is refused."""
    found = _DECLARED.get(cls)
    if found is not None:
        return found
    hints = typing.get_type_hints(cls)
    items = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if f.name in _HIDDEN or isinstance(meta, _Held):
            continue
        if not isinstance(meta, Setting):
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting(...)")
        kind, optional = _unwrap(hints[f.name])
        if meta.table:
            if not (isinstance(kind, type) and issubclass(kind, Settings)):
                raise TypeError(f"{cls.__name__}.{f.name}: a table's type must be a Settings class")
        elif kind not in _NOUNS and kind != _LIST:
            raise TypeError(f"{cls.__name__}.{f.name}: type {kind} is not one the config layer reads")
        if meta.env is not None and kind is not str:
            raise TypeError(f"{cls.__name__}.{f.name}: only a str (a secret) may come from the environment")
        default = f.default if f.default is not dataclasses.MISSING else None
        items.append(Declared(f.name, meta.key or f.name, kind, optional, meta, default))
    _DECLARED[cls] = found = tuple(items)
    return found


_DECLARED: dict[type, tuple[Declared, ...]] = {}


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(X, True) for `X | None`, (X, False) for X."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


# `table` is not among the field specifiers: a type checker then takes a table field for one with a default, which it
# always has (its table's defaults, or None), where it would take a specifier call without `default=` for a required one
@dataclass_transform(frozen_default=True, field_specifiers=(setting, setting_of, held, field))
@dataclass(frozen=True)
class Settings:
    """Base of a role's declared settings. `origins` maps each field the file, the environment or a flag set to
    where ("FILE: table.key", "$VAR", "--flag"); `file` holds the file's own values by TOML key."""

    TABLE: ClassVar[str] = ""  # the TOML table the role reads ("validator" reads [validator]); "": the whole file

    origins: Mapping[str, str] = field(default_factory=dict, kw_only=True, compare=False, repr=False)
    file: Mapping[str, Any] = field(default_factory=dict, kw_only=True, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Every field inside its declaration, however the instance was made (`validate`)."""
        for item in declared(type(self)):
            validate(item, getattr(self, item.name), f"{type(self).__name__}.{item.name}")

    @classmethod
    def load(
        cls,
        path: Path | None,
        *,
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Self:
        """The defaults, then `path`'s [TABLE] or whole file (None: no file), then the environment, then `flags`
        (field name, or dotted path of a nested one -> value; None is a flag not given)."""
        document = read_toml(path) if path is not None else {}
        if cls.TABLE:
            extra = sorted(set(document) - {cls.TABLE})
            if extra:
                raise ConfigError(f"{path}: unknown table or key {extra[0]!r}; expected [{cls.TABLE}]", where=str(path))
            found = document.get(cls.TABLE, {})
            if not isinstance(found, dict):
                raise ConfigError(f"{path}: {cls.TABLE} must be a table ([{cls.TABLE}])", where=str(path))
            document = found
        return cls.from_table(document, path, prefix=cls.TABLE, flags=flags, environ=environ)

    @classmethod
    def from_table(
        cls,
        values_in: Mapping[str, Any],
        path: Path | None,
        *,
        prefix: str = "",
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Self:
        """These settings from one TOML table (`prefix` is its dotted name, for messages), then the environment and
        `flags`, as `load` describes."""
        items = declared(cls)
        by_key = {d.key: d for d in items}
        by_name = {d.name: d for d in items}
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        nested: dict[str, dict[str, Any]] = {d.name: {} for d in items if d.is_table}
        own_flags: dict[str, Any] = {}
        for name, given in (flags or {}).items():
            head, dot, rest = name.partition(".")
            if head not in by_name or (dot and head not in nested):
                raise TypeError(f"{cls.__name__} declares no field {name!r}")
            if dot:
                nested[head][rest] = given
            else:
                own_flags[name] = given
        base = path.parent if path is not None else None
        for key, raw in values_in.items():
            item = by_key.get(key)
            dotted = f"{prefix}.{key}" if prefix else key
            where = f"{path}: {dotted}"
            if item is None:
                known = ", ".join(d.key for d in items)
                raise ConfigError(f"{path}: unknown key {dotted}; known: {known}", where=where)
            if item.is_table:
                if not isinstance(raw, dict):
                    raise ConfigError(f"{path}: {dotted} must be a table ([{dotted}])", where=where)
                values[item.name] = item.kind.from_table(
                    raw, path, prefix=dotted, flags=nested[item.name], environ=environ
                )
            else:
                values[item.name] = check(item, raw, where, base=base)
            origins[item.name] = where
        for item in items:  # a table the file leaves out: its defaults, or None, with its flags applied
            if item.is_table and item.name not in values and (nested[item.name] or not item.optional):
                dotted = f"{prefix}.{item.key}" if prefix else item.key
                values[item.name] = item.kind.from_table(
                    {}, path, prefix=dotted, flags=nested[item.name], environ=environ
                )
        environ = os.environ if environ is None else environ
        for item in items:
            if item.setting.env is not None and item.setting.env in environ:
                where = f"${item.setting.env}"
                values[item.name] = check(item, environ[item.setting.env], where)
                origins[item.name] = where
        for name, given in own_flags.items():
            if given is None:
                continue
            item = by_name[name]
            if item.is_table:
                raise TypeError(f"{cls.__name__}.{name} is a table: give its fields as {name}.FIELD")
            where = item.setting.flag or f"--{name.replace('_', '-')}"
            values[name] = check(item, _plain(given), where)
            origins[name] = where
        missing = [d for d in items if d.default is REQUIRED and d.name not in values]
        if missing:
            d = missing[0]
            dotted = f"{prefix}.{d.key}" if prefix else d.key
            raise ConfigError(f"{path}: {dotted} is required ({d.setting.doc})", where=f"{path}: {dotted}")
        return cls(**values, origins=origins, file=dict(values_in))

    def where(self, name: str) -> str | None:
        """Where field `name` was set ("FILE: table.key", "$VAR" or "--flag"); None when it is the default."""
        return self.origins.get(name)

    def to_toml(self) -> str:
        """These settings as TOML that `load` reads back to equal ones: every field that is not its default (a
        Path absolute, as written), tables after the keys (a class with a TABLE writes that table)."""
        lines: list[str] = []
        for path, keys, explicit in _sections(self, self.TABLE, bool(self.TABLE)):
            if path and (keys or explicit):
                lines += ["", f"[{path}]"] if lines else [f"[{path}]"]
            lines += keys
        return "\n".join(lines) + "\n"


_HIDDEN = frozenset(f.name for f in dataclasses.fields(Settings))


def _sections(settings: Settings, path: str, explicit: bool) -> list[tuple[str, list[str], bool]]:
    """(table path, its key lines, whether its header must be written) for `settings` and its tables, in order."""
    own: list[str] = []
    inner: list[tuple[str, list[str], bool]] = []
    for item in declared(type(settings)):
        value = getattr(settings, item.name)
        if item.is_table:
            if value is not None:
                dotted = f"{path}.{item.key}" if path else item.key
                inner += _sections(value, dotted, item.optional)  # an optional table is there when written
        elif value is not None and value != item.default:
            own.append(f"{item.key} = {_toml_value(value)}")
    return [(path, own, explicit), *inner]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else f"{'-' if value < 0 else ''}inf")
        )
    if isinstance(value, Path):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at `path`, or a ConfigError naming it."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found", where=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})", where=str(path)) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not readable TOML: {exc}", where=str(path)) from None
    return raw


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
        high_ok = (s.maximum is None or value <= s.maximum) and (s.below is None or value < s.below)
        if not (low_ok and high_ok):
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


def validate(item: Declared, value: Any, where: str) -> None:
    """Raises a ConfigError naming `where` unless `value` is what field `item` may hold (an instance's check: a Path
    field holds a Path, a list field a tuple; the bounds as `check`)."""
    if value is REQUIRED:
        raise ConfigError(f"{where} is required ({item.setting.doc})", where=where)
    if value is None and item.optional:
        return
    if item.is_table:
        held = isinstance(value, item.kind)
    elif item.kind is Path:
        held = isinstance(value, Path)
    elif item.kind == _LIST:
        held = isinstance(value, tuple)
    else:
        held = value is not None
    if not held:
        raise ConfigError(f"{where} must be {item.rule()}, got {value!r}", where=where)
    if not item.is_table:
        check(item, _plain(value), where)
