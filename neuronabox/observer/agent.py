"""The observer thread inside a real rank.

It tells the controller what the wire does not carry: the element count and
dtype of a collective (read from PyTorch's flight recorder, which
ProcessGroupGloo fills when TORCH_FR_BUFFER_SIZE is set), the members of each
process group the script creates (so the controller can stand in for the
emulated members), receives from any source (Gloo announces nothing for them:
an emulated sender must speak first), the times of optimizer steps, and when its
own work held the rank's core (a flight-recorder dump). It never edits the user's
script; without it the emulation still runs, on the default group only.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import socket
import sys
import threading
import time

from . import calls, sizes
from .clock import clock_id
from .steps import on_step

_lock = threading.Lock()
_sock: socket.socket | None = None
_early: list[bytes] = []  # messages from before the link is up
_notes_lock = threading.Lock()
_notes: socket.socket | None = None  # the note link: the controller's core reads it itself
NOTE_LINE_MAX = 400  # bytes: the core takes lines of up to 512 (kNoteLineMax)


def _send(msg: dict) -> None:
    data = json.dumps(msg).encode() + b"\n"
    with _lock:
        if _sock is None:
            _early.append(data)
            return
        try:
            _sock.sendall(data)
        except OSError:
            pass


def _send_note(group: str, tag: int, op: str, numel: int, dtype: str) -> None:
    """A ring's size as its call enters, on the note link: one tab-separated line, which the
    controller's core reads and acts on with no Python turn (controller/native/note_line.h);
    on the observer link, as JSON, until the note link is up or for a name it cannot carry."""
    global _notes
    line = f"{group}\t{tag}\t{op}\t{numel}\t{dtype}\n".encode()
    if _notes is not None and len(line) <= NOTE_LINE_MAX and line.count(b"\t") == 4 and line.count(b"\n") == 1:
        with _notes_lock:
            link = _notes
            try:
                if link is not None:
                    link.sendall(line)
                    return
            except OSError:  # the controller closed it: the observer link from now on
                _notes = None
    _send({"meta": group, "tag": tag, "kind": op, "numel": numel, "dtype": dtype})


C10D = "torch.distributed.distributed_c10d"
DDP = "torch.nn.parallel.distributed"
MIRROR = os.environ.get("NEURONABOX_DATA") == "mirror"
INPUT_WAIT_S = 60.0  # how long a question for an input waits for its call to enter
DTYPES_EVERY_S = 1.0  # the dtypes of the collectives issued are reported at least this often
# A report dumps the flight recorder, about 4 us of the real rank's core per entry (0.27 ms for
# 64), which an all-real run does not pay: a report comes only once the steps since the last one,
# at the collectives per step it counted, would fill this share of the recorder by the next step.
REPORT_FILL = 0.5
EAGER_STEPS = 8  # the first steps report each: a short run's trace has every dtype even if it ends with os._exit
FR_ENTRIES = int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0)
CLOCK = clock_id()  # the controller takes a hold's times only on its own clock
_dtypes_due = threading.Event()
_steps = [0]  # optimizer steps so far
_report_lock = threading.Lock()
_reported: dict[str, int] = {}  # group -> the last tag whose dtype went out


class _WrapOnLoad(importlib.abc.MetaPathFinder):
    """Wraps functions of the modules in `targets` as each loads, before any other
    module copies their names (torch.distributed's `import *`)."""

    def __init__(self, targets: dict) -> None:
        self.targets = targets

    def find_spec(self, name, path, target=None):
        wrap = self.targets.pop(name, None)
        if wrap is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.targets:
                sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            wrap(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


def _wrap(c10d) -> None:
    """Every group this rank joins is reported (name, global ranks in group order)
    before its backend publishes a record and waits for the other members' records."""
    helper = c10d._new_process_group_helper

    def reporting_helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *a, **k):
        if str(group_name) != "0" and int(os.environ["RANK"]) in global_ranks_in_group:  # a member
            _send({"group": str(group_name), "ranks": [int(r) for r in global_ranks_in_group]})
        return helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *a, **k)

    c10d._new_process_group_helper = reporting_helper
    # torch.distributed is loaded: the script can call init_process_group now, and the
    # controller's wait for this rank's record (the watchdog's) starts from here.
    _send({"loaded": "torch.distributed"})
    irecv = c10d.irecv

    def reporting_irecv(tensor, src=None, group=None, tag=0, group_src=None):
        if src is None and group_src is None:  # nothing on the wire says whom this waits for
            pg = group if group is not None else c10d._get_default_group()
            nbytes = tensor.numel() * tensor.element_size()
            _send({"anysource": c10d._get_process_group_name(pg), "tag": int(tag), "nbytes": nbytes})
        return irecv(tensor, src, group, tag, group_src)

    c10d.irecv = reporting_irecv  # recv() calls it too
    destroy = c10d.destroy_process_group

    def reporting_destroy(*a, **k):
        _report()  # the last steps' dtypes, while the controller still reads this rank
        return destroy(*a, **k)

    c10d.destroy_process_group = reporting_destroy
    calls.install(c10d, MIRROR)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "irecv", None) is irecv:  # torch.distributed already copied it
        dist.irecv = reporting_irecv
    if dist is not None and getattr(dist, "destroy_process_group", None) is destroy:
        dist.destroy_process_group = reporting_destroy


def _serve(host: str, port: int) -> None:
    global _sock
    s = socket.create_connection((host, port), timeout=30)
    # Replies are small and each one gates a collective: without this, Nagle holds a reply
    # until the controller's delayed ACK (40 ms) for the one before it.
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(None)
    # The first line: the run's secret, without which the controller drops the connection.
    secret = os.environ.get("NEURONABOX_OBSERVER_SECRET", "")
    hello = {"hello": 1, "rank": int(os.environ["RANK"]), "pid": os.getpid(), "secret": secret}
    hello = json.dumps(hello).encode() + b"\n"
    with _lock:
        s.sendall(hello + b"".join(_early))
        _early.clear()
        _sock = s
    _open_note_link(host, port, secret)
    on_step(_stepped)
    threading.Thread(target=_report_dtypes, name="neuronabox-dtypes", daemon=True).start()
    buf = b""
    waiting: list[tuple[dict, float]] = []  # input questions whose call has not entered yet
    while True:
        s.settimeout(0.005 if waiting else None)
        try:
            data = s.recv(65536)
        except TimeoutError:
            data = None
        if data == b"":
            return
        buf += data or b""
        *lines, buf = buf.split(b"\n")
        waiting += [(json.loads(line), time.monotonic() + INPUT_WAIT_S) for line in lines]
        still = []
        entries = functools.cache(_records)  # one dump per pass, and only if a question needs it
        for q, deadline in waiting:
            try:
                if "input" in q:
                    reply = calls.input_of(q, entries, deadline)
                elif q.get("kind") == "broadcast":
                    reply = calls.root_of(q, entries)
                else:
                    reply = calls.meta_of(q, entries)
            except Exception as exc:  # answer anyway: the controller falls back to the wire, or zeros
                reply = {"q": q.get("q"), "numel": None, "data": None, "error": str(exc)}
            if reply is None:
                still.append((q, deadline))
            else:
                _send(reply)
        waiting = still


def _open_note_link(host: str, port: int, secret: str) -> None:
    """The second connection, for notes alone (`_send_note`); without it they go as JSON
    (NEURONABOX_NOTE_LINK=0: always, each a Python turn of the controller's, a benchmark's
    reference)."""
    global _notes
    if os.environ.get("NEURONABOX_NOTE_LINK", "1") == "0":
        return
    try:
        n = socket.create_connection((host, port), timeout=30)
        n.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a note leads its call's frames
        hello = {"hello": 1, "rank": int(os.environ["RANK"]), "pid": os.getpid(), "secret": secret, "notes": 1}
        n.sendall(json.dumps(hello).encode() + b"\n")
        n.settimeout(None)
    except OSError:
        return
    _notes = n


def _records() -> list[dict]:
    start, cpu = time.monotonic(), time.thread_time()
    try:
        entries = calls.flight_records()
    except Exception:  # no recorder: the controller falls back to the wire
        return []
    _held(start, cpu)
    return entries


def _held(start: float, cpu: float) -> None:
    """Tell the controller this thread held the rank's core between `start` and now (a
    flight-recorder dump, which an all-real rank never pays), for the CPU time it used since
    `cpu` (this thread's clock): the emulator's own work, not the rank's variation, and
    --skew auto leaves it out of the gap it fell in. The window alone would overstate it:
    inside it the rank's own threads run whenever this one waits for the GIL."""
    _send({"held": [start, time.monotonic()], "cpu": time.thread_time() - cpu, "clock": CLOCK})


def _report_dtypes() -> None:
    """Each collective's dtype, from the flight recorder, on this thread, not the collectives':
    after each of the first EAGER_STEPS steps, then after the step that would otherwise let the
    recorder fill past REPORT_FILL, at least every DTYPES_EVERY_S, and when the script destroys
    a process group or exits (a script that leaves by os._exit loses the last steps' dtypes)."""
    per_step: float | None = None  # collectives per step, counted by the last report
    since = 0  # the step count then
    while True:
        timed_out = not _dtypes_due.wait(DTYPES_EVERY_S)
        _dtypes_due.clear()
        steps = _steps[0] - since
        eager = per_step is None or _steps[0] <= EAGER_STEPS
        if not timed_out and not eager and (steps + 1) * per_step <= FR_ENTRIES * REPORT_FILL:
            continue  # the next step's collectives still fit
        found = _report()
        if steps > 0 and found is not None:
            per_step = max(found / steps, 1.0)
            since += steps


def _report() -> int | None:
    """Send the dtypes of the collectives issued since the last report; how many (None: no recorder)."""
    with _report_lock:
        start, cpu = time.monotonic(), time.thread_time()
        try:
            entries = calls.flight_records()
            found = calls.dtypes_since(entries, _reported)
            wrong = sizes.check(entries)
        except Exception:  # no recorder (TORCH_FR_BUFFER_SIZE=0), or torch going down: dtypes stay unknown
            return None
        _held(start, cpu)
        for group in wrong:
            print(
                f"neuronabox observer: group {group!r}: a noted size disagrees with the flight recorder "
                "(a point-to-point call past ProcessGroup?); its sizes come from the recorder from now on",
                file=sys.stderr,
                flush=True,
            )
        if found:
            _send({"dtypes": found})
        return len(found)


def _report_at_exit() -> None:
    if _sock is not None:
        _report()


def _stepped(*_) -> None:
    _send({"step": 1, "t": time.time()})
    _steps[0] += 1
    _dtypes_due.set()


def start() -> None:
    targets = {
        C10D: _wrap,
        "torch.distributed": calls.hook_model_sync,
        DDP: functools.partial(calls.hook_ddp, mirror=MIRROR),
    }
    for name, wrap in list(targets.items()):
        if name in sys.modules:
            wrap(sys.modules[name])
            del targets[name]
    if targets:
        sys.meta_path.insert(0, _WrapOnLoad(targets))
    sizes.push = _send  # a DDP model's buckets
    sizes.note_out = _send_note  # a ring's size, as its call enters
    atexit.register(_report_at_exit)  # the last steps' dtypes, which the rule above may still hold
    host, port = os.environ["NEURONABOX_OBSERVER"].rsplit(":", 1)
    threading.Thread(target=_serve, args=(host, int(port)), name="neuronabox-observer", daemon=True).start()
