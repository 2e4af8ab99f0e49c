# The two commands the README starts with. Each sets everything up first (scripts/setup.sh).
.PHONY: setup sweep test test-fast bench docs mutate

setup:
	bash scripts/setup.sh

sweep: setup
	.venv/bin/python -m orchestrator sweep

# The unit tier runs on two pytest-xdist workers (pure functions and in-process fakes: about twice as fast on 2
# cores); the distributed and e2e tiers run one test at a time, as each of their tests occupies both cores.
test: setup
	.venv/bin/python -m pytest -q -n 2 -m "not e2e and not distributed"
	.venv/bin/python -m pytest -q -m "e2e or distributed"

test-fast: setup
	.venv/bin/python -m pytest -q -n 2 -m "not e2e and not distributed"

bench: setup
	.venv/bin/python bench/throughput_cpu.py

# The field tables in docs/sweep.md and docs/trainer.md (from the config dataclasses' docstrings), docs/cli.md's
# subcommands and flags (from the argparse parsers) and docs/architecture.md's rooms.
docs: setup
	.venv/bin/python -m orchestrator.docgen

# Mutation testing of the decision modules (minutes; not part of `make test`): bench/mutation.py runs mutmut
# module by module over [tool.mutmut] in pyproject.toml and scores it (docs/testing.md#mutation-testing).
mutate: setup
	.venv/bin/python bench/mutation.py --fresh
