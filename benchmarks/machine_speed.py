"""How fast this machine's CPU is right now: the CPU seconds of one fixed pure-Python workload
(the sum of i*i below 6 million), each repeat a fresh interpreter, median and spread.

Why: the test suite's duration on this 2-core VM follows the host's speed, not only its own
work. In session 24 the same commit's tests cost 1,641 to 1,981 core-s, every kind of process
alike (Ray workers, vLLM forks, Ray's agents), and this probe read 0.38 s at one suite's start
and 0.45-0.61 s at the next ones' (docs/BENCHMARKS.md, "Test-suite cost, session 24"). Run it
before and after a suite run and compare runs only at a like speed.

    python -m benchmarks.machine_speed [REPEATS]     # prints: median s [min-max], REPEATS runs
"""

from __future__ import annotations

import statistics
import subprocess
import sys

WORKLOAD = ("import time; t = time.process_time(); sum(i * i for i in range(6 * 10**6)); "
            "print(time.process_time() - t)")


def probe(repeats: int) -> list[float]:
    """The workload's CPU seconds in each of `repeats` fresh interpreters (argv list)."""
    return [float(subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True,
                                 text=True, check=True, timeout=120).stdout)
            for _ in range(repeats)]


def main(argv: list[str]) -> int:
    repeats = int(argv[0]) if argv else 5
    times = probe(repeats)
    print(f"{statistics.median(times):.3f} s [{min(times):.3f}-{max(times):.3f}], "
          f"{repeats} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
