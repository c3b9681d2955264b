"""How far a Problem travels through zbsearch during one solve: the files its calls enter and how many
calls (each returns once) take it or its profile.

    python bench/trace_problem.py [REPO_ROOT]

Counted: with sys.setprofile on the calling thread, every Python-level call into a file of the zbsearch
package imported from REPO_ROOT (default: this checkout) whose parameters (`self` included; not *args or
**kwargs) hold the Problem passed to solve, or that problem's profile, by identity. Each instance runs
in a fresh process, twice, and says whether the two runs agree. Both instances are proven optimal before
CP-SAT runs, so their counts do not depend on the machine's speed. Only the public API is used
(load_profile, make_problems, solve), so the same script measures older layouts of the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

INSTANCES = [  # profile, memory limit, objective, placement
    ("profiles/zb-paper-1.5b-m24.json", "2p", "makespan", "linear"),
    ("profiles/h100.json", "2p", "makespan", "v"),
]
TIME_LIMIT = 10.0


def trace(root: str, index: int) -> dict[str, object]:
    """One traced solve of INSTANCES[index] in this process."""
    sys.path.insert(0, root)
    import zbsearch

    package = os.path.dirname(os.path.abspath(zbsearch.__file__)) + os.sep
    path, limit, objective, placement = INSTANCES[index]
    problem = zbsearch.make_problems(zbsearch.load_profile(os.path.join(root, path)), limit, objective,
                                     placement)[0]
    solve = zbsearch.solve  # loads the search before the trace starts
    # Older layouts took the time limit, workers and seed one by one; newer ones one SearchOptions.
    args = {"time_limit": TIME_LIMIT, "workers": 2, "seed": 0}
    given = (zbsearch.SearchOptions(**args),) if "SearchOptions" in zbsearch.__all__ else ()
    kwargs = {} if given else args
    followed = (problem, problem.profile)
    calls: Counter[str] = Counter()
    returns = 0
    open_frames: set[int] = set()

    def on_event(frame, event, arg) -> None:
        nonlocal returns
        if event == "return" and id(frame) in open_frames:
            open_frames.discard(id(frame))
            returns += 1
        if event != "call" or not frame.f_code.co_filename.startswith(package):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(frame.f_locals.get(name) is obj for name in names for obj in followed):
            calls[code.co_filename[len(package):]] += 1
            open_frames.add(id(frame))

    sys.setprofile(on_event)
    try:
        result = solve(problem, *given, **kwargs)
    finally:
        sys.setprofile(None)
    return {"instance": f"{path} {limit} {objective} {placement}", "status": str(result.status),
            "files": len(calls), "calls": sum(calls.values()), "returns": returns, "by_file": dict(calls.most_common())}


def main() -> None:
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "--child" else
                           os.path.join(os.path.dirname(__file__), ".."))
    if "--child" in sys.argv:
        print(json.dumps(trace(root, int(sys.argv[-1]))))
        return
    for index in range(len(INSTANCES)):
        runs = []
        for _ in range(2):
            child = subprocess.run([sys.executable, os.path.abspath(__file__), root, "--child", str(index)],
                                   cwd=root, capture_output=True, text=True, check=True)
            runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
        first = runs[0]
        print(f"{first['instance']}: {first['files']} files entered, {first['calls']} calls, {first['returns']} "
              f"returns ({first['status']}; the two runs {'agree' if runs[0] == runs[1] else 'DIFFER'})")
        for name, count in first["by_file"].items():
            print(f"  {count:>7,}  {name}")


if __name__ == "__main__":
    main()
