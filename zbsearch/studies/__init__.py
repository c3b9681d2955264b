"""Research studies that read everything below them: the comparison against handcrafted schedules
(`zbsearch compare`) and the fidelity study (`zbsearch fidelity`: predicted against measured on torch)."""
