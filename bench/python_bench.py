"""plan_many from Python: plans per second on one core, and where the time goes.

    PYTHONPATH=build/python python3 bench/python_bench.py [N]

Target (issue 16): at least 100,000 plans per second. Times are CPU seconds of the calling thread
(time.thread_time), so other work on a shared machine does not count against it; wall time is
printed beside. The sweep varies micro-batch size, ZeRO stage, recompute and sequence length of
the embedded Llama-2-70B on 64 x H100 scenario.
"""

import copy
import sys
import time

import distplan
from distplan import _distplan


def sweep(n):
    base = distplan.default_scenario()
    out = []
    for i in range(n):
        s = copy.deepcopy(base)
        s["training"]["micro_batch_size"] = (1, 2, 4, 8)[i % 4]
        s["parallel"]["zero_stage"] = (0, 1, 2, 3)[(i // 4) % 4]
        s["parallel"]["recompute"] = ("none", "selective", "full")[(i // 16) % 3]
        s["training"]["seq_length"] = 1024 * (1 + (i // 48) % 8)
        out.append(s)
    return out


# The whole document, what a memory-and-time sweep needs, and the time alone.
PARTS = [None, ["memory", "time"], ["time"]]


def best_of(repeats, fn):
    best_cpu, best_wall = float("inf"), float("inf")
    for _ in range(repeats):
        c0, w0 = time.thread_time(), time.perf_counter()
        result = fn()
        c1, w1 = time.thread_time(), time.perf_counter()
        del result
        best_cpu, best_wall = min(best_cpu, c1 - c0), min(best_wall, w1 - w0)
    return best_cpu, best_wall


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    scenarios = sweep(n)
    distplan.plan_many(scenarios[:100])  # warm the key cache and the allocator
    for parts in PARTS:
        cpu, wall = best_of(3, lambda: distplan.plan_many(scenarios, parts))
        print(f"plan_many(parts={parts}): {n} plans in {cpu:.3f} s CPU ({wall:.3f} s wall): "
              f"{n / cpu:,.0f} plans/s on one core")
        phases = min((_distplan._plan_many_phases(scenarios, parts) for _ in range(3)),
                     key=lambda p: sum(p.values()))
        total = sum(phases.values())
        print("  where the time goes (CPU per plan, phases run one after another):")
        for name, seconds in phases.items():
            print(f"    {name:<15} {seconds / n * 1e6:8.2f} us  {100 * seconds / total:5.1f} %")
        print(f"    {'total':<15} {total / n * 1e6:8.2f} us")


if __name__ == "__main__":
    main()
