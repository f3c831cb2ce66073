"""Reading YAML the way experiment configs need it: duplicate keys refused, every failure a
one-line XindaError, ``--set a.b=value`` overrides applied to the parsed tree."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

from xinda.errors import XindaError


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped (``\\n``, ``\\x85``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


MERGE_TAG = "tag:yaml.org,2002:merge"


class _DuplicateKey(yaml.YAMLError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (it
    would silently drop the first, e.g. a whole second ``data:`` section)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *anchor`: its keys may be given again
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # (a list key: PyYAML's own error names its line)
                continue
            if key in seen:
                raise _DuplicateKey(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's, except that a scalar that does not convert (2001-13-01, !!int x) or
        that YAML 1.1 reads unlike a person (010 is 8, 1:30 is 90) is an error at its line."""
        try:
            value = super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as err:  # PyYAML's constructors raise ValueError, KeyError,
            # AttributeError... on scalars that do not convert
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot convert {node.value!r}: {type(err).__name__}: {err}",
                node.start_mark) from err
        if isinstance(node, yaml.ScalarNode) and type(value) in (int, float):
            _refuse_yaml_1_1_surprise(node, value)
        return value


def _refuse_yaml_1_1_surprise(node: yaml.ScalarNode, value: float) -> None:
    """YAML 1.1 reads a leading 0 as octal and colons as base 60 (YAML 1.2 dropped both)."""
    text = node.value.replace("_", "")
    if ":" in text:
        reading = "base 60"
    elif type(value) is int and re.fullmatch(r"[-+]?0[0-7]+", text) \
            and int(text, 8) != int(text, 10):
        reading = "octal"
    else:
        return
    raise yaml.constructor.ConstructorError(
        None, None, f"YAML 1.1 reads {node.value} as {reading}, {value}: write the number "
        f"you mean, or quote '{node.value}' for text", node.start_mark)


def parse_yaml(text: str, what: str) -> Any:
    """``yaml.safe_load(text)``, refusing duplicate keys; any failure is a one-line
    XindaError starting with ``what``."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as err:  # "line 2, column 1: found character '\t' that ..."
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = where + (err.problem or err.context or type(err).__name__)
    except yaml.reader.ReaderError as err:  # (its position is a character offset)
        reason = (f"line {text[:err.position].count(chr(10)) + 1}: unacceptable character "
                  f"U+{err.character:04X}: {err.reason}")  # (the code point, as str is read)
    except yaml.YAMLError as err:
        reason = (str(err).splitlines() or [type(err).__name__])[0]
    except RecursionError:
        reason = "nested too deeply"
    except Exception as err:  # noqa: BLE001 - a failure outside the loader's scalars
        reason = f"{type(err).__name__}: {err}"
    raise XindaError(one_line(f"{what}: {reason}"))


def unshared(node: Any) -> Any:
    """``node`` with its own copy of every mapping and list: a YAML alias (*name) shares one
    object between two places, and a --set on one of them changed both (copy.deepcopy keeps
    such sharing)."""
    if isinstance(node, dict):
        return {key: unshared(value) for key, value in node.items()}
    return [unshared(value) for value in node] if isinstance(node, list) else node


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        if tree.get(key) is None:  # absent, or a section left empty (only comments)
            tree[key] = {}
        tree = tree[key]
        if not isinstance(tree, dict):
            raise XindaError(one_line(f"--set {dotted}: '{key}' is not a section"))
    tree[leaf] = value


def apply_overrides(tree: dict, overrides: Sequence[str]) -> dict:
    """Apply ``a.b=value`` strings (values parsed as YAML) to a nested dict in place."""
    if isinstance(overrides, str):
        raise XindaError(f"overrides: expected a list of KEY=VALUE strings, got one: "
                         f"[{overrides!r}]?")
    for item in overrides:
        if not isinstance(item, str):
            raise XindaError(f"overrides: expected KEY=VALUE strings, got {item!r}")
        key, raw = item.split("=", 1) if "=" in item else ("", "")
        if not all(key.strip().split(".")):  # no "=", or "=5", "train.=5", "train..lr=5"
            raise XindaError(f"--set {item!r}: expected KEY=VALUE, e.g. train.lr=1e-3")
        value = parse_yaml(raw, f"--set {item!r}: invalid YAML value")
        if re.search(r"(?:^|\s)#", raw) and "#" not in str(value):  # (before: cut silently)
            raise XindaError(f"--set {item!r}: YAML reads '#' after a space, or first, as the "
                             f"start of a comment: quote the value, e.g. {key}='{raw.strip()}'")
        _set_dotted(tree, key.strip(), value)
    return tree


def config_source(path: object, overrides: list[str], key: str | tuple[str, ...],
                  message: str = "") -> str:
    """``path`` (a config file, None: defaults) named with the ``--set`` overrides of ``key``
    (or of any of several keys), above it or under it, where an error at ``key`` may come
    from: "base.yaml with --set train.lr=-1". For an error of a whole section, ``message``
    narrows them to the fields it names."""
    def related(item: str, key: str) -> bool:
        given = item.split("=", 1)[0].strip()
        if "." not in key and message and given != key and not re.search(
                rf"\b{re.escape(given.split('.')[-1])}\b", message):  # (the whole section: kept)
            return False
        return bool(key) and (f"{given}.".startswith(f"{key}.")
                              or f"{key}.".startswith(f"{given}."))
    keys = (key,) if isinstance(key, str) else key
    given = [item for item in overrides if any(related(item, key) for key in keys)]
    if not given:
        return "config" if path is None else str(path)
    return f"{'' if path is None else f'{path} with '}--set {' '.join(given)}"
