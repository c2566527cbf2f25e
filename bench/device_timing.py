"""What the device benchmarks share: result lines printed and appended to an --out file as they are
produced (sdpa_ceiling.py, projection_gemms.py, olmo_core_anchor.py), and a call's mean time after one
warm-up call (the first two)."""
import time


def emit(out, line):
    """Prints line (flushed) and appends it to the file out, when given."""
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def timed(fn, reps, sync):
    """Mean seconds of fn() over reps calls, after one warm-up call (graph builds, autotuning, cuBLAS's
    heuristics); sync() waits for the device's queued work."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps
