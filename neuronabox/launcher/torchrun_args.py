"""Split a `neuronabox torchrun` command line into torchrun's flags, ours, and the script
(the command's help is its parser in cli/torchrun.py)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from neuronabox.errors import NeuronaBoxError

# torchrun flags that take no value.
TORCHRUN_SWITCHES = {
    "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
    "--virtual-local-rank", "--virtual_local_rank",
}  # fmt: skip
# torchrun flags that take one (torch.distributed.run's parser, torch 2.2 to 2.13), as the
# launcher passes them on, with dashes; torchrun takes each with underscores as well. Any
# other flag is refused here: torchrun would refuse it only after the controller started.
TORCHRUN_FLAGS = {
    "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
    "--max-restarts", "--monitor-interval", "--start-method", "--event-log-handler", "--role", "--log-dir",
    "-r", "--redirects", "-t", "--tee", "--local-ranks-filter", "--duplicate-stdout-filters",
    "--duplicate-stderr-filters", "--node-rank", "--master-addr", "--master-port", "--local-addr", "--logs-specs",
    "--numa-binding", "--signals-to-handle", "--shutdown-timeout",
}  # fmt: skip
OURS = {
    "--real-nodes",
    "--real-ranks",
    "--data",
    "--gloo-mode",
    "--trace",
    "--gloo-host",
    "--topology",
    "--delay-model",
    "--boundary",
    "--placement",
    "--timeout",
    "--backend",
    "--nccl-algo",
    "--nccl-channels",
    "--nccl-route",
    "--device",
    "--skew",
    "--local-work",
    "--join-timeout",
}
OURS_REPEATED = {"--inject"}  # may be given several times
OUR_SWITCHES = {"--no-observer", "--realtime"}
REFUSED = {
    "--standalone": "--standalone runs a single node; give --nnodes for the emulated world",
}


# torchrun reads every flag also from PET_<NAME> (its `env` action), the command line
# winning. The launcher reads these itself, as defaults for flags not on the command line,
# and keeps them out of torchrun's environment, where they would override the flags it
# passes. Other PET_* variables (PET_MAX_RESTARTS, ...) stay for torchrun to read.
PET_FLAGS = {
    "PET_NNODES": "--nnodes",
    "PET_NPROC_PER_NODE": "--nproc-per-node",
    "PET_RDZV_BACKEND": "--rdzv-backend",
    "PET_RDZV_ENDPOINT": "--rdzv-endpoint",
    "PET_RDZV_ID": "--rdzv-id",
    "PET_MASTER_ADDR": "--master-addr",
    "PET_MASTER_PORT": "--master-port",
    "PET_NODE_RANK": "--node-rank",
}
PET_SWITCHES = {"PET_MODULE": "--module", "PET_NO_PYTHON": "--no-python", "PET_RUN_PATH": "--run-path"}
PET_IGNORED = {"PET_STANDALONE"}  # standalone is refused
PET_VARS = {*PET_FLAGS, *PET_SWITCHES, *PET_IGNORED}
_CANONICAL = {"-m": "--module", "--no_python": "--no-python", "--run_path": "--run-path"}


class UsageError(NeuronaBoxError, ValueError):
    """Bad input on the command line: one line, exit status 2."""


@dataclass
class LaunchArgs:
    torchrun: list[tuple[str, str | None]] = field(default_factory=list)  # flags passed through
    ours: dict[str, str] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)
    repeated: dict[str, list[str]] = field(default_factory=dict)
    script: list[str] = field(default_factory=list)  # script (or module) and its arguments
    help: bool = False  # -h/--help before the script
    from_env: dict[str, str] = field(default_factory=dict)  # flag -> the PET_* variable it came from

    def get(self, *names: str) -> str | None:
        for flag, value in self.torchrun:
            if flag in names:
                return value
        return None

    def origin(self, flag: str) -> str:
        """Where a flag's value came from, for a message: the flag, or its PET_* variable."""
        return self.from_env.get(flag, flag)

    def drop(self, *names: str) -> None:
        self.torchrun = [(f, v) for f, v in self.torchrun if f not in names]


def parse(argv: list[str], environ: Mapping[str, str] | None = None, script: bool = True) -> LaunchArgs:
    """The command line, with torchrun's PET_* variables (from `environ`, by default
    os.environ) as defaults for the flags it lacks. `script` False: a command that runs
    none (`neuronabox controller`), which refuses one."""
    out = LaunchArgs()
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("-h", "--help"):
            out.help = True
            i += 1
            continue
        if tok == "--":
            out.script = argv[i + 1 :]
            break
        if not tok.startswith("-"):
            out.script = argv[i:]
            break
        flag, eq, value = _split(tok)
        if flag in REFUSED:
            raise UsageError(REFUSED[flag])
        if flag in OUR_SWITCHES:
            out.switches.add(flag)
        elif flag in TORCHRUN_SWITCHES:
            out.torchrun.append((flag, None))
        else:
            name = flag if flag in OURS or flag in OURS_REPEATED else _torchrun_flag(flag)
            if not eq:
                i += 1
                if i >= len(argv):
                    raise UsageError(f"{flag} needs a value")
                value = argv[i]
            if name in OURS_REPEATED:
                out.repeated.setdefault(name, []).append(value)
            elif name in OURS:
                out.ours[name] = value
            else:
                out.torchrun.append((name, value))
        i += 1
    if out.help:
        return out
    if script and not out.script:
        raise UsageError("no training script given")
    if not script and out.script:
        raise UsageError(f"this command runs no script ({out.script[0]!r}): the real nodes' hosts run it")
    _pet_defaults(out, os.environ if environ is None else environ)
    return out


def _split(tok: str) -> tuple[str, str, str]:
    """(flag, "=" or "", value) of one token: `--flag=value`, `--flag`, and torchrun's
    short flags with the value attached (`-r3`, as argparse takes them)."""
    if tok[:2] in ("-r", "-t") and len(tok) > 2 and tok[2] != "=":
        return tok[:2], "=", tok[2:]
    return tok.partition("=")


def _torchrun_flag(flag: str) -> str:
    """A torchrun flag that takes a value, as passed on (dashes), or UsageError naming
    the nearest flag there is: a typo, an abbreviation, a flag of another torch."""
    name = flag.replace("_", "-") if flag.startswith("--") else flag
    if name in TORCHRUN_FLAGS:
        return name
    known = sorted(TORCHRUN_FLAGS | TORCHRUN_SWITCHES | OURS | OURS_REPEATED | OUR_SWITCHES)
    near = [f for f in known if f.startswith(name)] or difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    raise UsageError(f"unknown flag {flag}: neither torchrun's nor neuronabox's{hint}")


def _pet_defaults(out: LaunchArgs, environ: Mapping[str, str]) -> None:
    given = {_CANONICAL.get(f, f) for f, _ in out.torchrun}
    for var, flag in PET_FLAGS.items():
        value = environ.get(var, "").strip()
        if value and flag not in given:
            out.torchrun.append((flag, value))
            out.from_env[flag] = var
    for var, flag in {**PET_SWITCHES, "PET_STANDALONE": "--standalone"}.items():
        value = environ.get(var, "").strip()
        if not value:
            continue
        try:
            on = int(value) != 0
        except ValueError:
            raise UsageError(f"{var} is 0 or 1, got {value!r}") from None
        if on and flag == "--standalone":
            raise UsageError(f"{var}={value}: {REFUSED[flag]}")
        if on and flag not in given:
            out.torchrun.append((flag, None))
            out.from_env[flag] = var


def without_pet(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the PET_* variables the launcher reads: torchrun would take them
    over the flags the launcher gives it."""
    return {k: v for k, v in env.items() if k not in PET_VARS}


def port_number(args: LaunchArgs, flag: str, raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise UsageError(f"{args.origin(flag)} must be a port number (1..65535), got {raw!r}")
    return port


def master_endpoint(args: LaunchArgs) -> tuple[str | None, str | None]:
    """(address, port) of the run's store as given. torchrun's static rendezvous takes
    --rdzv-endpoint HOST:PORT over --master-addr/--master-port when both are given."""
    endpoint = (args.get("--rdzv-endpoint") or "").strip()
    if not endpoint:
        return args.get("--master-addr"), args.get("--master-port")
    if endpoint.startswith("[") and endpoint.endswith("]"):
        host, port = endpoint, ""
    else:
        host, _, port = endpoint.rpartition(":")
    host = host[1:-1] if len(host) > 1 and host[0] == "[" and host[-1] == "]" else host
    if not host or not port:
        raise UsageError(
            f"{args.origin('--rdzv-endpoint')} takes HOST:PORT for the static rendezvous, got {endpoint!r}"
        )
    return host, port


def int_flag(args: LaunchArgs, names: tuple[str, ...], default: int) -> int:
    raw = args.get(*names)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{args.origin(names[0])} must be a fixed whole number, got {raw!r}") from None
    if value < 1:
        raise UsageError(f"{args.origin(names[0])} must be at least 1, got {value}")
    return value


def index_list(flag: str, raw: str, count: int, noun: str) -> list[int]:
    """A comma list of indices below `count` (`--real-nodes 0,2`, `--real-ranks 1,5`)."""
    try:
        out = sorted({int(x) for x in raw.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"{flag} takes a comma list of {noun} indices, got {raw!r}") from None
    if not out:
        raise UsageError(f"{flag} names no {noun}")
    bad = [i for i in out if not 0 <= i < count]
    if bad:
        raise UsageError(
            f"{flag} names {noun} {bad[0]}, outside the emulated world of {count} {noun}s (0..{count - 1})"
        )
    return out
