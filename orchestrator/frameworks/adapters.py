"""The framework adapters the ``command`` backend and ``steptune parse-log`` use, one per framework.

An adapter is data and pure functions: the knobs it refuses (at load, naming knob and framework), the
arguments a trial's knobs become (appended to the user's launch command), the environment it needs, the file
its figures are read from (a result file on the first node, or the nodes' own stdout), and its parser.
The built-in ones (``FRAMEWORKS``) are fixed; a declared one (``command.framework: custom``) is built from its
declaration in the sweep file (orchestrator.frameworks.custom) by ``framework``, the one place that tells them apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from orchestrator.frameworks import custom, megatron, steptune, torchtitan
from orchestrator.frameworks.log import ParsedLog


@dataclass(frozen=True)
class Framework:
    name: str
    refuse: Callable[[Iterable[str]], None]
    """ValueError naming a knob of the space the framework cannot express."""
    render: Callable[[Any, Sequence[str]], tuple[list[str], dict[str, str]]]
    """(trial config, the space's knob keys) -> (the arguments appended to the command, files written into the
    trial folder on every node first, by name); ``{trial_dir}`` in an argument is that folder."""
    parse: Callable[[str, int | None, int | None], ParsedLog]
    """(text, warm-up iterations, expected iterations; None: the framework's own or the log's) -> ParsedLog."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment every rank of a trial gets (the user's ``command.env`` is applied over it)."""
    result_file: str | None = None
    """Read from this file in the trial folder on the first node; None: from the nodes' stdout."""
    describe: str = ""
    resolution: dict[str, float] = field(default_factory=dict)
    """Half the last digit the log prints, per metric (loss, grad_norm): what black-box parity cannot resolve."""
    render_env: Callable[[Any, Sequence[str]], dict[str, str]] | None = None
    """(trial config, the space's knob keys) -> environment variables the knobs set (a declared framework's); None:
    none."""
    first_node: bool = False
    """Read only the first node's stdout (rank 0's), not every node's."""
    exports: Callable[[Sequence[str]], dict[str, str]] | None = None
    """Files ``export`` writes beside the command, from the trial's rendered arguments (torchtitan: its overrides
    as a TOML file), by name; None: none."""


FRAMEWORKS: dict[str, Framework] = {
    megatron.NAME: Framework(
        megatron.NAME, megatron.refuse, lambda cfg, keys: (megatron.render(cfg, keys), {}),
        lambda text, warmup, expected: megatron.parse_log(text, 1 if warmup is None else warmup, expected),
        # Megatron's TP communication overlap and sequence parallelism rely on one hardware queue keeping kernel
        # order (its own launch scripts set this).
        env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, resolution={"grad_norm": 5e-4},  # lm loss: 6 significant digits
        describe="Megatron-LM (pretrain_gpt.py ...): knobs as its flags, read from its iteration and memory lines"),
    torchtitan.NAME: Framework(
        torchtitan.NAME, torchtitan.refuse, lambda cfg, keys: (torchtitan.render(cfg, keys), {}),
        lambda text, warmup, expected: torchtitan.parse_log(text, 1 if warmup is None else warmup, expected),
        resolution={"loss": 5e-5, "grad_norm": 5e-5},  # loss 7.4f in older releases (8.5f now), grad norm 7.4f
        exports=lambda flags: {torchtitan.TOML_FILE: torchtitan.overrides_toml(flags)},
        describe="torchtitan (-m torchtitan.train --module M --config C): knobs as its config's command-line "
                 "overrides, read from its metrics lines"),
    steptune.NAME: Framework(
        steptune.NAME, steptune.refuse, lambda cfg, keys: steptune.render(cfg),
        lambda text, warmup, expected: steptune.parse_result(text, warmup, expected),
        result_file=steptune.RESULT_FILE,
        describe="steptune's trainer (-m trainer): the trial's config as its YAML, read from its result JSON"),
}


NAMES = (*FRAMEWORKS, custom.NAME)
"""Every value ``command.framework`` takes."""


def framework(name: str, where: str = "command.framework", declared: custom.CustomFramework | None = None,
              world_size: int = 1, version: str | None = None) -> Framework:
    """The adapter ``name`` names: a built-in one, or ``custom`` built from its declaration (``command.custom``;
    ``world_size`` turns a whole job's tokens/s into per-rank figures). ``version``: the framework release a
    built-in adapter targets where it supports more than one (``command.framework_version``)."""
    if name == custom.NAME:
        if declared is None:
            raise ValueError(f"command.custom: required with {where}=custom: declare your script's knobs (knobs:) "
                             f"and how its log is read (log.iteration, log.loss, ...); docs/frameworks.md")
        return declared_framework(declared, world_size)
    if name not in FRAMEWORKS:
        raise ValueError(f"{where}={name!r}: known frameworks are {', '.join(NAMES)}")
    if declared is not None:
        raise ValueError(f"command.custom: only read with {where}=custom (it is {name}); remove the section or set "
                         f"{where}=custom")
    if name == torchtitan.NAME:
        return torchtitan_for(version)
    if version is not None:
        raise ValueError(f"command.framework_version={version!r}: only torchtitan has versions to choose from")
    return FRAMEWORKS[name]


def torchtitan_for(version: str | None) -> Framework:
    """The torchtitan adapter for a named release (None: the one it targets, ``torchtitan.TARGET``)."""
    t = torchtitan.target(version)
    base = FRAMEWORKS[torchtitan.NAME]
    return dataclasses.replace(base, refuse=lambda keys: torchtitan.refuse(keys, t),
                               render=lambda cfg, keys: (torchtitan.render(cfg, keys, t), {}))


def declared_framework(decl: custom.CustomFramework, world_size: int = 1) -> Framework:
    """A declared framework as an adapter like any other."""
    from orchestrator.frameworks import custom_log

    src = decl.log.source
    return Framework(decl.name, decl.refuse, lambda cfg, keys: (decl.render(cfg, keys)[0], {}),
                     lambda text, warmup, expected: custom_log.parse(decl.log, decl.name, text,
                                                                     1 if warmup is None else warmup, expected,
                                                                     world_size),
                     render_env=lambda cfg, keys: decl.render(cfg, keys)[1],
                     result_file=src.path if isinstance(src, custom.FileSource) else None,
                     first_node=isinstance(src, custom.StdoutSource),
                     describe=f"{decl.name} (declared in the sweep file): knobs as its declared arguments, read "
                              f"with its declared patterns")


def what_ran(command: dict[str, Any], figures: dict[str, Any] | None) -> dict[str, str]:
    """The export of a command-backend trial: ``command.sh`` (its environment and the exact argv every node
    started, the node's trial folder written as the script's own folder, where the export puts the trial's files)
    and ``framework_log.json`` (what steptune read from its log), by file name."""
    import json
    import shlex

    env = command.get("env") or {}
    files = command.get("files") or []
    lines = ["#!/bin/sh", "# The exact command this trial ran: one torchrun per node (run each line on its node).",
             "# Its trial folder ({trial_dir}) is this script's folder" + (f", which holds {', '.join(files)}"
                                                                       if files else "") + ".",
             'DIR="$(cd "$(dirname "$0")" && pwd)"', ""]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())] + [""]
    if command.get("cwd"):
        lines += ["# the command's working directory (command.cwd) on every node", f"cd {shlex.quote(command['cwd'])}",
                  ""]
    argvs = command.get("per_node_argv") or [command.get("argv") or []]
    dirs = command.get("per_node_trial_dir") or [None] * len(argvs)
    for i, (argv, folder) in enumerate(zip(argvs, dirs)):
        line = shlex.join(argv)
        if folder:
            line = line.replace(folder, "$DIR")  # the folder is a plain temp path: quoting never splits it
        lines += [f"# node {i}", line]
    out = {"command.sh": "\n".join(lines) + "\n"}
    fw = FRAMEWORKS.get(command.get("framework") or "")
    if fw is not None and fw.exports is not None and command.get("flags") is not None:
        out.update(fw.exports(command["flags"]))
    if figures is not None:
        out["framework_log.json"] = json.dumps(figures, indent=1) + "\n"
    return out
