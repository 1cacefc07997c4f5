"""Several workers of one process sharing G3/G4: each step checked against the reference process
(``check``), and the two-worker lockstep that drives them (``lockstep``)."""
