"""The library's one entry point for planning: a profile and a request in, the best plan found out."""
