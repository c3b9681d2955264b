"""What every command reads from the command line: the costs (a profile file or the uniform
shorthand), the memory limit and the common output switches.

Each option is declared once here, as an `Annotated` alias, and every command that takes it uses the
alias, so the flags, their help and their defaults cannot drift apart between commands. Values that
do not parse are usage errors (params.py). The checks that tie options together (`--uniform` needs
`-p`; `-p` must match the profile; the schedule's ranks must match the profile's stages) live in
`load_cli_profile` and `problem_for_schedule`, which raise ProfileError with the fix; the CLI turns that
into one line. SUBJECT_FLAGS names the option a library error is about (ZbsearchError.subject).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..core.errors import ProfileError, ZbsearchError
from ..core.ir import Placement, Schedule
from ..core.memory import MemoryLimit, parse_mem_limit
from ..core.planned_profile import for_plan
from ..core.profile import Profile, check_microbatches, check_stages, load_profile, uniform_profile
from .params import (Numbers, parse_chunks, parse_microbatches, parse_stages, parse_uniform_memory,
    parse_uniform_times)

PROBLEM_PANEL = "Problem"
OUTPUT_PANEL = "Output"

# -- the costs -----------------------------------------------------------------------------

ProfileOpt = Annotated[Optional[Path], typer.Option(
    "--profile", metavar="PROFILE.json", rich_help_panel=PROBLEM_PANEL,
    help="Profile JSON with per-stage F/B/W times, memory and provenance (see `zbsearch schema`).",
)]
UniformOpt = Annotated[Optional[Numbers], typer.Option(
    "--uniform", metavar="F,B,W[,COMM]", rich_help_panel=PROBLEM_PANEL, parser=parse_uniform_times,
    help="Shorthand instead of a profile: p identical stages with these times (needs -p).",
)]
StagesOpt = Annotated[Optional[int], typer.Option(
    "-p", "--stages", metavar="P", rich_help_panel=PROBLEM_PANEL, parser=parse_stages,
    help="Pipeline ranks (stages). Needed with --uniform (commands that read a schedule default to its "
         "rank count); with --profile it must match the profile.",
)]
MicrobatchesOpt = Annotated[Optional[int], typer.Option(
    "-m", "--microbatches", metavar="M", rich_help_panel=PROBLEM_PANEL, parser=parse_microbatches,
    help="Microbatches per iteration. Default: the profile's `microbatches`; with --uniform, 2p.",
)]
UniformMemoryOpt = Annotated[Optional[Numbers], typer.Option(
    "--uniform-memory", metavar="M_B,M_W", rich_help_panel=PROBLEM_PANEL, parser=parse_uniform_memory,
    help="With --uniform: activation memory a microbatch holds from F to B (M_B) and from B to W "
         "(M_W), relative units. Default 1,0.5.",
)]
ChunksOpt = Annotated[Optional[int], typer.Option(
    "--chunks", metavar="V", rich_help_panel=PROBLEM_PANEL, parser=parse_chunks,
    help="Model chunks per rank for interleaved-1f1b (default 2); other schedules fix their own.",
)]
MemLimitOpt = Annotated[Optional[str], typer.Option(
    "--mem-limit", metavar="LIMIT", rich_help_panel=PROBLEM_PANEL,
    help="Per-rank activation memory limit: a multiple of p times the stage's M_B (1p, 2p, 1.5p), "
         "a size (48GiB, 40GB, bytes; needs a bytes profile), auto (device capacity minus static "
         "bytes) or none.",
)]

# -- the search ------------------------------------------------------------------------------

SEARCH_PANEL = "Search"
ObjectiveOpt = Annotated[str, typer.Option(
    "--objective", metavar="makespan|span", rich_help_panel=SEARCH_PANEL,
    help="makespan: time 0 to the last pass (the optimizer step synchronizes ranks). span: each rank's "
         "own first to last pass (no synchronizing step; the paper's ILP objective).",
)]
PlacementOpt = Annotated[Optional[str], typer.Option(
    "--placement", metavar="linear|interleaved:V|v|dualpipe|auto", rich_help_panel=SEARCH_PANEL,
    help="Which chunks each rank holds: one stage per rank, V looped chunks per rank, V-shape (2 chunks "
         "per rank), dualpipe (two model copies fed from both ends, 2 chunks per rank, twice the static "
         "memory; p even, m even and >= 2p), or auto: try linear and V-shape (and dualpipe with "
         "--allow-param-copies) and keep the best. Default: auto on a profile that lists its layers (or "
         "with --partition), linear otherwise.",
)]
AllowParamCopiesOpt = Annotated[bool, typer.Option(
    "--allow-param-copies", rich_help_panel=SEARCH_PANEL,
    help="Let --placement auto also try dualpipe, whose ranks each hold two parameter copies.",
)]
PartitionOpt = Annotated[Optional[str], typer.Option(
    "--partition", metavar="auto|even|balanced|fixed:N1,N2,...", rich_help_panel=SEARCH_PANEL,
    help="Choose the split of layers into chunks too (needs a profile with layers): auto searches it with "
         "the schedule; even spreads the blocks evenly; balanced (the default on a profile with layers) "
         "minimizes the heaviest chunk's time; fixed: gives layers per chunk in route order, one count per "
         "chunk (p on linear, 2p on v), counting every layer of the profile, the embedding and the head "
         "included. A size limit then caps each rank's static bytes plus activations.",
)]
HeadroomOpt = Annotated[float, typer.Option(
    "--headroom", min=0.0, max=0.99, rich_help_panel=PROBLEM_PANEL,
    help="Share of the device --mem-limit auto keeps free for allocator fragmentation and buffers.",
)]
TimeLimitOpt = Annotated[float, typer.Option(
    "--time-limit", metavar="SECONDS", rich_help_panel=SEARCH_PANEL, min=0.0,
    help="Wall-clock budget for the whole search (heuristics and CP-SAT).",
)]
WorkersOpt = Annotated[int, typer.Option(
    "--workers", metavar="N", rich_help_panel=SEARCH_PANEL, min=1, help="CP-SAT worker threads.",
)]
SeedOpt = Annotated[int, typer.Option(
    "--seed", metavar="K", rich_help_panel=SEARCH_PANEL, help="CP-SAT random seed.",
)]

# -- output -----------------------------------------------------------------------------------

JsonOpt = Annotated[bool, typer.Option(
    "--json", rich_help_panel=OUTPUT_PANEL,
    help="Print exactly one JSON object (the summary) on stdout instead of tables.",
)]
OutputOpt = Annotated[Optional[Path], typer.Option(
    "-o", "--output", metavar="SCHEDULE.json", rich_help_panel=OUTPUT_PANEL,
    help="Write the schedule JSON here (atomically), only once it has passed validation.",
)]
ExportTorchOpt = Annotated[Optional[Path], typer.Option(
    "--export-torch", metavar="FILE.csv", rich_help_panel=OUTPUT_PANEL,
    help="Also write the schedule as torch's compute-only CSV (as `zbsearch export --format torch-csv`), "
         "atomically, once it has passed validation.",
)]
WidthOpt = Annotated[Optional[int], typer.Option(
    "--width", metavar="COLUMNS", rich_help_panel=OUTPUT_PANEL,
    help="Width of the Gantt chart in characters. Default: the terminal's width.",
)]


def load_cli_profile(
    profile: Path | str | None,
    uniform: Numbers | str | None,
    p: int | None,
    m: int | None,
    uniform_memory: Numbers | str | None = None,
    *,
    default_p: int | None = None,
    default_m: int | None = None,
    loaded: Profile | None = None,
) -> Profile:
    """The profile the command line asks for, with its microbatch count set.

    Parameters
    ----------
    profile, uniform, p, m, uniform_memory
        The values of --profile, --uniform, -p, -m and --uniform-memory (None when not given); the
        uniform numbers as parsed by their options, or as the text typed.
    default_p, default_m
        What -p and -m mean when left out and no profile says otherwise (commands that read a
        schedule pass its rank and microbatch counts). Without `default_p`, --uniform needs -p.
        Without `default_m`, --uniform defaults to m = 2p.
    loaded
        The --profile file as read already (a command reads and validates it once).

    Returns
    -------
    Profile
        With `microbatches` = m when m is given.

    Raises
    ------
    ProfileError
        Neither or both of --profile and --uniform; --uniform without -p; -p not matching the
        profile; --uniform-memory without --uniform; p or m out of range; a malformed profile file.
    FileError
        The profile file is missing or is not JSON.
    """
    if profile is not None and uniform is not None:
        raise ProfileError("give either --profile FILE or --uniform F,B,W, not both")
    if profile is None and uniform is None:
        raise ProfileError("say what to schedule: --profile PROFILE.json, or --uniform F,B,W[,COMM] with -p P")
    check_uniform_companions(profile, uniform, p, uniform_memory)
    if p is not None:
        check_stages(p)
    if m is not None:
        check_microbatches(m)
    if uniform is not None:
        if p is None:
            p = default_p
        if p is None:
            raise ProfileError(f"--uniform {_text(uniform)} needs the number of stages: add -p P, e.g. -p 4")
        if m is None:
            m = default_m if default_m is not None else 2 * p
        return _uniform(uniform, p, m, uniform_memory)
    if loaded is None:
        assert profile is not None  # neither given was refused above
        loaded = load_profile(profile)
    if p is not None and p != loaded.num_stages:
        raise ProfileError(
            f"-p {p} does not match profile {str(profile)!r}, which has {loaded.num_stages} stages: "
            f"drop -p or use -p {loaded.num_stages}"
        )
    if m is None:
        m = default_m
    return loaded.with_microbatches(m) if m is not None else loaded


def check_uniform_companions(profile: object, uniform: object, p: int | None, uniform_memory: object) -> None:
    """The options that only mean something with --uniform: --uniform-memory always, -p when there is
    no profile to match either."""
    if uniform is not None:
        return
    if profile is not None:
        if uniform_memory is not None:
            raise ProfileError("--uniform-memory applies to --uniform only; a profile file gives mem_B and mem_W "
                               "per stage")
    elif p is not None or uniform_memory is not None:
        raise ProfileError("-p and --uniform-memory go with --uniform F,B,W")


def _text(numbers: Numbers | str) -> str:
    return numbers if isinstance(numbers, str) else numbers.text


def _uniform(times: Numbers | str, p: int, m: int, memory: Numbers | str | None) -> Profile:
    if isinstance(times, str):
        times = parse_uniform_times(times)
    if isinstance(memory, str):
        memory = parse_uniform_memory(memory)
    mem_B, mem_W = memory if memory is not None else (1.0, 0.5)
    return uniform_profile(*times, p=p, m=m, mem_B=mem_B, mem_W=mem_W)


def problem_for_schedule(
    schedule: Schedule,
    schedule_file: Path,
    profile: Path | None,
    uniform: Numbers | None,
    p: int | None,
    uniform_memory: Numbers | None,
    *,
    optional: bool = False,
) -> Profile | None:
    """The profile to run a schedule file on: -p and -m default to the schedule's, and its stage count
    must equal the schedule's ranks. None when `optional` and neither --profile nor --uniform is given.

    Raises ProfileError naming the schedule and profile files when they do not match.
    """
    if optional and profile is None and uniform is None:
        check_uniform_companions(profile, uniform, p, uniform_memory)
        return None
    prof = load_cli_profile(profile, uniform, p, None, uniform_memory,
                           default_p=schedule.num_ranks, default_m=schedule.num_microbatches)
    # The plan's accounting, sharding and levels, and on a split of the layers its split: costed as solved.
    prof = for_plan(prof, schedule)
    ranks = schedule.num_ranks
    if prof.num_stages == ranks:
        return prof
    where = str(schedule_file)
    if profile is not None:
        raise ProfileError(
            f"profile {str(profile)!r} has {prof.num_stages} stages but schedule {where!r} has {ranks} ranks: "
            f"use a profile with one stage per rank (or --uniform F,B,W, whose -p defaults to {ranks})"
        )
    raise ProfileError(f"-p {p} does not match schedule {where!r}, which has {ranks} ranks: drop -p or use -p {ranks}")


def parse_limit(text: str | None, prof: Profile, flag: str = "--mem-limit",
                placement: Placement | None = None) -> MemoryLimit | None:
    """--mem-limit for this profile (None when not given); errors name `flag`, the option `text` came
    from. A message about the profile names its file (`Profile.label`), not the `name` inside it.
    `placement`: the schedule's, for `auto` (DualPipe's holds two parameter copies)."""
    if text is None:
        return None
    with flags_for({"mem_limit": flag}):
        return parse_mem_limit(text, prof, placement)


# The flag of each field a library error may be about (ZbsearchError.subject: the fields of
# search.entry.request.PlanRequest, and the inputs of the other commands' library calls): the one table
# from subjects to flags. A command that spells a field otherwise (compare's --mem-limits) says so with
# `flags_for`; everything else is named here, in ZbsearchGroup.invoke.
SUBJECT_FLAGS = {
    "mem_limit": "--mem-limit", "objective": "--objective", "placement": "--placement", "partition": "--partition",
    "stages": "-p", "microbatches": "-m", "headroom": "--headroom", "memory_model": "--memory-model",
    "recompute": "--recompute", "dp_shard": "--dp-shard", "sharding": "--sharding", "devices": "--devices",
    "uniform": "--uniform", "profile": "--profile", "chunks": "--chunks", "schedules": "--schedules",
    "figures": "--figures", "global_batch": "--global-batch", "dp": "--dp", "micro_batch": "--micro-batch",
    "target_bubble": "--target-bubble", "torchtitan": "--torchtitan", "nproc": "--nproc", "backend": "--backend",
    "device": "--device", "model": "--model", "steps": "--steps", "warmup": "--warmup", "timeout": "--timeout",
    # zbsearch configure (whole-run planning); its `workers` are the pool's, spelled --jobs there
    "gpu": "--gpu", "gpus": "--gpus", "gpus_per_node": "--gpus-per-node", "intra_gbps": "--intra-gbps",
    "inter_gbps": "--inter-gbps", "link_efficiency": "--link-efficiency", "gpu_memory": "--gpu-memory", "mfu": "--mfu",
    "tp": "--tp", "pp": "--pp", "ep": "--ep", "current": "--current", "shape": "--current", "fixed": "--current",
    "results": "--results", "ray_address": "--ray", "workers": "--workers", "min_share": "--time-limit",
    "output": "-o", "dtype": "--dtype", "optimizer": "--optimizer", "measured": "--measured",
    "export_dir": "--export-dir",
}


def name_subject(exc: ZbsearchError, spelled: Mapping[str, str] | None = None) -> None:
    """Put the flag of the error's subject in front of its message: the command's own spelling of it
    (`spelled`, subject -> flag) or else SUBJECT_FLAGS', unless the message names a flag already (the
    CLI's own messages do, and an inner `flags_for` has put one in front)."""
    spelled = spelled or {}
    subject = exc.subject or ""
    flag = spelled.get(subject, SUBJECT_FLAGS.get(subject))
    message = str(exc)
    if flag is None or message.startswith("--"):
        return
    # A flag's singular counts too: a message about --mem-limits may say --mem-limit.
    if not any(_mentions(message, known.rstrip("s")) for known in [*SUBJECT_FLAGS.values(), *spelled.values()]):
        exc.args = (f"{flag}: {message}",)


@contextmanager
def flags_for(spelled: Mapping[str, str]) -> Iterator[None]:
    """Errors raised inside name the command's own flag for the subjects in `spelled` (subject -> flag),
    and SUBJECT_FLAGS' for the others."""
    try:
        yield
    except ZbsearchError as exc:
        name_subject(exc, spelled)
        raise


def _mentions(message: str, flag: str) -> bool:
    """Whether `message` names `flag` (not as the tail of a longer word: `-p` is not in `zb-p`)."""
    return re.search(rf"(?<![\w.-]){re.escape(flag)}", message) is not None
