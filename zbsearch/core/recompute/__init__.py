"""Activation recompute, as data: `options` (what recomputing a layer costs and holds, per level) and
`levels` (levels applied to a profile's layers, the `--recompute` values that choose them). The search
that chooses them is search/recompute/."""
