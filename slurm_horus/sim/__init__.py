"""Trace-driven simulator: the placement core driven by a trace and a ground-truth pair matrix.

``traces`` reads the supported trace formats, ``truth`` holds what really happens when jobs share a
GPU, ``engine`` is the discrete-event loop, ``metrics``/``report``/``svg`` summarize and draw, ``run``
wires a cluster spec, predictors and policies together, ``cli`` is ``horus simulate``.
"""
