"""The configuration reference: every key of ``icegate.yaml``, read from the settings models.

Each key's type, default, bounds and description come from its pydantic field (the
``Field(description=...)`` beside the default and the constraints), so a key added to a
model appears here without anyone writing it twice. The file's layout is the loader's:
``FILE_KEYS`` says where a field of the model tree is written in the file.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from docs.gen.markdown import table
from icegate_dagster.config import IcegateConfig, format_duration, parse_duration, parse_size
from icegate_dagster.config.models import DERIVED, FILE_KEYS

#: A place in the model tree, as `FILE_KEYS` spells it.
Location = tuple[str | int, ...]

#: Where the reference writes a field whose place in the file holds a name the user picks
#: (error messages name the real key instead, so these are not in ``FILE_KEYS``).
PLACEHOLDERS: dict[Location, str] = {
    ("catalog", "properties"): "catalog.<property>",
    ("defaults", "retention"): "maintain.retention.<ns.table>",
    ("table_overrides",): "maintain.tables.<ns.table>",
}
#: Fields written as one key although their value is a mapping of blocks.
LEAVES: frozenset[Location] = frozenset({("table_overrides",)})
TOP_LEVEL = "top level"


@dataclass(frozen=True)
class ConfigKey:
    """One key of the file, as the reference shows it."""

    key: str
    #: The model field it documents: ``OptimizeSettings.min_input_files``.
    field: str
    type: str
    default: str
    bounds: str
    description: str

    @property
    def block(self) -> str:
        """The block the key is written in (``maintain.optimize``), or :data:`TOP_LEVEL`."""
        # A dot inside a placeholder (``<ns.table>``) separates nothing.
        *parents, _ = re.split(r"\.(?![^<>]*>)", self.key)
        return ".".join(parents) or TOP_LEVEL


def file_key(location: Location) -> str:
    """``location`` in the model tree, written as the file writes it (longest known prefix)."""
    spelled: dict[Location, str] = {**FILE_KEYS, **PLACEHOLDERS}
    for size in range(len(location), 0, -1):
        if location[:size] in spelled:
            return ".".join([spelled[location[:size]], *map(str, location[size:])])
    return ".".join(map(str, location))


def _derived(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, Mapping) and all(extra.get(k) == v for k, v in DERIVED.items())


def _unwrapped(annotation: Any) -> tuple[Any, list[Any], bool]:
    """The annotation without ``Optional`` and ``Annotated``: (type, metadata, optional)."""
    metadata: list[Any] = []
    optional = False
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *extra = get_args(annotation)
            metadata.extend(extra)
        elif origin in (Union, types.UnionType) and type(None) in get_args(annotation):
            optional = True
            rest = [a for a in get_args(annotation) if a is not type(None)]
            annotation = rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007
        else:
            return annotation, metadata, optional


def _settings_model(annotation: Any) -> type[BaseModel] | None:
    base, _, _ = _unwrapped(annotation)
    return base if isinstance(base, type) and issubclass(base, BaseModel) else None


def _parsed_by(metadata: list[Any]) -> object:
    """The parser of a ``Size`` or ``Duration`` field, if it is one."""
    for item in metadata:
        if isinstance(item, BeforeValidator) and item.func in (parse_size, parse_duration):
            return item.func
    return None


def _type_name(field: FieldInfo, location: Location = ()) -> str:
    base, metadata, optional = _unwrapped(field.annotation)
    if location in PLACEHOLDERS and get_origin(base) in (Mapping, dict):
        # Each name the user picks holds one value of the mapping.
        value = get_args(base)[1]
        return "block" if _settings_model(value) is not None else "string"
    parser = _parsed_by([*field.metadata, *metadata])
    if parser is parse_size:
        name = "size"
    elif parser is parse_duration or base is timedelta:
        name = "duration"
    elif get_origin(base) is Literal:
        name = "one of " + ", ".join(f"`{choice}`" for choice in get_args(base))
    elif get_origin(base) is tuple:
        name = "list of strings"
    elif get_origin(base) in (Mapping, dict):
        name = "mapping"
    else:
        name = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
            base, getattr(base, "__name__", str(base))
        )
    return f"{name} or `null`" if optional else name


def format_size(value: int) -> str:
    """A size in the file's own notation: the largest unit that divides it (``10MB``)."""
    for unit, size in (("TB", 1024**4), ("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _default(field: FieldInfo, location: Location = ()) -> str:
    if location in PLACEHOLDERS:
        return "none"
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if _type_name(field).startswith("size"):
        shown = format_size(value)
    elif isinstance(value, timedelta):
        shown = format_duration(value)
    elif isinstance(value, bool):
        shown = str(value).lower()
    elif isinstance(value, Mapping):
        shown = "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    elif isinstance(value, tuple | list):
        shown = "[" + ", ".join(map(str, value)) + "]"
    else:
        shown = str(value)
    return f"`{shown}`"


def _bounds(field: FieldInfo) -> str:
    """The constraints pydantic enforces, and those a validator enforces (named in
    ``json_schema_extra`` from the validator's own constants)."""
    parts: list[str] = []
    _, inner, _ = _unwrapped(field.annotation)
    for item in [*field.metadata, *inner]:
        for kind, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, kind.capitalize())):
                parts.append(f"{sign} {getattr(item, kind)}")
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, Mapping) else {}
    for kind, sign in (("minimum", "≥"), ("maximum", "≤")):
        if kind in extra:
            parts.append(f"{sign} {extra[kind]}")
    return ", ".join(parts)


def _plain(text: str) -> str:
    """Sphinx markup of a docstring made Markdown: ``x`` and :class:`x` become `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def block_summary(model: type[BaseModel]) -> str:
    """The first paragraph of a settings model's docstring, on one line."""
    paragraph = (model.__doc__ or "").strip().split("\n\n")[0]
    return _plain(" ".join(line.strip() for line in paragraph.splitlines()))


def _walk(model: type[BaseModel], location: Location) -> Iterator[ConfigKey]:
    for name, field in model.model_fields.items():
        if _derived(field):
            continue
        here = (*location, name)
        nested = _settings_model(field.annotation)
        if nested is not None and here not in LEAVES:
            yield from _walk(nested, here)
            continue
        yield ConfigKey(
            key=file_key(here),
            field=f"{model.__name__}.{name}",
            type=_type_name(field, here),
            default=_default(field, here),
            bounds=_bounds(field),
            description=_plain(field.description or ""),
        )


def config_keys(root: type[BaseModel] = IcegateConfig) -> list[ConfigKey]:
    """Every key of the file, in the models' order."""
    return list(_walk(root, ()))


def _block_models() -> dict[str, type[BaseModel]]:
    """Each block written by one settings model, by its key in the file."""

    def walk(model: type[BaseModel], location: Location) -> Iterator[tuple[str, type[BaseModel]]]:
        for name, field in model.model_fields.items():
            nested = _settings_model(field.annotation)
            here = (*location, name)
            if nested is not None and here not in LEAVES:
                yield file_key(here), nested
                yield from walk(nested, here)

    return dict(walk(IcegateConfig, ()))


def _blocks() -> dict[str, list[ConfigKey]]:
    blocks: dict[str, list[ConfigKey]] = {}
    for key in config_keys():
        blocks.setdefault(key.block, []).append(key)
    return blocks


def _keys_table(keys: list[ConfigKey]) -> list[str]:
    return table(
        ["key", "type", "default", "bounds", "description"],
        [[f"`{k.key}`", k.type, k.default, k.bounds, k.description] for k in keys],
    )


def block_markdown(block: str) -> str:
    """The table of one block's keys, for a page that explains that block
    (``<!-- generated: config-block maintain.health -->``)."""
    blocks = _blocks()
    if block not in blocks:
        raise ValueError(f"no configuration block {block!r} (known: {', '.join(blocks)})")
    return "\n".join(_keys_table(blocks[block]))


def markdown() -> str:
    """The reference: one section per block, one table row per key."""
    models = _block_models()
    lines: list[str] = []
    for block, keys in _blocks().items():
        title = "Top level" if block == TOP_LEVEL else f"`{block}`"
        lines += [f"### {title}", ""]
        if block in models and (summary := block_summary(models[block])):
            lines += [summary, ""]
        lines += _keys_table(keys)
    return "\n".join(lines)
