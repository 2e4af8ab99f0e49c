"""GPU tier: Megatron-LM through the command backend, end to end (tests/gpu/megatron_e2e.py: a tiny GPT through
pretrain_gpt.py, 2 configs, parsed from Megatron's own log and judged, within 8 minutes), where CUDA and a Megatron-LM
checkout are present.

    STEPTUNE_MEGATRON_LM=/path/to/Megatron-LM PYTHONPATH=. python3 -m pytest tests/gpu/test_command_megatron.py -q

Skipped, with the one line megatron_e2e.why_not gives, without CUDA, the checkout or Ray.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import megatron_e2e  # noqa: E402  (beside this file: the same script a person runs)

REASON = megatron_e2e.why_not()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.mark.timeout(megatron_e2e.BUDGET_S + 120)
def test_two_megatron_configs_are_measured_from_its_own_log_and_judged(tmp_path):
    lines = megatron_e2e.run(tmp_path)
    assert lines[1].params == {"batch.micro_batch_size": 2}
