"""Offers and claims: horusd's next placement per job class, which job_submit.lua takes without a round trip.

horusd publishes in ``<socket>.offers`` where a 1-GPU job of each class that asked before would go
now; job_submit.lua applies one offer per published version and *claims* it on its kept connection
without waiting for an answer; horusd records the claim as a decision. The rules that keep an offer
from being stale are in docs/horusd.md. :class:`OfferBook` is the placer's side (which classes get
offers, the offers made, the claims queued), :class:`OffersFile` the file the Lua reads.
"""

import os
import threading
import time
from collections import OrderedDict, deque

from .protocol import encode_kv, format_offers_header, parse_offers_header

MAX_OFFER_CLASSES = 64  # the classes that asked most recently get offers


class OfferBook:
    """What the placer knows of its offers (the caller holds the placer's lock)."""

    def __init__(self):
        # classes job_submit.lua asked for, least recently first: they get offers
        self.requested_classes: "OrderedDict[str, None]" = OrderedDict()
        # offer id -> (JobRequest, Decision, Reply, made at), oldest first, until claimed or stale
        self.offered: "OrderedDict[str, tuple]" = OrderedDict()
        self.claims = deque()  # claims job_submit.lua sent, not applied yet (see Placer.claim)
        self.last_claim = ""  # id of the offer claimed last: the offers file says which claims it knows

    def note_class(self, job_class):
        """``job_class`` asked just now: it gets offers; the class that asked least recently makes room
        (junk classes cannot hold the slots for good)."""
        self.requested_classes[job_class] = None
        self.requested_classes.move_to_end(job_class)
        while len(self.requested_classes) > MAX_OFFER_CLASSES:
            self.requested_classes.popitem(last=False)

    def made(self, offer_id, req, decision, reply, now):
        self.offered[offer_id] = (req, decision, reply, now)

    def forget_older_than(self, oldest_kept):
        """Every publish adds one offer per class: drop from the old end, never scan them all."""
        while self.offered and next(iter(self.offered.values()))[3] < oldest_kept:
            self.offered.popitem(last=False)

    def take(self, offer_id):
        return self.offered.pop(offer_id, None)

    def carry_over(self, old: "OfferBook"):
        """A reload: the new placer's book continues the old one (one claim queue: a claim sent to
        the old placer meanwhile is not lost; a claim may arrive for an offer made before)."""
        self.requested_classes = old.requested_classes.copy()
        self.offered = old.offered.copy()
        self.claims = old.claims
        self.last_claim = old.last_claim


class OffersFile:
    """``<socket>.offers``: line 1 ``version=N;claimed=ID;generated=EPOCH``, then
    ``CLASS<TAB>key=value;...`` (the reply format). Versions only grow, across restarts too: they
    start at the start time in ms or past the version an earlier horusd left."""

    def __init__(self, path):
        self.path = path
        self.version = max(int(time.time() * 1000), self.version_in(path))
        self.live = False  # the file holds offers (not only a header)
        self.lock = threading.Lock()  # callers hold it around reading the version and writing

    @staticmethod
    def version_in(path):
        """The version of an offers file left by an earlier horusd (0 if none or unreadable)."""
        try:
            with open(path) as existing:
                version, _claimed, _generated = parse_offers_header(existing.readline().rstrip("\n"))
        except OSError:
            return 0
        return version or 0

    def write(self, offers, last_claim="", joint=0):
        """Replace the file (caller holds ``lock``); ``offers``: {class: reply wire dict}, in the order
        they were computed; the first ``joint`` of them were computed each as if those before it
        were taken (Placer.compute_offers)."""
        self.version += 1
        lines = [format_offers_header(self.version, last_claim, time.time(), joint)]
        lines += [f"{job_class}\t{encode_kv(reply)}" for job_class, reply in offers.items()]
        tmp = f"{self.path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # slurmctld's user reads it, whatever our umask
            os.write(fd, ("\n".join(lines) + "\n").encode())
        finally:
            os.close(fd)
        # unlink, then rename: renaming over an existing file makes ext4 flush the new one first
        # (auto_da_alloc), 4x the cost. Meanwhile a reader finds no file, i.e. no offer: it asks.
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.rename(tmp, self.path)
        self.live = bool(offers)

    def withdraw(self):
        """No offer may be taken any more (caller holds ``lock``)."""
        if self.live:
            self.write({})

    def remove(self):
        try:
            os.unlink(self.path)
        except OSError:
            pass
