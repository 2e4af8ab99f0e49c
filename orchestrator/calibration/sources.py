"""Where a model-backend prediction's figures come from: cluster and calibration files, and what is measured.

A sweep file's ``planner:`` section states the cluster and the efficiency set inline. Two keys bring in
measured files instead (``steptune plan ... planner.cluster_file=mine.yaml`` works too):

* ``cluster_file``: a cluster file. One ``steptune netcal`` wrote (``provenance: {basis: measured}``) brings
  the fields it measured and nothing else, and the bandwidth efficiencies of the measured tiers become 1
  (the measured bandwidth is already what the collectives achieved); a plain cluster file (a datasheet
  machine) replaces every inline field except ``num_gpus``, which is the job's.
* ``calibration_file``: an efficiency set fitted to measured runs (``steptune calibrate``); it replaces the
  inline ``efficiency:`` whole, with ``basis: fitted`` and a note naming the file. Its ``uncertainty:``
  section, when it has one (``ledger_fit.load_uncertainty``), is how sure that fit is.

A third key says how sure an inline set is: ``uncertainty: {corpus: GENERATION}`` names the corpus set the
inline ``efficiency:`` is (the 500B preset's blind set is the ``b200`` one: the H100 fit, transferred); its
stored bootstrap (``orchestrator/planner/corpus/uncertainty.yaml``) gives every prediction its interval
(``calibration/interval.py``). A calibration file replaces the inline set, so it replaces this too.

``resolve`` returns the plain planner mapping the planner parses, and ``Sources``: one line each for the
network and the compute side saying which parts are measured and which are priors, for every prediction, and
the fit uncertainty of the efficiency set, if any.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from orchestrator.commands import steptune
from orchestrator.calibration.ledger_fit import load_calibration, load_uncertainty
from orchestrator.calibration.hardware import mismatch
from orchestrator.calibration.netcal import TIER_FIELDS, measured_efficiencies
from orchestrator.planner.corpus_uncertainty import SetUncertainty, corpus_set
from orchestrator.planner.parse import UNCERTAINTY_KEY

log = logging.getLogger(__name__)

FILE_KEYS = ("cluster_file", "calibration_file")
NO_UNCERTAINTY = (f"no fit uncertainty declared (planner.{UNCERTAINTY_KEY}: {{corpus: GENERATION}} for a corpus "
                  "set, or a calibration file with an uncertainty: section)")


@dataclass(frozen=True)
class Sources:
    network: str
    """Where the cluster's bandwidth and latency come from."""
    compute: str
    """Where the efficiency set comes from."""
    warnings: tuple[str, ...] = ()
    """A calibration file measured on other hardware than the cluster asked about (``calibration.hardware``)."""
    uncertainty: SetUncertainty | None = None
    """How sure the fit of the efficiency set is (a corpus set's or a calibration file's); None: not stated."""
    no_uncertainty: str = NO_UNCERTAINTY
    """Why ``uncertainty`` is None (shown where the prediction falls back to the corpus band)."""

    def lines(self) -> list[str]:
        return [f"network: {self.network}", f"compute: {self.compute}", *self.warnings]


def resolve_path(path: str | Path, base_dir: Path | None) -> Path:
    """A path as typed: absolute or found from the working directory as is, else relative to ``base_dir``."""
    p = Path(path)
    if p.is_absolute() or p.exists() or base_dir is None:
        return p
    return base_dir / p


def _load(path: Path, key: str) -> Mapping[str, Any]:
    if not path.is_file():
        raise ValueError(f"planner.{key}: {path}: no such file")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"planner.{key}: {path}: expected a mapping")
    return data


def resolve(planner: Mapping[str, Any], base_dir: Path | None = None) -> tuple[dict[str, Any], Sources]:
    """The planner section with its file keys read in, and where its figures come from."""
    out = copy.deepcopy(dict(planner))
    cluster_path, cal_path = out.pop("cluster_file", None), out.pop("calibration_file", None)
    fit, no_fit = _declared_uncertainty(out.pop(UNCERTAINTY_KEY, None)), NO_UNCERTAINTY
    network = "prior: the planner section's cluster figures (datasheet values and stated assumptions)"
    measured_eff: set[str] = set()
    warnings: list[str] = []
    if cluster_path:
        path = resolve_path(str(cluster_path), base_dir)
        data = _load(path, "cluster_file")
        if not isinstance(data.get("cluster"), Mapping):
            raise ValueError(f"planner.cluster_file: {path}: expected a cluster: section (a cluster file)")
        prov = data.get("provenance") or {}
        measured = list(prov.get("measured") or []) if prov.get("basis") == "measured" else []
        # A measured file brings what it measured and nothing else (its other fields are its base file's
        # priors, perhaps of another machine); a plain cluster file is a whole machine, minus the job's size.
        take = measured or [k for k in data["cluster"] if k != "num_gpus"]
        if unknown := [k for k in take if k not in data["cluster"]]:
            raise ValueError(f"planner.cluster_file: {path}: provenance names {unknown[0]}, which its cluster: "
                             f"section lacks")
        out["cluster"] = {**(out.get("cluster") or {}), **{k: data["cluster"][k] for k in take}}
        if measured:
            tiers = {t for t, fields in TIER_FIELDS.items() if all(f in measured for f in fields)}
            measured_eff = set(measured_efficiencies({**data["cluster"], **out["cluster"]}, tiers))
            sources = ", ".join(sorted({f"{s.get('collective')} x{s.get('ranks')} on {s.get('nodes')} node(s)"
                                        for s in prov.get("sources") or []}))
            rest = [f for fields in TIER_FIELDS.values() for f in fields if f not in measured]
            network = (f"MEASURED {', '.join(measured) or 'nothing'} from {path.name} ({sources}; {prov.get('date')})"
                       + (f"; from the planner section (priors): {', '.join(rest)}" if rest else ""))
        else:
            network = f"prior: {path.name} (a cluster file without measured provenance)"
    if cal_path:
        path = resolve_path(str(cal_path), base_dir)
        data = _load(path, "calibration_file")
        if not isinstance(data.get("efficiency"), Mapping):
            raise ValueError(f"planner.calibration_file: {path}: expected an efficiency: section "
                             f"(write one with {steptune()} calibrate)")
        out["efficiency"] = {**data["efficiency"], "basis": "fitted", "basis_note": f"calibration file {path.name}"}
        u = load_uncertainty(path)
        if u is not None:
            point = load_calibration(path)
            fit = SetUncertainty(f"calibration file {path.name}", {f: float(getattr(point, f)) for f in u.fields}, u)
        else:
            fit = None
        no_fit = f"calibration file {path.name} has no uncertainty: section"
        peak = (out.get("cluster") or {}).get("peak_tflops")
        prov = data.get("provenance")
        if isinstance(prov, Mapping) and (w := mismatch(prov, peak_tflops=float(peak) if peak else None,
                                                            what="the plan")):
            warnings.append(f"{w} ({path.name})")
            log.warning("%s (%s)", w, path.name)
        if (data.get("provenance") or {}).get("basis") == "measured":
            # A bandwidth efficiency fitted to measured slices (profile's data-parallel slices) is a measurement
            # of the same links, through the trainer's own buckets: it stands.
            measured_eff -= set((data.get("calibration") or {}).get("fitted") or [])
    if measured_eff:  # last, so a calibration's fitted bandwidth efficiencies do not undo a measured network
        out["efficiency"] = {**(out.get("efficiency") or {}), **{e: 1.0 for e in measured_eff}}
    eff = out.get("efficiency") or {}
    compute = f"efficiency set {eff.get('basis', 'prior')}" + (f" ({eff['basis_note']})" if eff.get("basis_note") else "")
    return out, Sources(network, compute, tuple(warnings), fit, no_fit if fit is None else "")


def _declared_uncertainty(spec: Any) -> SetUncertainty | None:
    """``planner.uncertainty``: ``{corpus: GENERATION}`` or absent."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or set(spec) != {"corpus"}:
        raise ValueError(f"planner.{UNCERTAINTY_KEY}: expected {{corpus: GENERATION}} (the corpus set the inline "
                         f"efficiency: is, e.g. b200), got {spec!r}")
    try:
        return corpus_set(str(spec["corpus"]))
    except ValueError as e:
        raise ValueError(f"planner.{UNCERTAINTY_KEY}.{e}") from None
