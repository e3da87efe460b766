"""dataflow._malloc.keep_freed_memory: freed large blocks are reused instead of faulting in
again. Each case runs in a fresh interpreter, since the setting is process-wide."""
import json
import subprocess
import sys
import textwrap

CHILD = """
import ctypes, json, resource
from dataflow._malloc import keep_freed_memory
applied = keep_freed_memory() if {tune} else None
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
SIZE, BLOCKS, ROUNDS = 300 * 1024, 4, 20

def round_():
    blocks = [libc.malloc(SIZE) for _ in range(BLOCKS)]
    for b in blocks:
        ctypes.memset(b, 1, SIZE)           # touch every page
    for b in blocks:
        libc.free(b)

round_(); round_()                          # warm up: the heap grows once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(ROUNDS):
    round_()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({{"applied": applied, "faults_per_round": faults / ROUNDS}}))
"""


def run(tune):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD.format(tune=tune))],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_blocks_are_reused_instead_of_faulting_in_again():
    # 4 blocks of 300 KiB are 300 pages; glibc's defaults return them to the kernel after each
    # round (its trim threshold follows the largest freed block), so they fault in again
    default, kept = run(False), run(True)
    assert default["faults_per_round"] > 100, default
    assert kept["applied"] is True
    assert kept["faults_per_round"] < 10, kept
