"""Whole-run planning: the shape of a training run on N GPUs (tensor, pipeline and data-parallel degrees,
sharding, microbatch size and count) with the schedule, split and recompute; docs/whole-run.md."""
