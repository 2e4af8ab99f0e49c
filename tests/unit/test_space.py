"""The search-space parser and define-by-run suggest, from tables."""

from __future__ import annotations

import optuna
import pytest

from orchestrator.search.space import enumerate_space, feasible_splits, params_for, parse_space, suggest

FIXED = {"recompute.kind": "none", "parallel.pp": 1, "pipeline.schedule": "1f1b", "pipeline.virtual_stages": 1,
         "model.n_layers": 6}


def split_context(cfg):
    pp = cfg["parallel.pp"]
    return cfg["model.n_layers"], pp * cfg.get("pipeline.virtual_stages", 1)


# (spec, expected Optuna distribution)
PARSE_TABLE = [
    ({"type": "categorical", "choices": [1, 2, 4]}, optuna.distributions.CategoricalDistribution([1, 2, 4])),
    ({"type": "categorical", "choices": [True, False]}, optuna.distributions.CategoricalDistribution([True, False])),
    ({"type": "int", "low": 1, "high": 4}, optuna.distributions.IntDistribution(1, 4)),
    ({"type": "int", "low": 2, "high": 8, "step": 2}, optuna.distributions.IntDistribution(2, 8, step=2)),
    ({"type": "int", "low": 1, "high": 64, "log": True}, optuna.distributions.IntDistribution(1, 64, log=True)),
    ({"type": "float", "low": 0.05, "high": 5, "log": True}, optuna.distributions.FloatDistribution(0.05, 5, log=True)),
    ({"type": "float", "low": 0, "high": 1, "step": 0.25}, optuna.distributions.FloatDistribution(0, 1, step=0.25)),
]


@pytest.mark.parametrize("spec,dist", PARSE_TABLE)
def test_each_type_becomes_its_optuna_distribution(spec, dist):
    space = parse_space({"params": {"x.y": spec}})
    assert space.distributions() == {"x.y": dist}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        trial = study.ask()
        params, overrides = suggest(trial, space, {})
        assert trial.distributions == {"x.y": dist}
        assert overrides == params and dist._contains(dist.to_internal_repr(params["x.y"]))
        study.tell(trial, 1.0)


BAD_SPECS = [
    ({"type": "nope"}, "x.y.type='nope'"),
    ([1, 2], "x.y: expected a mapping"),
    ({"type": "categorical"}, "x.y.choices"),
    ({"type": "categorical", "choices": []}, "x.y.choices"),
    ({"type": "categorical", "choices": [1, 1]}, "duplicates"),
    ({"type": "categorical", "choices": [[1], [2]]}, "x.y.choices: only"),
    ({"type": "int", "low": 1}, "x.y.high"),
    ({"type": "int", "low": 1.5, "high": 3}, "x.y.low: expected an integer"),
    ({"type": "int", "low": 4, "high": 1}, "x.y: low=4 is above high=1"),
    ({"type": "float", "low": 0, "high": 1, "log": True}, "x.y: log: true needs low > 0"),
    ({"type": "float", "low": 1, "high": 2, "step": 0.5, "log": True}, "step and log"),
    ({"type": "int", "low": 1, "high": 2, "bogus": 3}, "x.y: unknown key(s) ['bogus']"),
    ({"type": "int", "low": 1, "high": 2, "default": 1}, "x.y.default only applies with when"),
    ({"type": "int", "low": 1, "high": 2, "when": ["a"]}, "x.y.when: expected a mapping"),
    ({"type": "int", "low": 1, "high": 2, "when": {"x.y": 1}}, "cannot depend on itself"),
    ({"type": "layer_split", "first": [0, 2], "last": [1, 2]}, "x.y.first=[0, 2]: need 1 <= min <= max"),
    ({"type": "layer_split", "first": [1, 2]}, "x.y.last: expected [min, max]"),
    ({"type": "layer_split", "first": [1, 2], "last": [1, 2], "choices": [1]}, "unknown key(s) ['choices']"),
]


@pytest.mark.parametrize("spec,message", BAD_SPECS)
def test_bad_specs_name_the_param(spec, message):
    with pytest.raises(ValueError) as e:
        parse_space({"params": {"x.y": spec}})
    assert message in str(e.value) and "space.params.x.y" in str(e.value)


def test_bad_space_shapes():
    for data, message in [(None, "space: expected a mapping"), ({"params": {}}, "space.params"),
                          ({"params": {"a": {"type": "int", "low": 1, "high": 2}}, "extra": 1}, "space:"),
                          ({"params": {"a": {"type": "int", "low": 1, "high": 2}}, "allow_numerics_change": ["b"]},
                           "space.allow_numerics_change: b not in space.params"),
                          ({"params": {"a": {"type": "int", "low": 1, "high": 2}}, "allow_numerics_change": "a"},
                           "space.allow_numerics_change: expected a list")]:
        with pytest.raises(ValueError, match=message):
            parse_space(data)


def test_conditionals_cycle_is_rejected():
    with pytest.raises(ValueError, match="cycle"):
        parse_space({"params": {"a": {"type": "categorical", "choices": [1, 2], "when": {"b": 1}},
                                "b": {"type": "categorical", "choices": [1, 2], "when": {"a": 1}}}})


CONDITIONAL = {"params": {
    "recompute.num_layers": {"type": "int", "low": 1, "high": 2, "when": {"recompute.kind": "full"}},
    "recompute.kind": {"type": "categorical", "choices": ["none", "full"]},
    "pipeline.split": {"type": "layer_split", "when": {"parallel.pp": [2, 4]}, "first": [2, 4], "last": [2, 4]},
    "pipeline.virtual_stages": {"type": "int", "low": 2, "high": 2, "default": 1,
                                "when": {"pipeline.schedule": "interleaved_1f1b"}},
    "pipeline.schedule": {"type": "categorical", "choices": ["1f1b", "interleaved_1f1b"], "when": {"parallel.pp": 2}},
    "parallel.pp": {"type": "categorical", "choices": [1, 2]},
}}


class Fixed:
    """Answers each suggest from a table, like an enqueued trial."""

    def __init__(self, values):
        self.values, self.asked = values, []

    def _get(self, name, *_, **__):
        self.asked.append(name)
        return self.values[name]

    suggest_categorical = suggest_int = suggest_float = _get


# (answers, expected params, expected extra overrides)
SUGGEST_TABLE = [
    ({"recompute.kind": "none", "parallel.pp": 1},
     {"recompute.kind": "none", "parallel.pp": 1},
     {"pipeline.virtual_stages": 1, "pipeline.split.kind": "balanced"}),
    ({"recompute.kind": "full", "recompute.num_layers": 2, "parallel.pp": 1},
     {"recompute.kind": "full", "recompute.num_layers": 2, "parallel.pp": 1},
     {"pipeline.virtual_stages": 1, "pipeline.split.kind": "balanced"}),
    ({"recompute.kind": "none", "parallel.pp": 2, "pipeline.schedule": "1f1b",
      "pipeline.split.first": 2, "pipeline.split.last": 4},
     {"recompute.kind": "none", "parallel.pp": 2, "pipeline.schedule": "1f1b",
      "pipeline.split.first": 2, "pipeline.split.last": 4},
     {"pipeline.virtual_stages": 1, "pipeline.split.kind": "first_last"}),
    ({"recompute.kind": "none", "parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b",
      "pipeline.virtual_stages": 2, "pipeline.split.first": 2, "pipeline.split.last": 2},
     {"recompute.kind": "none", "parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b",
      "pipeline.virtual_stages": 2, "pipeline.split.first": 2, "pipeline.split.last": 2},
     {"pipeline.split.kind": "first_last"}),
]


@pytest.mark.parametrize("answers,params,extra", SUGGEST_TABLE)
def test_conditional_params_are_asked_only_when_their_condition_holds(answers, params, extra):
    space = parse_space(CONDITIONAL)
    trial = Fixed(answers)
    got_params, overrides = suggest(trial, space, FIXED, split_context)
    assert got_params == params
    assert sorted(trial.asked) == sorted(params)
    assert overrides == {**params, **extra}


def test_dependencies_are_suggested_first():
    names = [p.name for p in parse_space(CONDITIONAL).params]
    assert names.index("recompute.kind") < names.index("recompute.num_layers")
    assert names.index("parallel.pp") < names.index("pipeline.schedule") < names.index("pipeline.virtual_stages")
    assert names[-1] == "pipeline.split"


# (n_layers, n_stages, first range, last range, feasible pairs)
SPLIT_TABLE = [
    (6, 2, (2, 4), (2, 4), [(2, 4), (3, 3), (4, 2)]),
    (6, 4, (2, 4), (2, 4), [(2, 2)]),
    (8, 4, (1, 3), (1, 3), [(1, 1), (1, 3), (2, 2), (3, 1), (3, 3)]),
    (8, 3, (1, 2), (1, 2), [(1, 1), (1, 2), (2, 1), (2, 2)]),
]


@pytest.mark.parametrize("n_layers,n_stages,first,last,pairs", SPLIT_TABLE)
def test_layer_split_keeps_the_middle_balanced(n_layers, n_stages, first, last, pairs):
    p = parse_space({"params": {"s": {"type": "layer_split", "first": list(first), "last": list(last)}}}).params[0]
    assert feasible_splits(p, n_layers, n_stages) == pairs


def test_layer_split_with_no_feasible_pair_names_the_param():
    p = parse_space({"params": {"pipeline.split": {"type": "layer_split", "first": [1, 3], "last": [1, 3]}}}).params[0]
    with pytest.raises(ValueError, match="pipeline.split: no first in \\[1, 3\\]"):
        feasible_splits(p, 8, 2)
    with pytest.raises(ValueError, match="needs >= 2 pipeline stages"):
        feasible_splits(p, 8, 1)


def test_layer_split_suggests_only_feasible_values_with_optuna():
    space = parse_space(CONDITIONAL)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        params, overrides = suggest(trial, space, FIXED, split_context)
        if overrides["pipeline.split.kind"] == "first_last":
            n_stages = 2 * overrides["pipeline.virtual_stages"]
            p = space.get("pipeline.split")
            pair = (params["pipeline.split.first"], params["pipeline.split.last"])
            assert pair in feasible_splits(p, 6, n_stages)
            seen.add((n_stages, pair))
        study.tell(trial, 1.0)
    assert (4, (2, 2)) in seen and len(seen) >= 3


def test_enumerate_walks_every_branch_once():
    combos = list(enumerate_space(parse_space(CONDITIONAL), FIXED, split_context))
    keys = [tuple(sorted(p.items())) for p, _ in combos]
    assert len(keys) == len(set(keys))
    # pp=1: recompute none | full x {1,2} = 3; pp=2: 3 x (1f1b: 3 splits + interleaved: 1 split) = 12
    assert len(combos) == 15


def test_enumerate_samples_when_the_grid_is_large():
    space = parse_space({"params": {f"p{i}": {"type": "categorical", "choices": list(range(10))} for i in range(4)}})
    combos = list(enumerate_space(space, {}, limit=50, samples=20))
    assert len(combos) == 70


def test_unknown_when_name_is_reported():
    space = parse_space({"params": {"a": {"type": "int", "low": 1, "high": 2, "when": {"no.such": 1}}}})
    with pytest.raises(ValueError, match="a: when: names no.such"):
        suggest(Fixed({"a": 1}), space, {})


def test_params_for_describes_the_baseline():
    space = parse_space(CONDITIONAL)
    base = {**FIXED, "parallel.pp": 2, "pipeline.schedule": "1f1b", "recompute.num_layers": 1}
    assert params_for(space, base, [3, 3]) == {"recompute.kind": "none", "parallel.pp": 2,
                                               "pipeline.schedule": "1f1b", "pipeline.split.first": 3,
                                               "pipeline.split.last": 3}
    with pytest.raises(ValueError, match="parallel.pp=4, which is not among"):
        params_for(space, {**base, "parallel.pp": 4}, [3, 3])
