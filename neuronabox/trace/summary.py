"""The end-of-run summary: world, real ranks, collectives by kind, iteration time."""

from __future__ import annotations

from neuronabox.trace.busbw import bandwidths


def fmt_bytes(n: float) -> str:
    """A size as people read it: 640 B, 907.7 KiB, 1.8 MiB (the summary's and the report's)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_summary(reply, header: dict, footer: dict) -> str:
    """The summary from the controller's final status and the trace's header and footer."""
    inject = footer.get("inject", header.get("inject", []))
    lines = [
        "NeuronaBox summary",
        f"  world size      {reply.world_size}",
        f"  real ranks      {', '.join(map(str, reply.real_ranks))}",
        f"  boundary msgs   {reply.boundary_messages}   controller CPU {reply.cpu_s:.2f} s",
        f"  network         {header.get('delay_model', '?')} on {header.get('topology', '?')}"
        f" ({header.get('boundary', 'modeled')} boundary)" + "".join(f"  +{s}" for s in inject),
    ]
    if not reply.kinds:  # a script that ended before its first collective
        lines.append("  collectives     none")
    else:
        lines.append(
            "  collectives     kind         count        bytes   time on real rank (mean)   model (mean)"
            "   = model + emulator lag + real rank's own    algbw    busbw (GB/s, nccl-tests' definitions)"
        )
    for k in reply.kinds:
        mean = k.seconds / k.count if k.count else 0.0
        model = k.predicted_s / k.count if k.count else 0.0
        alg, bus = bandwidths(k.kind, k.bytes / k.count if k.count else 0, mean, reply.world_size)
        # The miss split: the controller's holding (each instance's latest send, past its
        # release and its inputs: a lower bound) and the rest, the real rank's own work.
        if k.lagged:
            lag = k.lag_s / k.lagged
            split = f"{lag * 1e3:9.3f} ms {(mean - model - lag) * 1e3:10.3f} ms"
        else:
            split = f"{'-':>12} {'-':>13}"
        lines.append(
            f"                  {k.kind:<10} {k.count:>7} {fmt_bytes(k.bytes):>12}   {mean * 1e3:9.3f} ms"
            f"               {model * 1e3:9.3f} ms   {split}        {alg:7.3f}  {bus:7.3f}"
        )
    rel = footer.get("release", {})
    if rel.get("timed_releases"):
        lines.append(
            f"  release timing  {rel['timed_releases']} timed messages, late by {rel['median_us']:.0f} us median,"
            f" {rel['p99_us']:.0f} us p99"
        )
    work = local_work_line(footer.get("local_work") or {})
    if work:
        lines.append(f"  local work      {work}")
    if reply.steps:
        lines.append(f"  optimizer steps {reply.steps}   iteration time {reply.iteration_s * 1e3:.2f} ms")
        if len(reply.real_ranks) < reply.world_size:
            lines.append(f"  skew            {skew_line(header.get('skew', 'none'))}")
    elif header.get("observer", True):
        lines.append("  optimizer steps not observed (the observer saw no optimizer.step()); iteration time unknown")
    else:
        lines.append("  optimizer steps not observed (no observer); iteration time unknown")
    held = observer_line(footer.get("observer_held") or {}, reply.steps, reply.iteration_s)
    if held:
        lines.append(f"  observer        {held}")
    return "\n".join(lines)


def local_work_line(lw: dict) -> str:
    """What the emulated ranks spent of their own per message and reduced byte, and whence."""
    source = lw.get("source")
    if source not in ("measured", "topology", "recorded"):
        return ""
    gbps, msg_us = lw.get("reduce_gbps"), lw.get("message_us", 0.0)
    if source == "measured" and not msg_us and not gbps:
        return f"none charged: {lw.get('samples', 0)} ring collectives measured, too few to fit"
    what = f"{msg_us:.1f} us per message, " + (f"reduce at {gbps:.2f} GB/s" if gbps else "reduce free")
    if source == "measured":
        return f"{what}: the real rank's own, measured ({lw.get('samples', 0)} samples; --local-work topology: none)"
    return f"{what}: the topology's" if source == "topology" else f"{what}: the live run's, recorded"


def skew_line(skew: str) -> str:
    """How the emulated ranks entered collectives: the reading an iteration time needs (a
    real job waits for its slowest rank; on time, the emulated ranks never are)."""
    if skew == "none":
        return (
            "none: the emulated ranks entered every collective with the real rank, so no step waited for "
            "a late one (the default, --skew auto, draws their lateness from the real rank's own variation)"
        )
    if skew == "auto":
        return "auto: the emulated ranks entered late by draws from the real rank's own variation, per place"
    return f"{skew}: the emulated ranks entered late by draws from its delays"


def observer_line(held: dict, steps: int, iteration_s: float) -> str:
    """What the observer's own work (its flight-recorder dumps) cost the real rank it cost
    most: time an all-real run never pays, so a user can weigh it against the iteration."""
    if not held:
        return ""
    rank, worst = max(held.items(), key=lambda kv: (kv[1].get("seconds", 0.0), kv[0]))
    times, seconds = int(worst.get("times", 0)), float(worst.get("seconds", 0.0))
    what = f"held real rank {rank}'s core {times} times, {seconds * 1e3:.1f} ms in all (flight-recorder dumps)"
    if steps and iteration_s > 0:
        per_step = seconds / steps
        return f"{what}: {per_step * 1e3:.3f} ms a step, {per_step / iteration_s:.1%} of the iteration time"
    return what
