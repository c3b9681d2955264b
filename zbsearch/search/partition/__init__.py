"""The partition search: which layers each chunk holds, chosen with the schedule. Candidates, the bound
over every partition, its best-first enumeration and per-partition leaves, the search, the report."""
