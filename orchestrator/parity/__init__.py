"""The parity gate: does a trial learn exactly what the reference learns?

``verdict`` compares a run with a reference (losses, grad norms, parameter fingerprints) under stated
tolerances and keeps the reference store; ``trust`` is the chain that earns the reference: the canonical
layout, then the baseline against it, then every trial against the baseline.

May import: units
"""
