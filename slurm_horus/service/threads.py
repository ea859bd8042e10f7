"""Background threads of horusd."""

import os
import threading

BACKGROUND_NICENESS = 10


def run_in_background(target, name):
    """A daemon thread for work that may wait (offers, refreshes, history): niced, so that on a
    small controller slurmctld and the thread answering job_submit.lua get the CPU first."""
    def niced():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)  # this thread only
        except (OSError, AttributeError):
            pass
        target()
    thread = threading.Thread(target=niced, name=name, daemon=True)
    thread.start()
    return thread
