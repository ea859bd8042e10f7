"""Job-class names: one stable, readable scheme for every data source.

A class name is lower-case ``<model>[-<dataset>]-bs<batch>[-amp]``: the model family with every
character other than a-z/0-9 dropped (``ResNet-18`` -> ``resnet18``), the dataset when a source
distinguishes it, the per-GPU batch size, and ``-amp`` for mixed precision. A class without a batch
size (Gavel's ``A3C``, ``CycleGAN``) is just the model (``a3c``, ``cyclegan``). Users may give any
label matching ``CLASS_NAME_RE`` instead (e.g. a fingerprint of their script).
"""

import re

CLASS_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
_GAVEL_JOB_RE = re.compile(r"^(?P<model>[^(]+?)\s*(?:\(batch size (?P<bs>\d+)\))?$")


def _slug(text):
    return re.sub(r"[^a-z0-9]", "", text.lower())


def class_name(model, batch_size=None, amp=False, dataset=None):
    """``class_name("ResNet-18", 64)`` -> ``resnet18-bs64``."""
    parts = [_slug(model)]
    if dataset:
        parts.append(_slug(dataset))
    if batch_size is not None:
        parts.append(f"bs{int(batch_size)}")
    if amp:
        parts.append("amp")
    return "-".join(parts)


def gavel_class(job_type):
    """Gavel's job type (``ResNet-18 (batch size 64)``, ``A3C``) -> class name (``resnet18-bs64``)."""
    match = _GAVEL_JOB_RE.match(job_type.strip())
    if not match:
        raise ValueError(f"not a Gavel job type: {job_type!r}")
    batch = match.group("bs")
    return class_name(match.group("model"), int(batch) if batch else None)


_BATCH_RE = re.compile(r"^(?P<head>.+?)-bs(?P<bs>\d+)(?P<tail>(?:-.*)?)$")


def batch_family(name):
    """``resnet50-bs64`` -> (``resnet50``, 64); ``lm-bs5-amp`` -> (``lm-amp``, 5); no batch -> None.

    Classes of one family differ only in batch size, so their peak memory grows with it.
    """
    match = _BATCH_RE.match(name)
    if not match:
        return None
    return match.group("head") + match.group("tail"), int(match.group("bs"))


def batch_orderings(names):
    """Index pairs (smaller batch, next larger batch) within each family of ``names``."""
    families = {}
    for i, name in enumerate(names):
        key = batch_family(name)
        if key:
            families.setdefault(key[0], []).append((key[1], i))
    pairs = []
    for members in families.values():
        members.sort()
        pairs.extend((a[1], b[1]) for a, b in zip(members, members[1:]) if a[0] < b[0])
    return pairs


def with_batch(name, batch_size):
    """``resnet50-bs64``, 32 -> ``resnet50-bs32`` (the same family at another per-step batch size);
    ``lm-bs20-amp``, 10 -> ``lm-bs10-amp``. A name without a batch size is returned unchanged."""
    match = _BATCH_RE.match(name)
    if not match:
        return name
    return f"{match.group('head')}-bs{int(batch_size)}{match.group('tail')}"


def smaller_batches(name, known):
    """Micro-batch variants of ``name`` among the class names ``known``: [(micro_batch, grad_accum,
    class)] for every batch size of the same family that divides the class's batch size, largest
    micro-batch first (gradient accumulation keeps the global batch: micro × accum = batch)."""
    family = batch_family(name)
    if family is None:
        return []
    head, batch = family
    out = []
    for other in known:
        key = batch_family(other)
        if key and key[0] == head and key[1] < batch and batch % key[1] == 0:
            out.append((key[1], batch // key[1], other))
    return sorted(out, reverse=True)


def micro_batch_speed(full_class, full_tput, micro_class, micro_tput):
    """Samples/s of ``micro_class`` over those of ``full_class`` (same model, smaller per-step batch),
    from their solo throughputs in steps/s; capped at 1 (accumulating gradients over smaller steps is
    never counted faster than the batch as submitted). None when a batch size or throughput is unknown."""
    full, micro = batch_family(full_class), batch_family(micro_class)
    if not full_tput or not micro_tput or full is None or micro is None:
        return None
    return min(1.0, (micro_tput * micro[1]) / (full_tput * full[1]))
