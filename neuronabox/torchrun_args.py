"""Split a `neuronabox torchrun` command line into torchrun's flags, ours, and the script."""

from __future__ import annotations

from dataclasses import dataclass, field

from neuronabox.errors import NeuronaBoxError

# torchrun flags that take no value; every other flag takes one.
TORCHRUN_SWITCHES = {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path"}
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
}
OURS_REPEATED = {"--inject"}  # may be given several times
OUR_SWITCHES = {"--no-observer"}
REFUSED = {
    "--standalone": "--standalone runs a single node; give --nnodes for the emulated world",
    "--node-rank": "the launcher sets --node-rank for each real node; use --real-nodes",
    "--node_rank": "the launcher sets --node-rank for each real node; use --real-nodes",
}


class UsageError(NeuronaBoxError, ValueError):
    """Bad input on the command line: one line, exit status 2."""


@dataclass
class LaunchArgs:
    torchrun: list[tuple[str, str | None]] = field(default_factory=list)  # flags passed through
    ours: dict[str, str] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)
    repeated: dict[str, list[str]] = field(default_factory=dict)
    script: list[str] = field(default_factory=list)  # script (or module) and its arguments

    def get(self, *names: str) -> str | None:
        for flag, value in self.torchrun:
            if flag in names:
                return value
        return None

    def drop(self, *names: str) -> None:
        self.torchrun = [(f, v) for f, v in self.torchrun if f not in names]


def parse(argv: list[str]) -> LaunchArgs:
    out = LaunchArgs()
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            out.script = argv[i + 1 :]
            break
        if not tok.startswith("-"):
            out.script = argv[i:]
            break
        flag, eq, value = tok.partition("=")
        if flag in REFUSED:
            raise UsageError(REFUSED[flag])
        if flag in OUR_SWITCHES:
            out.switches.add(flag)
        elif flag in TORCHRUN_SWITCHES:
            out.torchrun.append((flag, None))
        else:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise UsageError(f"{flag} needs a value")
                value = argv[i]
            if flag in OURS_REPEATED:
                out.repeated.setdefault(flag, []).append(value)
            elif flag in OURS:
                out.ours[flag] = value
            else:
                out.torchrun.append((flag.replace("_", "-") if flag.startswith("--") else flag, value))
        i += 1
    if not out.script:
        raise UsageError("no training script given")
    return out


def int_flag(args: LaunchArgs, names: tuple[str, ...], default: int) -> int:
    raw = args.get(*names)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{names[0]} must be a fixed whole number, got {raw!r}") from None
    if value < 1:
        raise UsageError(f"{names[0]} must be at least 1, got {value}")
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
