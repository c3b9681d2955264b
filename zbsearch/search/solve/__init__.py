"""The solve driver: a start from the greedy family, CP-SAT on a refining grid, bounds, LNS, validation;
with the records a solve reports."""
