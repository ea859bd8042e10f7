"""``horus replay``: a trace replayed on real Slurm (one local cluster per policy) with fake GPU jobs
that slow down as the truth says, measured from sacct, beside the simulator's prediction.

``run`` starts the clusters, submits and waits; ``live`` turns sacct's records into the simulator's
metrics; ``report`` writes the HTML page; ``cli`` is the command.
"""
