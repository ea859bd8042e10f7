"""Background threads of horusd."""

import logging
import os
import threading

BACKGROUND_NICENESS = 10

log = logging.getLogger("horusd")


def run_in_background(target, name, on_death=None):
    """A daemon thread for work that may wait (offers, refreshes, history): niced, so that on a
    small controller slurmctld and the thread answering job_submit.lua get the CPU first.

    ``on_death(reason)`` is called if ``target`` ends with an exception: horusd then exits so that
    its supervisor restarts it, instead of living on without that thread."""
    def niced():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)  # this thread only
        except (OSError, AttributeError):
            pass
        try:
            target()
        except BaseException:
            log.critical("horus: thread %s died", name, exc_info=True)
            if on_death is not None:
                on_death(f"thread {name} died")
    thread = threading.Thread(target=niced, name=name, daemon=True)
    thread.start()
    return thread
