"""Learner options declared once, checked by one function (issue 54, deliver 2).

A learner's ``options`` is an :class:`Options`: a mapping of each option's name to its default (what
``parse_options`` fills in, the registry, the report and ``vbcluster learners`` read) that also holds
one :class:`Opt` per option -- its type, range or choices, the values with a meaning of their own
(``-1``: automatic, ``0``: off, ...), its help and, where the learner rewrites it after the check,
where that happens -- and the :class:`Rule` s that relate options. :func:`check_options` is the one
check: unknown names, types (:func:`pipeline.fit.spec.coerce`, FitSpec's coercer), ranges, choices,
value grammars and rules, each failure one line naming the option and the learner. Shared groups
(the truncated E-step's, the moves', the MAP search's, minibatch, growth) are declared once beside
the code that reads them and composed with :func:`declare`, as scikit-learn's
``_parameter_constraints`` are validated by one function.

A learner that sets ``options`` to a plain dict of defaults gets each option typed by its default,
with no range (:meth:`Options.from_defaults`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.fit.spec import coerce, kind_of
from vbcore.errors import ConfigError

KINDS = ("bool", "int", "float", "str")


@dataclass(frozen=True)
class Grammar:
    """String values that choices cannot list: ``accepts`` says which (for ``vbcluster learners``),
    ``broken(value)`` returns what a bad value must be, ``''`` for a valid one."""

    accepts: str
    broken: Callable[[str], str]


@dataclass(frozen=True)
class Opt:
    """One learner option: its default and what it accepts.

    ``low``/``high`` bound numbers (``low_open``/``high_open``: the bound itself is refused);
    ``choices`` lists a string's values; ``grammar`` checks a string that choices cannot list (it
    returns what the value must be, or ``''`` when it is valid). ``special`` gives values their own
    meaning (``{-1: 'automatic'}``); they are accepted even outside the range. ``resolved`` says where
    the learner rewrites the checked value before using it. ``typed``: whether a range's message
    names the type ("an integer >= 1") or states the bound alone (">= 1", the wording some tests pin)."""

    default: Any
    help: str
    kind: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    grammar: Grammar | None = None
    special: Mapping[Any, str] = field(default_factory=dict)
    resolved: str = ""
    typed: bool = True

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", kind_of(self.default))
        if self.kind not in KINDS:
            raise ValueError(f"option kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def nullable(self) -> bool:
        return self.default is None

    def requirement(self) -> str:
        """What a value must be, as the messages and ``vbcluster learners`` say it."""
        if self.grammar is not None:
            return self.grammar.accepts
        if self.choices is not None:
            return f"one of {self.choices}"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None or self.high is not None:
            rel, bound = ((">" if self.low_open else ">=", self.low) if self.low is not None
                          else ("<" if self.high_open else "<=", self.high))
            what = {"int": "an integer ", "float": "a number "}.get(self.kind, "") if self.typed else ""
            return f"{what}{rel} {bound:g}"
        return {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}[
            self.kind]

    def notes(self) -> str:
        """The special values: ``'-1: automatic, 0: the exact E-step'``."""
        return ", ".join(f"{k}: {v}" for k, v in self.special.items())

    def broken(self, value: Any) -> str:
        """``''`` if ``value`` (converted) is accepted, else what it must be."""
        if value is None and self.nullable or (value is not None and value in self.special):
            return ""
        if self.grammar is not None:
            return self.grammar.broken(str(value))
        if self.choices is not None:
            return "" if value in self.choices else self.requirement()
        below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        above = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if below or above:
            return self.requirement() + (f" ({self.notes()})" if self.special else "")
        return ""


@dataclass(frozen=True)
class Rule:
    """A relation between options: ``broken(opts, covariance)`` is true when the values (converted;
    ``covariance`` None until the fit's is known, :meth:`pipeline.fit.learners.base.Learner.check_spec`)
    break it; ``message`` is formatted with ``learner`` and the options (``{learner!r}``, ``{step!r}``)."""

    names: tuple[str, ...]
    broken: Callable[[Mapping[str, Any], str | None], bool]
    message: str


class Options(dict[str, Any]):
    """A learner's options: name -> default (a dict), with their declarations in :attr:`decls` and the
    rules between them in :attr:`rules`."""

    def __init__(self, decls: Mapping[str, Opt], rules: Iterable[Rule] = ()) -> None:
        super().__init__({name: d.default for name, d in decls.items()})
        self.decls = dict(decls)
        self.rules = tuple(rules)  # a group's rule may relate an option of another group

    @classmethod
    def from_defaults(cls, defaults: Mapping[str, Any]) -> Options:
        """Options typed by their defaults, with no range (a learner that lists defaults only)."""
        if isinstance(defaults, Options):
            return defaults
        return cls({k: Opt(v, "") for k, v in defaults.items()})

    def only(self, *names: str) -> dict[str, Opt]:
        """The declarations of ``names`` (to reuse some of a group)."""
        return {name: self.decls[name] for name in names}

    def with_(self, *parts: Options | Mapping[str, Opt], rules: Iterable[Rule] = ()) -> Options:
        """These options, then ``parts`` (a name already here keeps its place, takes the new
        declaration), with ``rules`` added."""
        return declare(self, *parts, rules=rules)


def declare(*parts: Options | Mapping[str, Opt], rules: Iterable[Rule] = ()) -> Options:
    """Options from groups and single declarations, in order; a later declaration of a name replaces
    the earlier one in its place (``{**a, **b}``). The groups' rules come along."""
    decls: dict[str, Opt] = {}
    out_rules: list[Rule] = []
    for part in parts:
        if isinstance(part, Options):
            decls.update(part.decls)
            out_rules.extend(r for r in part.rules if r not in out_rules)
        else:
            decls.update(part)
    out_rules.extend(rules)
    return Options(decls, out_rules)


def check_options(learner: type[Any], values: Mapping[str, Any],
                  covariance: str | None = None) -> dict[str, Any]:
    """The one check of learner options: ``learner``'s defaults overridden by ``values``, converted
    to each option's type and checked against its declaration and the learner's rules (those that
    need the covariance type only when ``covariance`` is given). Raises ConfigError, one line naming
    the option and the learner."""
    name, options = learner.name, learner_options(learner)
    unknown = sorted(set(values) - set(options))
    if unknown:
        known = ", ".join(sorted(options)) or "none"
        raise ConfigError(f"learner {name!r} has no option {', '.join(map(repr, unknown))}; "
                          f"its options: {known}")
    out = dict(options)
    for key, value in values.items():
        decl = options.decls[key]
        where = f"learner option {key!r} of {name!r}"
        out[key] = None if value is None and decl.nullable else coerce(decl.kind, value, where)
    for key, decl in options.decls.items():
        must = decl.broken(out[key])
        if must:
            raise ConfigError(f"learner option {key!r} of {name!r} must be {must}, got {out[key]!r}")
    for rule in options.rules:
        if rule.broken(out, covariance):
            raise ConfigError(rule.message.format(learner=name, **out))
    return out


def learner_options(learner: type[Any]) -> Options:
    """``learner.options`` as :class:`Options` (a plain dict of defaults: typed by them)."""
    return Options.from_defaults(learner.options)


def describe(learner: type[Any]) -> list[dict[str, str]]:
    """One row per option of ``learner``: name, type, default, what it accepts, help (with the
    special values and where the value is resolved), for ``vbcluster learners NAME`` and the docs."""
    options = learner_options(learner)
    rows = []
    for key, d in options.decls.items():
        accepts = d.requirement() + (" or unset" if d.nullable else "")
        more = [d.help] + ([f"Special values: {d.notes()}."] if d.special else []) \
            + ([f"Resolved: {d.resolved}"] if d.resolved else [])
        rows.append({"option": key, "type": d.kind, "default": repr(d.default), "accepts": accepts,
                     "help": " ".join(m for m in more if m)})
    for rule in options.rules:
        rows.append({"option": " + ".join(rule.names), "type": "rule", "default": "", "accepts": "",
                     "help": rule.message.split(", got ")[0].replace("{learner!r}", repr(learner.name))})
    return rows
