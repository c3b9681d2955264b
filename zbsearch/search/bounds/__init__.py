"""Lower bounds on a problem's objective: per rank (`analytic`), on relaxed passes (`relaxations`), one
rank solved exactly (`rank_sequence`, `chain_walk`), and a rank's window holding every deeper one's
(`window_nesting`)."""
