"""Placement policies, one module each. ``make_policy(name, models)`` builds one by name."""

from typing import Callable, Dict, Optional, Sequence, Tuple

from ...config import parse_bool
from ...interference.base import Predictor, SoloProfile
from ...interference.priors import builtin_priors
from ..pairs import PairTable
from ..state import ClassIndex
from ..fragmentation import FragmentationModel
from .deepboot import DeepBoot
from .fgd import FRAGMENTATION_POLICIES
from .horus import Horus
from .horus_risk import HorusRisk
from .horus_util import HorusUtil
from .iasp_iapp import IaspIapp
from .oracle import Oracle
from .sjf import SJF
from .sjf_bsbf import SJFBSBF
from .sjf_ffs import SJFFFS
from .slurm_default import SlurmDefault

POLICY_NAMES = ("slurm-default", "sjf", "sjf-ffs", "sjf-bsbf", "horus-util", "iasp-iapp", "deepboot",
                "oracle", "horus", "horus-risk") + tuple(FRAGMENTATION_POLICIES)


class PolicyModels:
    """The predictors a policy may ask for, built once and shared by name.

    ``predictor_factory(kind)`` returns a fitted Predictor (``chain``, ``cf``, ``mlp``...); ``truth``
    is the simulator's ground truth (only the oracle reads it); ``utilization`` maps
    (gpu_type, class) to the solo GPU utilization (percent).
    """

    def __init__(self, classes: ClassIndex, predictor_factory: Callable[[str], Predictor],
                 truth: Optional[Predictor] = None,
                 utilization: Optional[Dict[Tuple[str, str], float]] = None, default_kind: str = "chain",
                 profiles: Optional[Sequence[SoloProfile]] = None):
        self.classes = classes
        self.predictor_factory = predictor_factory
        self.truth = truth
        self.default_kind = default_kind
        self._predictors: Dict[str, Predictor] = {}
        # solo profiles (the built-in priors unless given): measured utilization and solo throughput
        self.profiles = list(profiles) if profiles is not None else list(builtin_priors()[0])
        self.utilization = dict(utilization) if utilization is not None else {
            (p.gpu_type, p.job_class): p.gpu_util for p in self.profiles if p.gpu_util is not None}
        self.solo_tput = {(p.gpu_type, p.job_class): p.solo_tput for p in self.profiles if p.solo_tput}
        self.gmem = {(p.gpu_type, p.job_class): p.gmem_mb for p in self.profiles if p.gmem_mb}
        self._util_model = None
        # request shapes seen before (a trace, a site's history): the workload fragmentation is
        # measured against (``placement/fragmentation.py``); each policy counts what it sees on top
        self.workload: Dict = {}

    @property
    def util_model(self):
        """Horus's utilization predictor from model features, refined by the measured utilizations of
        the profiles (the analytic prior alone when none was measured)."""
        if self._util_model is None:
            from ...interference.utilmodel import UtilizationModel

            self._util_model = UtilizationModel().fit(
                (p.job_class, p.gpu_type, p.gpu_util) for p in self.profiles if p.gpu_util is not None)
        return self._util_model

    def predictor(self, kind: str) -> Predictor:
        if kind not in self._predictors:
            self._predictors[kind] = self.predictor_factory(kind)
        return self._predictors[kind]

    def fragmentation(self) -> FragmentationModel:
        """A fresh fragmentation model over the known workload (each policy keeps its own cache)."""
        return FragmentationModel(dict(self.workload))

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


def _flag(what: str, value) -> bool:
    """A yes/no policy option (the site settings' reader); ``what`` names it in the error."""
    try:
        return parse_bool(str(value))
    except ValueError:
        raise ValueError(f"{what}: {value!r} is not true or false") from None


def _coerce(policy_cls, options: Dict[str, str]) -> Dict[str, object]:
    out = {}
    for key, value in options.items():
        current = getattr(policy_cls, key, None)
        if isinstance(current, bool):
            out[key] = _flag(f"option {key}", value)
        elif isinstance(current, (int, float)) and not isinstance(current, bool):
            out[key] = type(current)(float(value)) if isinstance(current, int) else float(value)
        else:
            out[key] = value
    return out


# explicit oracle options, any policy, simulator only: what the policy is told instead of what it would
# predict or estimate; bench_robust.py's knowledge split reads them (which missing knowledge costs what)
ORACLE_OPTIONS = {
    "oracle_pairs": "the simulator's true pair matrix instead of the predictions (and no learning)",
    "oracle_durations": "the trace's true durations instead of the estimates",
}


def reads_truth(spec: str) -> bool:
    """Whether the policy ``spec`` reads the simulator's truth (``oracle``, or an :data:`ORACLE_OPTIONS`
    option set): no live cluster can run it."""
    name, raw = parse_policy_name(spec)
    try:
        return name == "oracle" or any(_told(name, raw).values())
    except ValueError:
        return True  # make_policy says what is wrong with it


def _told(name: str, raw: Dict[str, str]) -> Dict[str, bool]:
    """The :data:`ORACLE_OPTIONS` in ``raw`` (taken out of it), read as yes/no."""
    return {key: _flag(f"policy {name}: {key}", raw.pop(key)) for key in ORACLE_OPTIONS if key in raw}


class _TruePairs:
    """``models`` whose pair tables are the simulator's truth (``oracle_pairs``): exact, never learning."""

    def __init__(self, models: PolicyModels):
        self._models = models

    def __getattr__(self, name):
        return getattr(self._models, name)

    def pairs(self, kind: Optional[str] = None, learn: bool = True) -> PairTable:
        return PairTable(self._models.truth, self._models.classes, learn=False, exact=True)


def make_policy(spec: str, models: PolicyModels):
    """Build the policy named by ``spec`` (``name`` or ``name/key=value/...``).

    Every policy also takes the explicit oracle options :data:`ORACLE_OPTIONS` (simulator only: they
    need its truth): ``oracle_pairs=true`` gives it the true pair matrix, ``oracle_durations=true`` the
    trace's true durations, so that what each kind of knowledge is worth can be measured apart."""
    name, raw = parse_policy_name(spec)
    told = _told(name, raw)
    if any(told.values()) and models.truth is None:
        raise ValueError(f"policy {spec}: {', '.join(k for k, v in told.items() if v)} read the simulator's "
                         f"truth; horusd cannot run it live")
    if told.get("oracle_pairs"):
        models = _TruePairs(models)
    policy = _make_policy(name, raw, models)
    if told.get("oracle_durations"):
        policy.perfect_knowledge = True
    return policy


def _make_policy(name: str, raw: Dict[str, str], models: PolicyModels):
    if name == "slurm-default":
        return SlurmDefault(**_coerce(SlurmDefault, raw))
    if name == "sjf":
        return SJF(**_coerce(SJF, raw))
    if name == "sjf-ffs":
        return SJFFFS(models.pairs(), **_coerce(SJFFFS, raw))
    if name == "sjf-bsbf":
        return SJFBSBF(models.pairs(), solo_tput=models.solo_tput, **_coerce(SJFBSBF, raw))
    if name == "horus-util":
        return HorusUtil(models.pairs(), utilization=models.utilization, util_model=models.util_model,
                         gmem=models.gmem, **_coerce(HorusUtil, raw))
    if name == "iasp-iapp":
        options = _coerce(IaspIapp, raw)
        for key in ("similarity", "performance"):
            known = ("cf", "ncf") if key == "similarity" else ("mlp", "mlp-deep")
            if options.get(key, getattr(IaspIapp, key)) not in known:
                raise ValueError(f"policy iasp-iapp: {key} must be one of {', '.join(known)}")
        return IaspIapp(models.pairs(options.get("performance", IaspIapp.performance)),
                        similarity_pairs=models.pairs(options.get("similarity", IaspIapp.similarity)), **options)
    if name in ("deepboot", "deepboot-nolend"):
        options = _coerce(DeepBoot, raw)
        if "lend" in options:
            options["lend"] = _flag("option lend", options["lend"])
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
        return Horus(models.pairs(), fragmentation=models.fragmentation(), **_coerce(Horus, raw))
    if name == "horus-risk":
        return HorusRisk(models.pairs(), fragmentation=models.fragmentation(), **_coerce(HorusRisk, raw))
    if name in FRAGMENTATION_POLICIES:
        cls = FRAGMENTATION_POLICIES[name]
        return cls(None, fragmentation=models.fragmentation(), **_coerce(cls, raw))
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES + ('deepboot-nolend',))})")


__all__ = ["POLICY_NAMES", "ORACLE_OPTIONS", "PolicyModels", "make_policy", "reads_truth", "parse_policy_name",
           "SlurmDefault", "SJF", "SJFFFS", "SJFBSBF", "HorusUtil", "IaspIapp", "DeepBoot", "Oracle", "Horus",
           "HorusRisk"]
