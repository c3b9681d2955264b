"""The exact engines: the CP-SAT model on a time grid (`cpsat`) and the large-neighbourhood search that
re-solves windows of an incumbent with it (`lns`)."""
