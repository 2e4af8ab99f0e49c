"""How often the answer's claims are true: the settling rule's calibration on the refined landscape (issue 36).

    PYTHONPATH=. .venv/bin/python bench/replay.py --claims [--seeds 200] [--strategies guided]
        [--claims-rules race,race@8,before,before@8,before@16] [--out bench/results/replay_claims.md]

Each seed replays the search of one sweep as bench/replay.py does (``search``: the sampler asked as in a sweep,
each run one of the config's stored runs, ``--budget`` trials), then settles the answer of that same search with
each rule in turn, every rule drawing the same refinement rounds in the same order (``random.Random`` seeded by
the seed alone), so the rules differ only by what they run and how they judge it:

- ``race``: today's rule (orchestrator.sweep.race plans each round, orchestrator.records.answer.decide judges);
- ``race-unadjusted``: the same race with each rival told apart by its interval as if the pair had been fixed in
  advance (the rule up to commit 382de92), not read given the leader's pick (orchestrator.records.selection);
- ``before``: the rule before racing (bench/settle_before.py: every round the baseline and every contender,
  ties by the bootstrap of paired ratios), with the band its own intervals would state;
- ``@N``: ``winner.max_rounds=N`` (default: the sweep file's).

Judged against the refined truth (each config's paired ratio to the baseline over the refinement's rounds):

- **winner alone** (no tie declared): right when the winner is truly within ``winner.threshold`` of the best;
- **tie**: right when every member is truly within the band the answer states (``Answer.band``: the most a member
  can be slower than the fastest of them);
- **target met / not met**: right when the winner's truth is at or under / above the target (0.25 of the
  baseline); undecided verdicts make no claim and are counted apart.

"The best" is the landscape's true best; the columns "of the measured" judge against the best config the sweep
measured instead (a claim about configs the search never ran is the search's miss, not the answer's). Cost: the
settling rounds, runs, and seconds in updates (each run's drawn step time x ``run.steps``: the baseline's runs
weigh their 4x).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any, Sequence
from unittest import mock

import numpy as np

import replay as R
import settle_before as B
from orchestrator.records import answer as A
from orchestrator.sweep import race

DEFAULT_RULES = "race,race-unadjusted,before"


@dataclasses.dataclass
class Outcome:
    rule: str
    seed: int
    claim: str
    """alone (one winner) or tie."""
    right: bool
    """The claim true against the landscape's true best."""
    right_measured: bool
    """The same against the best config the sweep measured."""
    band: float | None
    """A tie's stated band (fraction)."""
    members: int
    verdict: str
    verdict_right: bool | None
    """met / not met right; None when undecided (no claim)."""
    winner_within_2: bool
    """History: the winner truly within 2% of the true best."""
    ties_within_2: bool
    """History: the winner and every tie member truly within 2%."""
    rounds: int
    runs: int
    baseline_runs: int
    update_s: float
    """The settling runs' seconds in updates."""
    measured_best: bool
    """The search measured the true best."""


RULES = ("race", "race-unadjusted", "before")


def parse_rules(text: str, base: A.SettleRule) -> dict[str, tuple[str, A.SettleRule]]:
    """``race,before@8`` -> label -> (the rule's name, its settings)."""
    out = {}
    for label in text.split(","):
        name, _, rounds = label.partition("@")
        if name not in RULES:
            raise ValueError(f"--claims-rules: {name!r} is not a rule ({', '.join(RULES)})")
        rule = dataclasses.replace(base, max_rounds=int(rounds)) if rounds else base
        out[label] = (name, rule)
    return out


def unadjusted_low(d: float, scale: float, confidence: float) -> float:
    """``race-unadjusted``: a rival's lower end as a pair fixed in advance has it (no reading given the pick)."""
    return d - statistics.NormalDist().inv_cdf((1 + confidence) / 2) * scale


def settle(samples: dict[str, list[float]], land: R.Landscape, rng: random.Random, base: str, target: Any,
           rule: A.SettleRule, before: bool, steps: int) -> tuple[Any, int, int, int, float]:
    """The answer after settling rounds as the rule runs them: (answer, rounds, runs, baseline runs, seconds in
    updates). ``before``: every round the baseline and the old rule's contenders, judged by its own decide."""
    keys = [base] + [k for k in samples if k != base]
    params = {k: (land.rows.get(k) or {}).get("params") or {"key": k} for k in keys}
    land_key = {A.key_of(params[k]): k for k in keys}
    records = [R._record(i, params[k], t, k == base, None) for i, k in enumerate(keys) for t in samples[k]]
    decide = B.decide if before else A.decide
    number = runs = base_runs = 0
    update_s = 0.0
    while number < rule.max_rounds:
        answer = decide(records, target, rule)
        if answer.settled:
            break
        if before:
            picks = [base] + [land_key[c] for c in answer.contenders]
        else:
            plan = race.next_round(answer, rule, rule.max_rounds - number)
            if plan is None:
                break
            picks = ([base] if plan.baseline else []) + [land_key[c] for c in plan.configs]
        number += 1
        rnd = rng.randrange(land.refined_rounds) if land.refined_rounds else None
        for k in picks:
            t = land.settling_sample(k, rnd, rng)
            records.append(R._record(keys.index(k), params[k], t, k == base, number))
            runs += 1
            base_runs += k == base
            update_s += t * steps
    return decide(records, target, rule), number, runs, base_runs, update_s


def band_before(answer: Any, rule: A.SettleRule) -> float | None:
    """The band the rule before racing would have stated from its own intervals: each member's ratio to the
    leader (bootstrap of their per-round ratio over common rounds, else their intervals), the largest upper end
    over the smallest lower end."""
    if len(answer.ties) < 2:
        return None
    lead = answer.leader
    his, los = [1.0], [1.0]
    for c in answer.ties:
        if c is lead:
            continue
        common = sorted(set(c.by_round) & set(lead.by_round))
        if len(common) >= B.MIN_COMMON_ROUNDS:
            lo, hi = B.ci_ratio([c.by_round[n] / lead.by_round[n] for n in common], rule.confidence, rule.resamples)
        else:
            lo, hi = c.interval[0] / lead.interval[1], c.interval[1] / lead.interval[0]
        his.append(hi)
        los.append(lo)
    return max(his) / min(los) - 1


def judge(label: str, seed: int, answer: Any, land: R.Landscape, samples: dict[str, list[float]],
          rule: A.SettleRule, before: bool, cost: tuple[int, int, int, float]) -> Outcome:
    land_key = {A.key_of((land.rows.get(k) or {}).get("params") or {"key": k}): k for k in samples}
    win = land_key[answer.winner.key]
    ties = [land_key[c.key] for c in answer.ties]
    measured = min(land.truth[k] for k in samples if k in land.truth)
    band = (band_before(answer, rule) if before else answer.band) if len(ties) > 1 else None
    limit = rule.threshold if band is None else band

    def true(best: float) -> bool:
        return all(land.truth[k] <= best * (1 + limit) for k in ties)

    v = answer.target
    ratio = land.truth[win]
    target_ratio = v.target_s / answer.baseline_s if v.target_s and answer.baseline_s else None
    verdict_right = None if v.state not in (A.MET, A.NOT_MET) or target_ratio is None else \
        (ratio <= target_ratio) == (v.state == A.MET)
    rounds, runs, base_runs, update_s = cost
    return Outcome(label, seed, "tie" if len(ties) > 1 else "alone", true(land.best), true(measured), band,
                   len(ties), v.state, verdict_right, land.within(win, 0.02), all(land.within(k, 0.02) for k in ties),
                   rounds, runs, base_runs, update_s, land.best_key in samples)


def run(land: R.Landscape, ranking: Any, strategy: str, seeds: int, budget: int, rules: str) -> list[Outcome]:
    """Every seed's search once, then each rule's settling of it."""
    parsed = parse_rules(rules, land.cfg.winner)
    steps = int(((land.doc.get("trainer") or {}).get("run") or {}).get("steps") or 1)
    out = []
    for seed in range(seeds):
        _, samples, _, _, base = R.search(strategy, land, seed, budget, budget, ranking, fracs=())
        for label, (name, rule) in parsed.items():
            rng = random.Random(f"{seed}/settle")
            before = name == "before"
            with mock.patch.object(A, "selected_low", unadjusted_low) if name == "race-unadjusted" else \
                    contextlib.nullcontext():
                answer, *cost = settle(samples, land, rng, base, land.cfg.target, rule, before, steps)
            out.append(judge(label, seed, answer, land, samples, rule, before, tuple(cost)))
    return out


def _pct(hits: Sequence[bool]) -> str:
    return f"{100 * sum(hits) / len(hits):.0f}% ({sum(hits)}/{len(hits)})" if hits else "-"


def table(outcomes: list[Outcome], command: str, land: R.Landscape, wall: float, strategy: str) -> str:
    rule = land.cfg.winner
    ref = land.doc.get("refined") or {}
    lines = [
        "# The answer's claims against the refined truth (`bench/replay.py --claims`)", "",
        f"Command: `{command}` ({wall:.0f} s)", "",
        f"Landscape `{land.doc['space']}` ({len(land.rows)} configs), refined {str(ref.get('started_at', ''))[:16]} "
        f"UTC ({land.refined_rounds} rounds); strategy `{strategy}`, {len({o.seed for o in outcomes})} seeds, the "
        f"same search per seed for every rule and the same drawn rounds; target "
        f"{_target(land)}; `winner.threshold` {rule.threshold:g}, `confidence` {rule.confidence:g}, "
        f"`min_rounds` {rule.min_rounds}, `top_k` {rule.top_k}. The search measured the true best in "
        f"{_pct([o.measured_best for o in outcomes if o.rule == outcomes[0].rule])} of seeds.", "",
        "| rule | winner alone: claimed | right (goal >= 95%) | of the measured | tie: claimed | every member within "
        "its band (goal >= 90%) | of the measured | band stated (median) | target met / not met: decided | right "
        "(goal >= 95%) | undecided | rounds (mean) | runs (mean) | baseline runs (mean) | seconds in updates "
        "(mean) | history: winner within 2% | every tie member within 2% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in dict.fromkeys(o.rule for o in outcomes):
        os_ = [o for o in outcomes if o.rule == label]
        alone = [o for o in os_ if o.claim == "alone"]
        tie = [o for o in os_ if o.claim == "tie"]
        decided = [o for o in os_ if o.verdict_right is not None]
        bands = [o.band for o in tie if o.band is not None]
        lines.append(
            f"| {label} | {len(alone)} | {_pct([o.right for o in alone])} | {_pct([o.right_measured for o in alone])} "
            f"| {len(tie)} | {_pct([o.right for o in tie])} | {_pct([o.right_measured for o in tie])} | "
            f"{'-' if not bands else f'{100 * statistics.median(bands):.0f}%'} | {len(decided)} | "
            f"{_pct([o.verdict_right for o in decided])} | {sum(o.verdict == A.UNDECIDED for o in os_)} | "
            f"{np.mean([o.rounds for o in os_]):.2f} | {np.mean([o.runs for o in os_]):.1f} | "
            f"{np.mean([o.baseline_runs for o in os_]):.1f} | {np.mean([o.update_s for o in os_]):.1f} | "
            f"{_pct([o.winner_within_2 for o in os_])} | {_pct([o.ties_within_2 for o in os_])} |")
    return "\n".join(lines) + "\n"


def main(args: Any, land: R.Landscape, ranking: Any, argv: Sequence[str]) -> None:
    t0 = time.perf_counter()
    strategy = args.strategies.split(",")[0]
    outcomes = run(land, ranking, strategy, args.seeds, args.budget, args.claims_rules)
    command = "PYTHONPATH=. .venv/bin/python bench/replay.py " + " ".join(argv)
    text = table(outcomes, command, land, time.perf_counter() - t0, strategy)
    out = Path(args.out)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "outcomes": [dataclasses.asdict(o)
                                                                                     for o in outcomes]}, indent=1))
    print(text)


def _target(land: R.Landscape) -> str:
    t = land.cfg.target
    return f"{t.relative_to_baseline:g} x the baseline" if t.kind == "relative" else t.describe()
