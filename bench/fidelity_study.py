"""The committed fidelity study: results/fidelity.md, results/fidelity.csv, results/fidelity.png.

One command, on a quiet machine (nothing else running: the study times CPU work to the millisecond):

    PYTHONPATH=. python bench/fidelity_study.py

1. profiles a GPT (4 blocks, hidden 256, 4 heads, sequence 128, 4 sequences per microbatch, vocabulary
   2048, fp32; one pass of a block takes tens of milliseconds on one CPU thread) for 2 ranks and m = 8,
   with torch's stage 0 (I empty, W the whole backward), one torch thread, every layer resident:
   profiles/cpu-gpt-fidelity.json;
2. calibrates it (zbsearch calibrate: per-action overhead, message times, torch's runtime memory):
   profiles/cpu-gpt-fidelity-calibrated.json;
3. runs `zbsearch fidelity` on both: 1F1B, ZB-H1, ZB-H2, ZB-V, interleaved 1F1B, torch's ZBVZeroBubble,
   InterleavedZeroBubble and Interleaved1F1B, and zbsearch's solved schedule at 1p and 2p on each profile;
   every schedule 3 times round robin, 2 warm-up + 10 timed steps each, one torch thread per rank, rank r
   pinned to CPU r.

About 25 minutes on a quiet 2-core machine (profiling 1 min, calibration 20 s, solving 2 min, the runs
the rest). On a GPU machine (one GPU per rank):

    PYTHONPATH=. python bench/fidelity_study.py --device cuda --backend nccl

writes results/fidelity-cuda.* and profiles/cuda-gpt-fidelity*.json instead (bf16). `--quick` checks the
machinery in about a minute on a tiny model (writes under /tmp, not results/).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zbsearch.interop.run.calibrate import calibrate  # noqa: E402
from zbsearch.studies.fidelity import StudyRequest, run_study  # noqa: E402
from zbsearch.studies.fidelity_analysis import analyse  # noqa: E402
from zbsearch.studies.fidelity_report import write_study  # noqa: E402
from zbsearch.profiling.build import profile_measured  # noqa: E402
from zbsearch.profiling.request import GptShape, MeasureRequest, PipelineSetup, StageSplit  # noqa: E402

SHAPE = GptShape(layers=4, hidden=256, heads=4, seq=128, micro_batch=4, vocab=2048)
QUICK = GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl"), help="default: gloo on cpu, nccl on cuda")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--solve-seconds", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="a tiny model, 1 step, 1 run: checks the machinery")
    args = parser.parse_args(argv)
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    tag = "" if args.device == "cpu" else "-cuda"
    results, profiles = (Path("/tmp/zbsearch-fidelity-quick"),) * 2 if args.quick else (ROOT / "results", ROOT / "profiles")
    results.mkdir(parents=True, exist_ok=True)
    steps, warmup, repeats, solve = (1, 1, 1, 3.0) if args.quick else (args.steps, args.warmup, args.repeats,
                                                                      args.solve_seconds)
    t0 = time.monotonic()

    def say(what: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {what}", flush=True)

    say("profiling")
    raw = profile_measured(
        "gpt", StageSplit(stages=2), PipelineSetup(microbatches=4 if args.quick else 8, torch_stage0=True),
        MeasureRequest(device=args.device, warmup=3, repeats=3 if args.quick else 15,
                       threads=1 if args.device == "cpu" else None),
        shape=QUICK if args.quick else SHAPE, name=f"{args.device}-gpt-fidelity")
    raw.save(profiles / f"{args.device}-gpt-fidelity.json")
    say(f"per stage F, I, W (us): {[(round(s.F), round(s.B), round(s.W)) for s in raw.stages]}")
    say("calibrating")
    cal = calibrate(raw, backend=backend, device=args.device, memory_model="torch-runtime")
    cal.save(profiles / f"{args.device}-gpt-fidelity-calibrated.json")
    say(f"action overhead {cal.action_overhead:.1f} us; running the study")
    request = StudyRequest(raw, cal, steps=steps, warmup=warmup, repeats=repeats, solve_seconds=solve,
                           backend=backend, device=args.device, timeout_s=900.0)
    study = run_study(request, progress=say)
    rows = analyse(study)
    command = "python bench/fidelity_study.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for path in write_study(study, rows, results / f"fidelity{tag}", command.strip()):
        say(f"wrote {path}")


if __name__ == "__main__":
    main()
