"""Greedy schedulers: fast list schedulers that give CP-SAT its warm start (`candidates` ranks them with
the handcrafted schedules), and the better starts that cost more than one run (`tune`, `modulo`)."""
