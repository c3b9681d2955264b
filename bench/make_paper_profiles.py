"""Write the Zero Bubble paper's 12 published profiles to profiles/ (one file per model and m).

Run `python bench/make_paper_profiles.py [OUTDIR]` (OUTDIR defaults to the repository's profiles/). The numbers are the
paper's appendix table of profiled per-stage times and Table 3's model setups (Qi et al., Zero Bubble
Pipeline Parallelism, ICLR 2024, arXiv:2401.10241), as transcribed in shared/reference/zb-paper.md.
Every stage of a setup is identical because the paper reports one figure per setup.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zbsearch.core.profile import Profile

CITATION = ("Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, arXiv:2401.10241, "
            "appendix profiled times and Table 3")
SEQUENCE_LENGTH = 1024

# Table 3, plus the 1F1B-I chunk count per rank v the paper used: its script takes v = l // p with
# l = layers + 2 (24, 32, 48, 64), so a chunk is about one transformer layer.
MODELS = {
    "1.5b": {"layers": 22, "heads": 24, "hidden": 2304, "p": 8, "micro_batch": 6, "v": 3},
    "6.2b": {"layers": 30, "heads": 32, "hidden": 4096, "p": 8, "micro_batch": 3, "v": 4},
    "14.6b": {"layers": 46, "heads": 40, "hidden": 5120, "p": 16, "micro_batch": 1, "v": 3},
    "28.3b": {"layers": 62, "heads": 48, "hidden": 6144, "p": 32, "micro_batch": 1, "v": 2},
}

# Appendix table: (m, T_F, T_B, T_W, T_comm) in microseconds, profiled separately for each m.
TIMES = {
    "1.5b": [(24, 18522, 18086, 9337, 601), (32, 18513, 18086, 9331, 626), (64, 18546, 18097, 9321, 762)],
    "6.2b": [(24, 29718, 29444, 19927, 527), (32, 29802, 29428, 19530, 577), (64, 29935, 29621, 19388, 535)],
    "14.6b": [(48, 11347, 11248, 8132, 377), (64, 11307, 11254, 8101, 379), (128, 11325, 11308, 8109, 378)],
    "28.3b": [(96, 10419, 10207, 7715, 408), (128, 10408, 10204, 7703, 408), (256, 10402, 10248, 7698, 460)],
}


def mem_w_ratio(hidden: int, heads: int, seq: int = SEQUENCE_LENGTH) -> float:
    """M_W / M_B per token and layer: 32h / (34h + 5as); b and layers per stage cancel."""
    return 32 * hidden / (34 * hidden + 5 * heads * seq)


def paper_profile(model: str, m: int, F: float, B: float, W: float, comm: float) -> Profile:
    setup = MODELS[model]
    p = setup["p"]
    stage = {"F": F, "B": B, "W": W, "mem_B": 1.0, "mem_W": mem_w_ratio(setup["hidden"], setup["heads"])}
    data = {
        "format": "zbsearch-profile/1",
        "name": f"zb-paper-{model}-m{m}",
        "num_stages": p,
        "microbatches": m,
        "time_unit": "us",
        "memory_unit": "relative",
        "stages": [stage] * p,
        "comm": comm,
        "source": {
            "kind": "published",
            "citation": CITATION,
            "note": "one profile per (model, m) as in the paper; all stages share the reported figures; "
                    "mem_B = 1 and mem_W = 32h/(34h+5as) with s = 1024",
        },
        "details": {
            "model": model.upper(),
            "layers": setup["layers"],
            "heads": setup["heads"],
            "hidden": setup["hidden"],
            "sequence_length": SEQUENCE_LENGTH,
            "micro_batch": setup["micro_batch"],
            "v": setup["v"],
            "v_note": "1F1B-I chunks per rank, (layers + 2) // p as in the paper's bubble-rate script",
        },
    }
    return Profile.from_dict(data, origin=data["name"])


def main(outdir: str | None = None) -> None:
    out = Path(outdir) if outdir else Path(__file__).resolve().parents[1] / "profiles"
    out.mkdir(parents=True, exist_ok=True)
    for model, rows in TIMES.items():
        for m, F, B, W, comm in rows:
            profile = paper_profile(model, m, F, B, W, comm)
            path = out / f"{profile.name}.json"
            profile.save(path)
            print(path)


if __name__ == "__main__":
    main(*sys.argv[1:2])
