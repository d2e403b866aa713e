#!/usr/bin/env python3
"""Instructions per answer of a `decision` criterion case, counted by callgrind.

Criterion's times move by 10-30 % on a shared 2-vCPU machine, even between the
halves of an A/B pair; an instruction count does not. This runs the bench
executable under callgrind for one second of `--profile-time` and divides the
inclusive instructions (Ir) of every call of `answer_observing` (what
`bench_answer` calls once per iteration) by the number of those calls.

    cargo bench --bench decision --no-run
    python3 benches/ir_per_answer.py target/release/deps/decision-<hash> \
        "fixture in parts/denied, the whole"

Needs valgrind (Debian: apt-get install valgrind).
"""
import os
import re
import subprocess
import sys
import tempfile

FUNCTION = "answer::answer_observing"


def per_call(out_file: str) -> tuple[int, float]:
    """Calls of FUNCTION and inclusive Ir per call, from a callgrind file."""
    names: dict[str, str] = {}
    callee = ""
    calls = inclusive = 0
    lines = open(out_file, encoding="utf-8", errors="replace").read().split("\n")
    for at, line in enumerate(lines):
        named = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
        if named:
            if named.group(2):
                names[named.group(1)] = named.group(2)
            if line.startswith("cfn="):
                callee = names.get(named.group(1), "")
            continue
        counted = re.match(r"calls=(\d+)", line)
        if counted and FUNCTION in callee:
            cost = lines[at + 1].split()
            calls += int(counted.group(1))
            inclusive += int(cost[1]) if len(cost) > 1 and cost[1].isdigit() else 0
    return calls, inclusive / max(calls, 1)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    bench, case = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", bench,
             "--bench", case, "--profile-time", "1"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        calls, ir = per_call(out)
    if calls == 0:
        sys.exit(f"no call of {FUNCTION}: does the case name one criterion case?")
    print(f"{case}: {calls} answers, {ir:,.0f} instructions per answer")


if __name__ == "__main__":
    main()
