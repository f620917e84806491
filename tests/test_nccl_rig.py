"""The NCCL rig: the wheel's unmodified libnccl, run here on the rig's CUDA driver.

What is real: every byte of libnccl.so.2 (checked against the wheel's RECORD), so all of
NCCL's host code (bootstrap, topology, connection setup, the proxy thread, the Socket net)
and the bytes it puts on loopback. What is emulated: the CUDA driver and NVML
(nccl_patch/rig/), and NCCL's kernels, which the rig's driver runs as CPU code stepping
NCCL's own connection FIFOs. Each case's output is checked exactly against what the inputs
predict, on every rank.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RIG = ROOT / "scripts" / "nccl_rig.py"
RIG_DIR = ROOT / "nccl_patch" / "build" / "rig"
COLLS = ("allreduce", "allgather", "reduce_scatter", "broadcast")
SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB to 16 MiB, the script's default ladder


def run_rig(*argv: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RIG), *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)  # fmt: skip


def wheel_record_hash() -> tuple[Path, str]:
    """libnccl.so.2's path and its hash from the wheel's RECORD, read here without the project's code."""
    import nvidia.nccl

    site = Path(nvidia.nccl.__path__[0]).parents[1]
    records = list(site.glob("nvidia_nccl_cu12-*.dist-info/RECORD"))
    assert len(records) == 1, records
    with open(records[0], newline="") as f:
        for path, digest, _size in csv.reader(f):
            if path.endswith("nccl/lib/libnccl.so.2"):
                algo, value = digest.split("=", 1)
                assert algo == "sha256"
                return site / path, value
    raise AssertionError("the wheel's RECORD lists no libnccl.so.2")


def sha256_record_form(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


# Two ranks climb the whole ladder (16 MiB takes many chunks and FIFO turns); four stop
# at 1 MiB, which still spans several chunks per rank, for a third of the time.
@pytest.mark.parametrize("ranks, top", [(2, 16 << 20), (4, 1 << 20)])
def test_every_collective_dtype_and_size_is_exact_on_the_real_libnccl(ranks: int, top: int) -> None:
    proc = run_rig("--ranks", str(ranks), "--sizes", f"1K-{top >> 10}K")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert f"NCCL 2.28.9 (as ncclGetVersion reports), {ranks} ranks" in out
    cases = re.findall(r"^(\w+)\s+(\w+)\s+(\S+)\s+(\d+) B\s+[\d.]+ ms\s+(.+)$", out, re.M)
    expected = {(c, d, o, str(s)) for c in COLLS for d in ("float32", "float16", "bfloat16")
                for o in (("sum", "max", "min") if d == "float32" else ("sum",)) if c in ("allreduce", "reduce_scatter")
                for s in SIZES if s <= top}  # fmt: skip
    expected |= {(c, d, "-", str(s)) for c in ("allgather", "broadcast") for d in ("float32", "float16", "bfloat16")
                 for s in SIZES if s <= top}  # fmt: skip
    assert {case[:4] for case in cases} == expected
    assert all(case[4] == "ok" for case in cases), [c for c in cases if c[4] != "ok"]
    assert f"{len(expected)} cases, 0 wrong" in out


def test_the_library_that_ran_is_the_wheels_file_unmodified_and_the_driver_is_the_rigs() -> None:
    proc = run_rig("--ranks", "2", "--sizes", "1K", "--colls", "allreduce", "--dtypes", "float32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = re.findall(r"^rank (\d) loaded libcuda\.so\.1 from (\S+), libnccl\.so\.2 from (\S+)$", proc.stdout, re.M)
    assert [r for r, _, _ in loaded] == ["0", "1"]
    lib, want = wheel_record_hash()
    for _, driver, nccl in loaded:
        assert Path(driver) == RIG_DIR / "libcuda.so.1"
        assert Path(nccl).resolve() == lib.resolve()
    assert sha256_record_form(lib) == want


def test_a_rank_that_never_joins_is_named_with_its_collective_within_the_bound() -> None:
    # The bound is the script's own --timeout (300 s by default): the run must end well before
    # it, on the 6 s case timeout, or this call's limit fails the test. Both ranks are stuck in
    # the same collective, and whichever watchdog fires first, the other is heard too.
    try:
        proc = run_rig("--ranks", "2", "--sizes", "1K", "--colls", "allreduce", "--dtypes", "float32",
                       "--stall-rank", "1", "--stall-at", "1", "--case-timeout", "6", timeout=100)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("a stalled rank kept the run going past 100 s: the case timeout did not end it")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "rank 1 is stuck in allreduce float32 max 1024 B" in proc.stderr
    assert "rank 0 is stuck in allreduce float32 max 1024 B" in proc.stderr
    assert "1 cases, 0 wrong" in proc.stdout  # the case before the stall ran and was right


def test_a_work_item_the_rig_does_not_run_ends_the_run_with_a_line_naming_it() -> None:
    """NCCL's tree (pinned here) makes NCCL hand the kernel a TREE work item: refused, named."""
    proc = run_rig("--ranks", "2", "--algo", "tree", "--sizes", "1K", "--colls", "allreduce", "--dtypes", "float32",
                   timeout=120)  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert re.search(r"nbx-rig\[\d+\]: kernel failed on stream \d+: rig kernel: AllReduce Sum f32 TREE SIMPLE is not "
                     r"implemented \(funcId \d+\)", proc.stderr), proc.stderr  # fmt: skip
    assert "0 cases, 0 wrong" in proc.stdout


@pytest.mark.parametrize(("argv", "cause"), [
    (["--ranks", "9"], "--ranks is 2 to 8, got 9"),
    (["--dtypes", "float64"], "not run by the rig: float64"),
    (["--sizes", "12Q"], "--sizes"),
])  # fmt: skip
def test_bad_input_gets_one_line_and_exit_2(argv: list[str], cause: str) -> None:
    proc = run_rig(*argv, timeout=60)
    assert proc.returncode == 2
    assert cause in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


DRIVER_PROBE = textwrap.dedent("""
    import ctypes, sys
    cuda = ctypes.CDLL(sys.argv[1])
    fn, status = ctypes.c_void_p(), ctypes.c_int()
    get = cuda.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                    ctypes.POINTER(ctypes.c_int)]
    print("unknown", get(b"cuNoSuchEntryPoint", ctypes.byref(fn), 12090, 0, ctypes.byref(status)), status.value)
    print("known", get(b"cuArrayCreate", ctypes.byref(fn), 12090, 0, ctypes.byref(status)), status.value)
    print("call", ctypes.CFUNCTYPE(ctypes.c_int)(fn.value)(), flush=True)
    # An unknown kernel: launched, it fails the stream, and the line names it.
    for name in ("cuModuleLoadData", "cuModuleGetFunction", "cuStreamCreate", "cuLaunchKernel", "cuStreamSynchronize"):
        assert get(name.encode(), ctypes.byref(fn), 12090, 0, ctypes.byref(status)) == 0, name
    P = ctypes.c_void_p
    def entry(name, *types):
        get(name.encode(), ctypes.byref(fn), 12090, 0, ctypes.byref(status))
        return ctypes.CFUNCTYPE(ctypes.c_int, *types)(fn.value)
    module, function, stream = P(), P(), P()
    entry("cuModuleLoadData", ctypes.POINTER(P), P)(ctypes.byref(module), None)
    entry("cuModuleGetFunction", ctypes.POINTER(P), P, ctypes.c_char_p)(ctypes.byref(function), module,
                                                                       b"_Z17notAnNcclKernelv")
    entry("cuStreamCreate", ctypes.POINTER(P), ctypes.c_uint)(ctypes.byref(stream), 0)
    args = ctypes.create_string_buffer(64)
    size = ctypes.c_size_t(64)
    extra = (P * 5)(1, ctypes.cast(args, P), 2, ctypes.cast(ctypes.pointer(size), P), 0)
    launch = entry("cuLaunchKernel", P, *([ctypes.c_uint] * 7), P, P, P)
    print("launch", launch(function, 1, 1, 1, 32, 1, 1, 0, stream, None, extra))
    print("sync", entry("cuStreamSynchronize", P)(stream), flush=True)
""")


def test_what_the_driver_does_not_implement_fails_with_a_line_naming_it() -> None:
    proc = subprocess.run([sys.executable, "-c", DRIVER_PROBE, str(RIG_DIR / "libcuda.so.1")], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["unknown"] == "500 1"  # CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    assert lines["known"] == "0 0"
    assert lines["call"] == "801"  # CUDA_ERROR_NOT_SUPPORTED
    assert "cuArrayCreate is not implemented by the rig's CUDA driver" in proc.stderr
    assert lines["launch"] == "0" and lines["sync"] == "719"  # CUDA_ERROR_LAUNCH_FAILED, as a faulting kernel
    assert re.search(r"kernel failed on stream \d+: .*_Z17notAnNcclKernelv", proc.stderr), proc.stderr


MD2_VECTORS = {"": "8350e5a3e24c153df2275c9f80692773", "abc": "da853b0d3f88d99b30283a69e6ded6bb",
               "message digest": "ab4f496bfb2a530b219ff33031fe06b0",
               "12345678901234567890123456789012345678901234567890123456789012345678901234567890":
               "d5976f79d83d3a0dc9806c3c66f3efd8"}  # RFC 1319, appendix A.5  # fmt: skip


def test_the_integrity_digest_is_built_on_md2_as_rfc_1319_gives_it(tmp_path: Path) -> None:
    """The runtime refuses a driver whose integrity digest differs from its own (NCCL starting at
    all proves the whole digest); this pins the hash under it to RFC 1319's test vectors."""
    program = tmp_path / "md2.c"
    program.write_text(textwrap.dedent("""
        #include "rig_integrity.c"
        #include <stdio.h>
        int main(int argc, char **argv) {
          for (int i = 1; i < argc; i++) {
            struct md2 m;
            memset(&m, 0, sizeof(m));
            md2Update(&m, argv[i], strlen(argv[i]), 0);
            unsigned char d[16];
            md2Final(&m, d);
            for (int j = 0; j < 16; j++) printf("%02x", d[j]);
            printf("\\n");
          }
          return 0;
        }
    """))
    exe = tmp_path / "md2"
    subprocess.run(["gcc", "-std=gnu11", "-O1", "-I", str(ROOT / "nccl_patch" / "rig"), "-o", str(exe), str(program),
                    "-lpthread"], check=True, timeout=60)  # fmt: skip
    texts = list(MD2_VECTORS)
    out = subprocess.run([str(exe), *texts], capture_output=True, text=True, check=True, timeout=10).stdout.split()
    assert dict(zip(texts, out, strict=True)) == MD2_VECTORS


def test_the_driver_exports_only_the_driver_api() -> None:
    out = subprocess.run(["nm", "-D", "--defined-only", str(RIG_DIR / "libcuda.so.1")], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    exported = {line.split()[-1] for line in out.splitlines()}
    assert {"cuGetProcAddress_v2", "cuGetExportTable", "cuInit", "cuDriverGetVersion"} <= exported
    assert all(name.startswith("cu") for name in exported), sorted(n for n in exported if not n.startswith("cu"))


CUDA_H = Path("/usr/local/cuda/include/cuda.h")


@pytest.mark.skipif(not CUDA_H.is_file(), reason="no CUDA toolkit header on this machine to compare with")
def test_the_rigs_restated_driver_api_agrees_with_nvidias_cuda_h(tmp_path: Path) -> None:
    """rig_cuda.h restates the values and layouts the driver answers with; NVIDIA's header is the
    reference. Each side is compiled on its own (their names clash) and prints the same report."""
    ours = (ROOT / "nccl_patch" / "rig" / "rig_cuda.h").read_text()
    names = re.findall(r"^\s+((?:CUDA_|CU_)[A-Z0-9_]+) = ", ours, re.M)
    assert len(names) > 60
    report = "\n".join(f'  printf("{n} %lld\\n", (long long){n});' for n in names)
    layout = textwrap.dedent("""
        printf("CUlaunchConfig %zu %zu %zu\\n", sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream),
               offsetof(CUlaunchConfig, numAttrs));
        printf("CUlaunchAttribute %zu %zu\\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value));
        printf("CUuuid %zu\\n", sizeof(CUuuid));
        printf("LAUNCH_PARAM %p %p %p\\n", %s, %s, %s);
    """)
    outputs = []
    for header, params in ((str(CUDA_H), ("CU_LAUNCH_PARAM_END", "CU_LAUNCH_PARAM_BUFFER_POINTER",
                                           "CU_LAUNCH_PARAM_BUFFER_SIZE")),
                           (str(ROOT / "nccl_patch" / "rig" / "rig_cuda.h"),
                            ("NBX_CU_LAUNCH_PARAM_END", "NBX_CU_LAUNCH_PARAM_BUFFER_POINTER",
                             "NBX_CU_LAUNCH_PARAM_BUFFER_SIZE"))):  # fmt: skip
        src = tmp_path / "report.c"
        body = report + layout.replace("%s, %s, %s", ", ".join(params))
        src.write_text(f'#include <stddef.h>\n#include <stdio.h>\n#include "{header}"\nint main(void) {{\n{body}\n}}\n')
        exe = tmp_path / "report"
        subprocess.run(["gcc", "-std=gnu11", "-o", str(exe), str(src)], check=True, timeout=60)
        outputs.append(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    assert outputs[0] == outputs[1]


STREAM_PROBE = textwrap.dedent("""
    import ctypes, sys, threading, time
    cuda = ctypes.CDLL(sys.argv[1])
    P = ctypes.c_void_p
    fn, status = P(), ctypes.c_int()
    get = cuda.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(P), ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    def entry(name, *types):
        assert get(name.encode(), ctypes.byref(fn), 12090, 0, ctypes.byref(status)) == 0, name
        return ctypes.CFUNCTYPE(ctypes.c_int, *types)(fn.value)
    HOSTFN = ctypes.CFUNCTYPE(None, P)
    create = entry("cuStreamCreate", ctypes.POINTER(P), ctypes.c_uint)
    host = entry("cuLaunchHostFunc", P, HOSTFN, P)
    alloc = entry("cuMemAlloc", ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
    dtoh = entry("cuMemcpyDtoH", P, ctypes.c_uint64, ctypes.c_size_t)
    event_create = entry("cuEventCreate", ctypes.POINTER(P), ctypes.c_uint)
    record = entry("cuEventRecord", P, P)
    query = entry("cuEventQuery", P)
    destroy_stream = entry("cuStreamDestroy", P)
    destroy_event = entry("cuEventDestroy", P)
    ctx_sync = entry("cuCtxSynchronize")

    buf = ctypes.c_uint64()
    alloc(ctypes.byref(buf), 8)
    @HOSTFN
    def slow_write(_):  # work on the blocking stream; if the legacy copy did not wait, it would read 0
        time.sleep(0.3)
        ctypes.c_uint32.from_address(buf.value).value = 7
    blocking = P()
    create(ctypes.byref(blocking), 0)
    host(blocking, slow_write, None)
    got = ctypes.c_uint32()
    dtoh(ctypes.byref(got), buf.value, 4)  # the legacy stream waits for the blocking stream's work
    print("legacy_after_blocking", got.value)

    # Destroying a stream and an event with work still queued returns at once: the host
    # function below holds the stream until the destroys have returned, then lets it go.
    release, ran = threading.Event(), threading.Event()
    @HOSTFN
    def held(_):
        release.wait(30)
        ran.set()
    s, e = P(), P()
    create(ctypes.byref(s), 1)  # non-blocking
    event_create(ctypes.byref(e), 0)
    host(s, held, None)
    record(e, s)
    print("pending", query(e))  # CUDA_ERROR_NOT_READY
    destroy_stream(s)
    destroy_event(e)
    print("destroy_returned_at_once", not ran.is_set())
    release.set()
    print("ctx_sync", ctx_sync(), ran.is_set(), flush=True)
""")


def test_streams_and_events_keep_the_drivers_ordering_and_lifetimes() -> None:
    proc = subprocess.run([sys.executable, "-c", STREAM_PROBE, str(RIG_DIR / "libcuda.so.1")], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines == {"legacy_after_blocking": "7", "pending": "600", "destroy_returned_at_once": "True",
                     "ctx_sync": "0 True"}  # fmt: skip
