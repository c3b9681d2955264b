"""File formats: torch CSV, JSON, Chrome trace and the trainer exports (torchtitan, Megatron-LM); a
schedule's layer split; torch CSVs and built-in orders read back."""
