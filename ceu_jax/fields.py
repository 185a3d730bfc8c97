"""Typed config fields that carry their own check: one definition per field.

A config section (the training config's `cer`, the audit's `eval`) is a frozen
dataclass whose fields are made with `field(default, check, doc)`; `checks(cls)`
derives the validator table that `ceu_jax.train.config.validate` and
`ceu_jax.audit_config.validate` apply ("<section>.<field> <message>, got
<value>"), and `section(cls)` builds the default ConfigDict a config file starts
from, so defaults, documentation and validation never drift apart. Pure Python
(no JAX): training, audits and configs share it.

A check is `check(value) -> None | str`: None when valid, else the error's
predicate ("must be ..."), which names the allowed values or range.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

Check = Callable[[Any], "str | None"]


def is_num(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def ge(lo: float, integer: bool = False) -> Check:
  def check(x):
    ok = (is_int(x) if integer else is_num(x)) and x >= lo
    return None if ok else f"must be {'an integer' if integer else 'a number'} >= {lo}"
  return check


def gt(lo: float) -> Check:
  return lambda x: None if is_num(x) and x > lo else f"must be a number > {lo}"


def unit_open_closed(x: Any) -> str | None:
  return None if is_num(x) and 0 < x <= 1 else "must be in (0, 1]"


def one_of(*allowed) -> Check:
  return lambda x: None if (x in allowed and type(x) in {type(a) for a in allowed}) \
      else f"must be one of {allowed}"


def any_num(x: Any) -> str | None:
  return None if is_num(x) else "must be a number"


def boolean(x: Any) -> str | None:
  return None if isinstance(x, bool) else "must be a bool"


def items_of(section: Any) -> dict:
  """A config section (ConfigDict or mapping) as a plain dict."""
  if hasattr(section, "to_dict"):
    return section.to_dict()
  return dict(section)


def check_top(config: Any, sections: Sequence[str], ignored: Sequence[str] = ()) -> dict:
  """A run config's top level: every section of `sections` present, no other (but
  `ignored`), and an integer seed >= 0 (ValueError naming the field). Returns its items."""
  top = items_of(config)
  unknown = sorted(set(top) - set(sections) - set(ignored))
  if unknown:
    raise ValueError(f"{unknown[0]} is an unknown config section; known: {tuple(sections)}")
  for name in sections:
    if name not in top:
      raise ValueError(f"{name} is missing from the config")
  if not is_int(top["seed"]) or top["seed"] < 0:
    raise ValueError(f"seed must be an integer >= 0, got {top['seed']!r}")
  return top


def check_section(name: str, section: Any, checks: Mapping[str, Check], *,
                  strict: bool = True) -> None:
  """ValueError "<name>.<field> <predicate>, got <value>" for the first bad field of
  `section`; a field of `checks` it lacks is "<name>.<field> is missing". `strict`:
  a field `checks` does not know is an error too (else it is left to its owner)."""
  items = items_of(section)
  unknown = sorted(set(items) - set(checks))
  if strict and unknown:
    raise ValueError(f"{name}.{unknown[0]} is an unknown field; known fields of {name}: "
                     f"{sorted(checks)}")
  missing = sorted(set(checks) - set(items))
  if missing:
    raise ValueError(f"{name}.{missing[0]} is missing")
  for key, check in checks.items():
    err = check(items[key])
    if err:
      raise ValueError(f"{name}.{key} {err}, got {items[key]!r}")


def field(default: Any, check: Check, doc: str, *, any_type: bool = False) -> Any:
  """A dataclass field with its check and a one-line description. `any_type`: its
  values may be of several types (e.g. 'auto' or an int), so the ConfigDict field
  takes any (a command line's `=8` is then the int 8): the check decides."""
  return dataclasses.field(default=default, metadata={"check": check, "doc": doc,
                                                      "any_type": any_type})


def checks(cls: type) -> dict[str, Check]:
  """{field name: check} of a dataclass made with `field`."""
  return {f.name: f.metadata["check"] for f in dataclasses.fields(cls)}


def docs(cls: type) -> dict[str, str]:
  """{field name: description} of a dataclass made with `field`."""
  return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}


def from_section(cls: type, section: Mapping[str, Any] | Any) -> Any:
  """The dataclass of a config section (fields the class does not know are ignored:
  `validate` reports them)."""
  items = section.to_dict() if hasattr(section, "to_dict") else dict(section)
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{k: v for k, v in items.items() if k in names})


def section(cls: type, **overrides: Any):
  """A ConfigDict of the dataclass's defaults (plus `overrides`)."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  values = {f.name: f.default for f in dataclasses.fields(cls)}
  unknown = sorted(set(overrides) - set(values))
  if unknown:
    raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}")
  values.update(overrides)
  for f in dataclasses.fields(cls):
    if f.metadata.get("any_type"):
      values[f.name] = ml_collections.FieldReference(values[f.name], field_type=object)
  return ml_collections.ConfigDict(values)
