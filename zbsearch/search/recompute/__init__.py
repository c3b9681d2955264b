"""Recompute searched with the schedule and the split: which layers each rank recomputes (`search`:
--recompute auto and auto-layers), and which microbatches need it on a found plan (`microbatches`: keep
what fits, CP-SAT windows choosing order and microbatches together; `every_chunk`: those windows on every
chunk). The data is core/recompute/; the windows' model of the choice is exact/recompute_flags.py."""
