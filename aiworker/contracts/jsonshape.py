"""A small JSON Schema (2020-12) subset: enough to check the runner's request contract
on a runner host without importing pydantic (its import alone costs more than the whole
runner's start-up budget).

The schema document is the contract's one definition: `runner schema request` prints it
and `runner execute` checks requests with it. A keyword this module does not implement
is refused when the schema is loaded, so the schema cannot say more than is checked.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from aiworker.errors import key_path

Loc = tuple[int | str, ...]
# Keywords that only annotate, and those this module checks.
ANNOTATIONS = frozenset({"$schema", "$defs", "description", "title", "default", "discriminator"})
CHECKED = frozenset(
    {
        "$ref", "oneOf", "const", "type", "properties", "required", "additionalProperties",
        "maxProperties", "items", "prefixItems", "minItems", "maxItems", "minLength",
        "maxLength", "pattern", "minimum", "maximum",
    }
)  # fmt: skip
TYPES = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
}


class ShapeError(ValueError):
    """The first place a document departs from its schema: a code (unknown_field,
    missing_field or invalid_field), the field as an operator writes it, and why."""

    def __init__(self, code: str, loc: Loc, reason: str) -> None:
        self.code, self.field = code, key_path(loc)
        self.message = f"{self.field}: {reason}"
        super().__init__(self.message)


def load(path: Path) -> dict[str, Any]:
    """The schema at PATH, refused (ValueError) if it uses a keyword not checked here."""
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    _known(schema, path.name)
    return schema


def _known(node: Any, where: str) -> None:
    if isinstance(node, list):
        for item in node:
            _known(item, where)
        return
    if not isinstance(node, dict):
        return
    unknown = set(node) - ANNOTATIONS - CHECKED
    if unknown:
        raise ValueError(f"{where}: keywords not checked by jsonshape: {sorted(unknown)}")
    beside = set(node) - ANNOTATIONS - {"$ref", "oneOf"}
    if ("$ref" in node or "oneOf" in node) and beside:
        raise ValueError(f"{where}: keywords beside $ref or oneOf are not checked: {beside}")
    if "oneOf" in node and "discriminator" not in node:
        raise ValueError(f"{where}: a oneOf is checked only by its discriminator")
    if node.get("type", "object") not in TYPES:
        raise ValueError(f"{where}: type {node['type']!r} is not checked by jsonshape")
    for key, value in node.items():
        if key in ("properties", "$defs"):
            for child in value.values():
                _known(child, where)
        elif key not in ("const", "default", "discriminator", "required"):
            _known(value, where)


def validate(schema: dict[str, Any], document: Any) -> Any:
    """A copy of DOCUMENT with the schema's defaults filled in; ShapeError otherwise."""
    return _Checker(schema).check(schema, document, ())


class _Checker:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def check(self, schema: dict[str, Any], value: Any, loc: Loc) -> Any:
        if "$ref" in schema:
            schema = self._resolve(schema["$ref"])
        if "oneOf" in schema:
            return self.check(self._branch(schema, value, loc), value, loc)
        if "const" in schema and value != schema["const"]:
            raise ShapeError("invalid_field", loc, f"must be {schema['const']!r}")
        kind = schema.get("type")
        if kind is not None and not _is(kind, value):
            raise ShapeError("invalid_field", loc, f"must be {_article(kind)}")
        if isinstance(value, dict):
            return self._object(schema, value, loc)
        if isinstance(value, list):
            return self._array(schema, value, loc)
        if isinstance(value, str):
            _string(schema, value, loc)
        elif isinstance(value, int) and not isinstance(value, bool):
            _bounds(schema, value, loc)
        return value

    def _resolve(self, ref: str) -> dict[str, Any]:
        prefix = "#/$defs/"
        if not ref.startswith(prefix):
            raise ValueError(f"only local $defs references are supported, not {ref!r}")
        found: dict[str, Any] = self.root["$defs"][ref.removeprefix(prefix)]
        return found

    def _branch(self, schema: dict[str, Any], value: Any, loc: Loc) -> dict[str, Any]:
        """A oneOf is read by its discriminator: the branch its tag names."""
        tag = schema["discriminator"]["propertyName"]
        mapping = schema["discriminator"]["mapping"]
        if not isinstance(value, dict):
            raise ShapeError("invalid_field", loc, "must be an object")
        if tag not in value:
            raise ShapeError("invalid_field", (*loc, tag), f"one of {sorted(mapping)} required")
        if not isinstance(value[tag], str) or value[tag] not in mapping:
            raise ShapeError("invalid_field", (*loc, tag), f"must be one of {sorted(mapping)}")
        return {"$ref": mapping[value[tag]]}

    def _object(self, schema: dict[str, Any], value: dict[str, Any], loc: Loc) -> dict[str, Any]:
        """Declared fields first, in the schema's order (missing, then wrong), then the
        fields it does not declare: the first problem reported is the first declared."""
        properties: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", ()))
        extra = schema.get("additionalProperties", True)
        if len(value) > schema.get("maxProperties", len(value)):
            raise ShapeError("invalid_field", loc, f"at most {schema['maxProperties']} entries")
        out = {}
        for key, child in properties.items():
            if key in value:
                out[key] = self.check(child, value[key], (*loc, key))
            elif key in required:
                raise ShapeError("missing_field", (*loc, key), "field required")
            elif "default" in child:
                out[key] = copy.deepcopy(child["default"])
        for key, item in value.items():
            if key in properties:
                continue
            _unicode(key, (*loc, key))
            if extra is False:
                raise ShapeError("unknown_field", (*loc, key), "unknown field")
            out[key] = self.check(extra, item, (*loc, key)) if isinstance(extra, dict) else item
        return out

    def _array(self, schema: dict[str, Any], value: list[Any], loc: Loc) -> list[Any]:
        low, high = schema.get("minItems", 0), schema.get("maxItems", len(value))
        if not low <= len(value) <= high:
            raise ShapeError("invalid_field", loc, f"must hold {low} to {high} items")
        prefix = schema.get("prefixItems", [])
        rest = schema.get("items", {})
        return [
            self.check(prefix[i] if i < len(prefix) else rest, item, (*loc, i))
            for i, item in enumerate(value)
        ]


def _is(kind: str, value: Any) -> bool:
    if kind == "integer" and isinstance(value, bool):
        return False  # JSON true is not 1
    return isinstance(value, TYPES[kind])


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _unicode(value: str, loc: Loc) -> None:
    # JSON may escape a lone surrogate ("\ud800"); no argv, path or environment holds one.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ShapeError("invalid_field", loc, "must be valid Unicode") from None


def _string(schema: dict[str, Any], value: str, loc: Loc) -> None:
    _unicode(value, loc)
    if len(value) < schema.get("minLength", 0):
        raise ShapeError("invalid_field", loc, f"at least {schema['minLength']} characters")
    if len(value) > schema.get("maxLength", len(value)):
        raise ShapeError("invalid_field", loc, f"at most {schema['maxLength']} characters")
    pattern = schema.get("pattern")
    if pattern is not None and re.search(pattern, value) is None:
        if "\x00" in value and "\x00" in pattern:
            raise ShapeError("invalid_field", loc, "must not contain a NUL byte")
        raise ShapeError("invalid_field", loc, f"must match {pattern!r}")


def _bounds(schema: dict[str, Any], value: int, loc: Loc) -> None:
    if value < schema.get("minimum", value):
        raise ShapeError("invalid_field", loc, f"must be at least {schema['minimum']}")
    if value > schema.get("maximum", value):
        raise ShapeError("invalid_field", loc, f"must be at most {schema['maximum']}")
