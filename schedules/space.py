"""Config spaces for schedule templates, in the spirit of AutoTVM's cfg.define_*.

A template declares knobs on a ConfigSpace:
    space.define_split("tile_n", 512, num_outputs=3, policy="power2", max_factor=64)
    space.define_choice("unroll", [0, 16, 64])
    space.define_bool("vectorize_epilogue")
A knob may apply only under some values of an earlier knob (`when`: a rule knob choosing
between schedules with knobs of their own, as Ansor's sketches): where it does not
apply it takes its first option, so configs that differ only in such knobs are one
config (one canonical index), and a record may leave it out.
The space enumerates its configs (mixed-radix index over the knobs), maps an index to a
Config and back, samples uniformly, gives a config's neighbours (one knob changed, as
simulated annealing needs), serializes a config to readable JSON, and turns each knob
choice into numbers a cost model can use.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tecc.schedules.blocks import divisors

from tecc.canonical import canonical_json


def factorizations(extent: int, parts: int, policy: str = "factors",
                   max_factor: int | None = None) -> list[tuple[int, ...]]:
    """All ways to write `extent` as a product of `parts` factors, outermost first.
    policy "factors": exact divisors; "power2": the inner factors are powers of two
    (the outermost takes the rest, ceil-divided, so any extent works).
    `max_factor` bounds every inner factor."""
    if parts < 1:
        raise ValueError("a split needs at least one part")
    limit = max_factor or extent

    def inner_choices(remaining: int) -> list[int]:
        if policy == "power2":
            out, p = [], 1
            while p <= min(remaining, limit):
                out.append(p)
                p *= 2
            return out
        return [d for d in divisors(remaining) if d <= limit]

    results: list[tuple[int, ...]] = []

    def rec(remaining: int, left: int, acc: list[int]) -> None:
        if left == 1:
            results.append((remaining, *reversed(acc)))
            return
        for f in inner_choices(remaining):
            rest = -(-remaining // f) if policy == "power2" else remaining // f
            rec(rest, left - 1, acc + [f])

    rec(extent, parts, [])
    return sorted(set(results))


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # "split", "choice", "bool"
    options: tuple[Any, ...]
    # the value of a config written before the knob existed (None: such a config is
    # refused); it must be the option that schedules as the template did then
    default: Any = None
    # (knob name, its values under which this knob applies); None: always
    when: tuple[str, tuple[Any, ...]] | None = None

    def __len__(self) -> int:
        return len(self.options)

    def features(self, index: int) -> list[float]:
        """Numbers describing option `index` (log2 of split factors, the value of a
        numeric choice, its position otherwise)."""
        value = self.options[index]
        if self.kind == "split":
            return [math.log2(max(f, 1)) for f in value]
        if isinstance(value, bool):
            return [float(value)]
        if isinstance(value, int | float):
            return [math.log2(value + 1) if value >= 0 else float(value)]
        return [float(index)]


class Config(dict):
    """One point of a space: knob name -> chosen value, plus its index."""

    def __init__(self, values: dict[str, Any], index: int, space: ConfigSpace | None = None):
        super().__init__(values)
        self.index = index
        self.space = space

    def to_json(self) -> dict[str, Any]:
        """The knob values, without the knobs that do not apply to this config."""
        skip = set() if self.space is None else self.space.inactive(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.items()
                if k not in skip}

    def __hash__(self) -> int:  # configs of one space are identified by index
        return hash(self.index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and dict.__eq__(self, other)


class ConfigSpace:
    def __init__(self) -> None:
        self.knobs: list[Knob] = []
        self._by_name: dict[str, Knob] = {}
        self._position: dict[str, int] = {}  # knob name -> its digit in an index
        # (predicate on a config, why a config failing it is no point of the space)
        self._constraints: list[tuple[Callable[[Config], bool], str]] = []

    def add_constraint(self, predicate: Callable[[Config], bool], why: str) -> None:
        """Configs for which `predicate` is false are no points of the space (knob
        values that exclude each other): the tuner never measures them. `predicate`
        must pickle (a module-level function): configs go to build workers."""
        self._constraints.append((predicate, why))

    def why_not(self, config: Config) -> str | None:
        """Why `config` is refused by a constraint, None if it is not."""
        return next((why for ok, why in self._constraints if not ok(config)), None)

    # -- declaring knobs
    def _add(self, knob: Knob) -> Knob:
        if knob.name in self._by_name:
            raise ValueError(f"knob {knob.name!r} defined twice")
        if not knob.options:
            raise ValueError(f"knob {knob.name!r} has no options")
        self._position[knob.name] = len(self.knobs)
        self.knobs.append(knob)
        self._by_name[knob.name] = knob
        return knob

    def define_split(self, name: str, extent: int, num_outputs: int = 2,
                     policy: str = "factors", max_factor: int | None = None,
                     filter_fn: Any = None, ragged: Sequence[tuple[int, ...]] = (),
                     when: tuple[str, Sequence[Any]] | None = None) -> Knob:
        """`ragged`: further options whose product exceeds `extent` (a partial last
        tile, e.g. 197 as 7 x 32), after the exact ones. `when`: see _condition."""
        options = factorizations(extent, num_outputs, policy, max_factor)
        if filter_fn is not None:
            options = [o for o in options if filter_fn(o)] or options[:1]
        for option in ragged:
            if len(option) != num_outputs or math.prod(option) < extent:
                raise ValueError(f"split {name!r}: {option} does not cover {extent}")
        options += [o for o in ragged if o not in options]
        return self._add(Knob(name, "split", tuple(options), when=self._condition(when)))

    def define_choice(self, name: str, values: Sequence[Any], default: Any = None,
                      when: tuple[str, Sequence[Any]] | None = None) -> Knob:
        """`default`: the option a config without this knob (a record from before
        it was added) takes. `when`: see _condition."""
        options = tuple(dict.fromkeys(values))
        if default is not None and not any(same_value(default, o) for o in options):
            raise ValueError(f"knob {name!r}: default {default!r} is no option")
        return self._add(Knob(name, "choice", options, default, self._condition(when)))

    def _condition(self, when: tuple[str, Sequence[Any]] | None
                   ) -> tuple[str, tuple[Any, ...]] | None:
        """`when` = (an earlier knob's name, the values under which the new knob
        applies), checked against that knob's options."""
        if when is None:
            return None
        parent, values = when
        if parent not in self._by_name:
            raise ValueError(f"knob condition on {parent!r}, which is not defined before")
        options = self._by_name[parent].options
        missing = [v for v in values if not any(same_value(v, o) for o in options)]
        if missing:
            raise ValueError(f"knob {parent!r} has no option {missing[0]!r}")
        return parent, tuple(values)

    def define_bool(self, name: str) -> Knob:
        return self._add(Knob(name, "bool", (False, True)))

    # -- the space
    def __len__(self) -> int:
        return math.prod(len(k) for k in self.knobs) if self.knobs else 1

    def options(self, name: str) -> list[Any]:
        """The values knob `name` offers."""
        return list(self._by_name[name].options)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def indices_of(self, index: int) -> list[int]:
        if not 0 <= index < len(self):
            raise IndexError(f"config index {index} outside a space of {len(self)}")
        digits = []
        for knob in self.knobs:
            index, digit = divmod(index, len(knob))
            digits.append(digit)
        return digits

    def index_of(self, digits: Sequence[int]) -> int:
        index = 0
        for knob, digit in zip(reversed(self.knobs), reversed(list(digits)), strict=True):
            index = index * len(knob) + digit
        return index

    def active(self, knob: Knob, digits: Sequence[int]) -> bool:
        """Whether `knob` applies to the config of `digits` (its condition holds)."""
        if knob.when is None:
            return True
        parent, values = knob.when
        position = self._position[parent]
        value = self.knobs[position].options[digits[position]]
        return any(same_value(value, v) for v in values)

    def inactive(self, config: Config) -> set[str]:
        """Names of the knobs that do not apply to `config`."""
        if all(k.when is None for k in self.knobs):
            return set()
        digits = self.indices_of(config.index)
        return {k.name for k in self.knobs if not self.active(k, digits)}

    def _canonical(self, digits: list[int]) -> list[int]:
        # knobs that do not apply take their first option (conditions name earlier
        # knobs, so one pass in order settles them)
        for k, knob in enumerate(self.knobs):
            if knob.when is not None and not self.active(knob, digits):
                digits[k] = 0
        return digits

    def canonical_index(self, index: int) -> int:
        """The index of the config `index` stands for (the same where every knob
        applies): knobs that do not apply at their first option."""
        return self.index_of(self._canonical(self.indices_of(index)))

    def get(self, index: int) -> Config:
        """The config of `index`, under its canonical index (see canonical_index)."""
        digits = self._canonical(self.indices_of(index))
        return Config({k.name: k.options[d] for k, d in zip(self.knobs, digits, strict=True)},
                      self.index_of(digits), self)

    def __iter__(self) -> Iterator[Config]:
        """Every config once (indices that stand for another config are skipped)."""
        for i in range(len(self)):
            if self.canonical_index(i) == i:
                yield self.get(i)

    def sample(self, rng: random.Random, n: int = 1) -> list[Config]:
        """Up to `n` distinct configs drawn uniformly over the indices (all of them if
        the space is smaller): a rule's configs as often as another's."""
        total = len(self)
        if n >= total:
            return list(self)
        picks = {c.index: c for c in (self.get(i) for i in rng.sample(range(total), n))}
        return list(picks.values())

    def neighbours(self, config: Config) -> list[Config]:
        """Configs differing from `config` in exactly one knob that applies to it
        (changing a rule knob may also reset the knobs that then stop applying)."""
        digits = self.indices_of(config.index)
        result: dict[int, Config] = {}
        for k, knob in enumerate(self.knobs):
            if not self.active(knob, digits):
                continue
            for d in range(len(knob)):
                if d != digits[k]:
                    changed = list(digits)
                    changed[k] = d
                    other = self.get(self.index_of(changed))
                    result.setdefault(other.index, other)
        return list(result.values())

    def random_neighbour(self, config: Config, rng: random.Random) -> Config:
        digits = self.indices_of(config.index)
        movable = [k for k, knob in enumerate(self.knobs)
                   if len(knob) > 1 and self.active(knob, digits)]
        if not movable:
            return config
        k = rng.choice(movable)
        before = [self.active(knob, digits) for knob in self.knobs]
        digits[k] = rng.choice([d for d in range(len(self.knobs[k])) if d != digits[k]])
        # a rule changed: the knobs that now apply start at random options (at their
        # first ones, every step into a rule would land on one corner of it)
        for j, knob in enumerate(self.knobs):
            if not before[j] and self.active(knob, digits):
                digits[j] = rng.randrange(len(knob))
        return self.get(self.index_of(digits))

    @property
    def rule_knobs(self) -> list[str]:
        """The knobs other knobs apply under (a template's rules), in order."""
        return list(dict.fromkeys(k.when[0] for k in self.knobs if k.when is not None))

    def rule_of(self, config: Config) -> tuple[int, ...]:
        """The option digits of `config`'s rule knobs (rule_knobs' order)."""
        digits = self.indices_of(config.index)
        return tuple(digits[self._position[name]] for name in self.rule_knobs)

    def sample_index(self, rng: random.Random, tries: int = 32,
                     rule: Sequence[int] | None = None) -> int:
        """A canonical index drawn uniformly over the indices, or over those of `rule`
        (option digits of rule_knobs, as rule_of gives). Where knobs apply under a
        rule knob, a config the constraints refuse is drawn again under the same rule
        (up to `tries` times): a rule whose own knobs are often refused still gets its
        share of the samples, as each of Ansor's sketches does."""
        rules = self.rule_knobs
        digits = self.indices_of(rng.randrange(len(self)))
        for name, digit in zip(rules, rule or (), strict=False):
            digits[self._position[name]] = digit
        index = self.canonical_index(self.index_of(digits))
        if not rules or not self._constraints:
            return index
        fixed = [k for k, knob in enumerate(self.knobs) if knob.name in rules]
        digits = self.indices_of(index)
        for _ in range(tries):
            if self.why_not(self.get(self.index_of(digits))) is None:
                break
            digits = [digits[k] if k in fixed else rng.randrange(len(knob))
                      for k, knob in enumerate(self.knobs)]
        return self.canonical_index(self.index_of(digits))

    # -- serialization and features
    def from_json(self, values: dict[str, Any]) -> Config:
        """The config with these knob values (as written by Config.to_json). A value
        must be one of its knob's options with the option's type: 1.5, true or "8" is
        no block size of 8 (tuning records are checked here, for every template)."""
        digits: list[int] = []
        for knob in self.knobs:
            if knob.name not in values and knob.default is None:
                if not self.active(knob, digits + [0] * (len(self.knobs) - len(digits))):
                    digits.append(0)  # a knob that does not apply may be left out
                    continue
                raise KeyError(f"config lacks knob {knob.name!r}")
            value = values.get(knob.name, knob.default)
            digit = next((d for d, option in enumerate(knob.options)
                          if same_value(value, option)), None)
            if digit is None:
                raise ValueError(f"knob {knob.name!r} has no option {value!r}")
            digits.append(digit)
        return self.get(self.index_of(digits))

    def contains(self, values: dict[str, Any]) -> bool:
        """Whether `values` (a config's JSON) is a point of this space: every knob
        given one of its options (see from_json)."""
        try:
            self.from_json(values)
        except (KeyError, ValueError, TypeError):
            return False
        return True

    def features(self, config: Config) -> list[float]:
        digits = self.indices_of(config.index)
        return [f for knob, d in zip(self.knobs, digits, strict=True) for f in knob.features(d)]

    def describe(self) -> str:
        parts = [f"{k.name}({k.kind}:{len(k)})" for k in self.knobs]
        return f"{len(self)} configs = " + " x ".join(parts)

    def dumps(self, config: Config) -> str:
        return canonical_json(config.to_json())


def same_value(value: Any, option: Any) -> bool:
    """Whether a config value (JSON or Python) is the knob option `option`: equal and
    of its kind (a bool is no integer, a float no integer, a list is a split's tuple)."""
    if isinstance(option, tuple):
        return (isinstance(value, list | tuple) and len(value) == len(option)
                and all(map(same_value, value, option)))
    if isinstance(option, bool) or isinstance(value, bool):
        return isinstance(option, bool) and isinstance(value, bool) and value == option
    if isinstance(option, numbers.Integral):
        return isinstance(value, numbers.Integral) and value == option
    return type(value) is type(option) and value == option


def nearest_config(space: ConfigSpace, values: dict[str, Any]) -> Config:
    """The config nearest to `values`: each knob takes its value, else the closest
    numeric option, else its first option (a fallback written for one target's
    options used on another's)."""
    chosen = {}
    for knob in space.knobs:
        want = values.get(knob.name, knob.options[0])
        if want in knob.options:
            chosen[knob.name] = want
        elif isinstance(want, int | float) and all(isinstance(o, int | float)
                                                  for o in knob.options):
            chosen[knob.name] = min(knob.options, key=lambda o: (abs(o - want), o))
        else:
            chosen[knob.name] = knob.options[0]
    return space.from_json(chosen)
