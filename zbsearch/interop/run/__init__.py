"""Running a schedule on torch: the launcher, one worker per rank, the model cut into chunks, the run's
record, probes of memory and messages, and calibration."""
