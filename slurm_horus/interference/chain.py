"""``chain`` (the default model): ask predictors in order of trust, the first with an answer wins.

Order: measured -> cf -> utilization -> conservative default (0.5); memory safety on top. Every
answer carries the name of the predictor that gave it.
"""

import numpy as np

from .table import TablePredictor


class ChainPredictor(TablePredictor):
    name = "chain"
    options = {"order": ("measured", "cf", "utilization")}

    def _fit(self):
        from .model import PREDICTORS

        self.links = []
        for name in self.settings["order"]:
            link = PREDICTORS[name](gpu_memory_mb=self.gpu_memory_overrides)
            link.profiles, link.observations = self.profiles, self.observations
            # share the already prepared index, features and memory guard
            link.index, link.gpu_types = self.index, self.gpu_types
            link.profile_table, link.memory = self.profile_table, self.memory
            link._fit()
            link._fitted = True
            self.links.append(link)

    def _pair_table(self, gpu_type):
        count = len(self.index)
        values = np.full((count, count), np.nan)
        sources = np.zeros((count, count), dtype=np.int8)
        for link in self.links:
            link_values, link_sources = link._pair_table(gpu_type)
            fill = np.isnan(values) & ~np.isnan(link_values)
            values[fill] = link_values[fill]
            sources[fill] = link_sources[fill]
        return values, sources

    def to_dict(self):
        state = super().to_dict()
        state["options"] = dict(state["options"], order=list(self.settings["order"]))
        return state
