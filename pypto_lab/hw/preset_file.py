"""Reading a preset file's tables: ``{value, source}`` entries unwrapped (their sources kept),
keys checked against a schema, values against their types (`PresetReader`), and finding a preset
by its shipped name or a file's path (`PresetFolder`). Chip presets (`chip.py`), server topology
presets (`topology.py`) and software-stack presets (`pypto_lab.stack`) are read with it; each
names its own error class."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any


class PresetReader:
    """Reads one preset file. ``error`` is the exception class its mistakes raise; ``example`` says
    where to look for a well-formed file. Every message names the file, the key, the value, the
    rule and a fix."""

    def __init__(self, file: str, error: type[Exception], example: str):
        self.file = file
        self.error = error
        self.example = example
        self.sources: dict[str, str] = {}

    def fail(self, key: str, value: Any, rule: str, fix: str = "") -> Exception:
        return self.error(f"{self.file}: key '{key}' = {value!r}: {rule}" + (f"; fix: {fix}" if fix else ""))

    def unwrap(self, key: str, raw: Any) -> Any:
        """The value of ``{value, source, note}`` (its source remembered), or ``raw`` itself."""
        if isinstance(raw, dict) and "value" in raw:
            extra = sorted(set(raw) - {"value", "source", "note"})
            if extra:
                raise self.fail(key, raw, f"unknown field(s) {extra}", "use value, source, note")
            if "source" in raw:
                self.sources[key] = str(raw["source"])
            return raw["value"]
        return raw

    def section(self, prefix: str, table: Any, schema: dict[str, type], optional=frozenset()) -> dict[str, Any]:
        """The table's values by key, each unwrapped and of its schema type; every key of the schema
        present unless ``optional``, and no other key."""
        if not isinstance(table, dict):
            raise self.fail(prefix, table, "must be a table", self.example)
        unknown = sorted(set(table) - set(schema))
        if unknown:
            k = unknown[0]
            raise self.fail(f"{prefix}.{k}", table[k], "unknown key", f"use only {', '.join(schema)}")
        out = {}
        for key, typ in schema.items():
            full = f"{prefix}.{key}"
            if key not in table:
                if key in optional:
                    continue
                raise self.fail(full, None, "missing key", f"add it ({self.example})")
            out[key] = self.check_type(full, self.unwrap(full, table[key]), typ)
        return out

    def check_type(self, key: str, value: Any, typ: type) -> Any:
        if typ is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise self.fail(key, value, "must be a finite number", "write a number such as 28.0")
            return float(value)
        if typ is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(key, value, "must be an integer", "write a whole number such as 8")
            return value
        if typ is bool:
            if not isinstance(value, bool):
                raise self.fail(key, value, "must be true or false", "write true or false")
            return value
        if not isinstance(value, typ):
            raise self.fail(key, value, f"must be a {typ.__name__}", "quote it as a string")
        return value

    def positive(self, key: str, value: float, allow_zero: bool = False) -> None:
        if value < 0 or (value == 0 and not allow_zero):
            rule = "must be >= 0" if allow_zero else "must be > 0"
            raise self.fail(key, value, f"impossible value: {rule}", "use 0 or more" if allow_zero else "use a value > 0")


class PresetFolder:
    """A folder of shipped presets of one kind (chips, topologies, stacks): `find` resolves a
    shipped name (loaded once and cached) or the path of a user's file (read afresh every time:
    it may change); anything else raises ``error`` listing the shipped names."""

    def __init__(self, folder: Path, loader: Callable[[Path], Any], error: type[Exception], what: str):
        self.folder, self.loader, self.error, self.what = folder, loader, error, what
        self._cache: dict[str, Any] = {}

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.toml"))

    def find(self, name_or_path: str | Path) -> Any:
        key = str(name_or_path)
        if key in self._cache:
            return self._cache[key]
        if key in self.names():
            value = self._cache[key] = self.loader(self.folder / f"{key}.toml")
            return value
        candidate = Path(key)
        if candidate.suffix == ".toml" or candidate.exists():
            if not candidate.exists():
                raise self.error(f"{key}: no such {self.what} file; fix: check the path, or use a shipped name "
                                 f"({', '.join(self.names())})")
            return self.loader(candidate)
        raise self.error(f"unknown {self.what} {key!r}; fix: use one of {', '.join(self.names())} "
                         f"(or the path of a .toml {self.what} file)")


__all__ = ["PresetFolder", "PresetReader"]
