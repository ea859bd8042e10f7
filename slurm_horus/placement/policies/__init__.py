"""Placement policies, one module each. ``make_policy(name, models)`` builds one by name."""

from typing import Callable, Dict, Optional, Tuple

from ...interference.base import Predictor
from ..pairs import PairTable
from ..state import ClassIndex
from .deepboot import DeepBoot
from .horus import Horus
from .horus_util import HorusUtil
from .iasp_iapp import IaspIapp
from .oracle import Oracle
from .sjf import SJF
from .sjf_bsbf import SJFBSBF
from .sjf_ffs import SJFFFS
from .slurm_default import SlurmDefault

POLICY_NAMES = ("slurm-default", "sjf", "sjf-ffs", "sjf-bsbf", "horus-util", "iasp-iapp", "deepboot",
                "oracle", "horus")


class PolicyModels:
    """The predictors a policy may ask for, built once and shared by name.

    ``predictor_factory(kind)`` returns a fitted Predictor (``chain``, ``cf``, ``mlp``...); ``truth``
    is the simulator's ground truth (only the oracle reads it); ``utilization`` maps
    (gpu_type, class) to the solo GPU utilization (percent).
    """

    def __init__(self, classes: ClassIndex, predictor_factory: Callable[[str], Predictor],
                 truth: Optional[Predictor] = None,
                 utilization: Optional[Dict[Tuple[str, str], float]] = None, default_kind: str = "chain"):
        self.classes = classes
        self.predictor_factory = predictor_factory
        self.truth = truth
        self.utilization = utilization or {}
        self.default_kind = default_kind
        self._predictors: Dict[str, Predictor] = {}

    def predictor(self, kind: str) -> Predictor:
        if kind not in self._predictors:
            self._predictors[kind] = self.predictor_factory(kind)
        return self._predictors[kind]

    def pairs(self, kind: Optional[str] = None, learn: bool = True) -> PairTable:
        """A fresh pair table (each policy learns on its own copy)."""
        return PairTable(self.predictor(kind or self.default_kind), self.classes, learn=learn)


def parse_policy_name(spec: str) -> Tuple[str, Dict[str, str]]:
    """``horus:order_rule=fifo,min_combined=1.1`` style is not used on the CLI (commas separate
    policies); options use ``/``: ``horus/order_rule=fifo/min_combined=1.1``."""
    parts = spec.split("/")
    options = {}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        options[key.strip()] = value.strip()
    return parts[0].strip(), options


def _coerce(policy_cls, options: Dict[str, str]) -> Dict[str, object]:
    out = {}
    for key, value in options.items():
        current = getattr(policy_cls, key, None)
        if isinstance(current, bool):
            out[key] = value.lower() in ("1", "true", "yes", "on")
        elif isinstance(current, (int, float)) and not isinstance(current, bool):
            out[key] = type(current)(float(value)) if isinstance(current, int) else float(value)
        else:
            out[key] = value
    return out


def make_policy(spec: str, models: PolicyModels):
    """Build the policy named by ``spec`` (``name`` or ``name/key=value/...``)."""
    name, raw = parse_policy_name(spec)
    if name == "slurm-default":
        return SlurmDefault(**_coerce(SlurmDefault, raw))
    if name == "sjf":
        return SJF(**_coerce(SJF, raw))
    if name == "sjf-ffs":
        return SJFFFS(models.pairs(), **_coerce(SJFFFS, raw))
    if name == "sjf-bsbf":
        return SJFBSBF(models.pairs(), **_coerce(SJFBSBF, raw))
    if name == "horus-util":
        return HorusUtil(models.pairs(), utilization=models.utilization, **_coerce(HorusUtil, raw))
    if name == "iasp-iapp":
        return IaspIapp(models.pairs("mlp"), similarity_pairs=models.pairs("cf"), **_coerce(IaspIapp, raw))
    if name in ("deepboot", "deepboot-nolend"):
        options = _coerce(DeepBoot, raw)
        if "lend" in options:
            options["lend"] = str(options["lend"]).lower() in ("1", "true", "yes", "on")
        if name == "deepboot-nolend":  # the baseline: rigid jobs in their own partition
            options["lend"] = False
            options.setdefault("elastic", False)
        policy = DeepBoot(**options)
        policy.name = name
        return policy
    if name == "oracle":
        if models.truth is None:
            raise ValueError("policy oracle needs the simulator's truth")
        return Oracle(PairTable(models.truth, models.classes, learn=False, exact=True), **_coerce(Oracle, raw))
    if name == "horus":
        return Horus(models.pairs(), **_coerce(Horus, raw))
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES + ('deepboot-nolend',))})")


__all__ = ["POLICY_NAMES", "PolicyModels", "make_policy", "parse_policy_name", "SlurmDefault", "SJF",
           "SJFFFS", "SJFBSBF", "HorusUtil", "IaspIapp", "DeepBoot", "Oracle", "Horus"]
