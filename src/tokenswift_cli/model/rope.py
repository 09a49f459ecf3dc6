"""Context extension: YaRN rope scaling for runs longer than the model's trained length.

YaRN (Peng et al., arXiv 2309.00071) interpolates the low rotary frequencies by `factor`, keeps the
high ones, and scales attention logits by (0.1 ln factor + 1)^2. `transformers` computes it from
`config.rope_parameters` (rope_type "yarn", factor, original_max_position_embeddings); we rebuild the
model's rotary module from that config, so every forward (stock or lean) uses the scaled frequencies.
The resolved choice is a `ModelSpec` with rope_scaling "yarn"/"none" and an explicit factor: recorded
in a run's settings, it makes resume and the plain baseline load exactly the same model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import PretrainedConfig, PreTrainedModel

from tokenswift_cli.config import ModelSpec

# Factors are rounded up to this step so that a run's model does not change with every small
# change of its length (and a factor 1.5 run can be compared with a factor 1.5 baseline).
FACTOR_STEP = 0.5


@dataclass(frozen=True)
class RopePlan:
    """The rotary embedding a run uses. `factor` is 1 for "none"; `total_tokens` None when unknown."""

    scaling: Literal["yarn", "none"]
    factor: float
    trained_length: int
    configured_length: int
    total_tokens: int | None = None

    @property
    def supported_length(self) -> int:
        """Positions the model handles as loaded: YaRN stretches the trained length by its factor."""
        if self.scaling == "yarn":
            return int(self.trained_length * self.factor)
        return self.configured_length

    def warning(self) -> str | None:
        """One line for the user when the run goes past what the model, as loaded, supports."""
        if self.total_tokens is None or self.total_tokens <= self.supported_length:
            return None
        how = f"YaRN factor {self.factor:g}" if self.scaling == "yarn" else "no rope scaling"
        return (
            f"warning: this run reaches {self.total_tokens} positions but the model with {how} supports "
            f"{self.supported_length}: expect the text to degrade past that "
            "(use --rope-scaling auto or a larger factor)"
        )

    def resolved(self, spec: ModelSpec) -> ModelSpec:
        """`spec` with the choice made explicit, to record in a run's settings."""
        if self.scaling == "yarn":
            return dataclasses.replace(spec, rope_scaling="yarn", rope_factor=self.factor)
        return dataclasses.replace(spec, rope_scaling="none", rope_factor=None)


def trained_length(config: PretrainedConfig) -> int:
    """Positions the model was trained on: the original length of an already scaled model."""
    params = _rope_parameters(config)
    original = params.get("original_max_position_embeddings")
    if params.get("rope_type", "default") != "default" and original:
        return int(original)
    return int(config.max_position_embeddings)


def yarn_factor(total_tokens: int, trained: int) -> float:
    """The smallest factor (a multiple of FACTOR_STEP, at least 1) that covers `total_tokens` positions."""
    if total_tokens <= trained:
        return 1.0
    return math.ceil(total_tokens / trained / FACTOR_STEP) * FACTOR_STEP


def plan_rope(spec: ModelSpec, config: PretrainedConfig, total_tokens: int | None = None) -> RopePlan:
    """Resolve `spec.rope_scaling` for a run of `total_tokens` positions (prefix + generated).

    "none" keeps the model as configured. "yarn" uses `spec.rope_factor`, else a factor sized to the
    run. "auto" does the same as "yarn" only when the run outgrows the trained length of a model that
    has no rope scaling of its own; otherwise it keeps the model as configured.
    """
    trained, configured = trained_length(config), int(config.max_position_embeddings)
    keep = RopePlan("none", 1.0, trained, configured, total_tokens)
    if spec.rope_scaling == "none":
        return keep
    if spec.rope_scaling == "auto":
        already_scaled = _rope_parameters(config).get("rope_type", "default") != "default"
        if already_scaled or total_tokens is None or total_tokens <= trained:
            return keep
    factor = spec.rope_factor
    if factor is None:
        if total_tokens is None:
            raise ValueError("rope scaling yarn needs a factor or the run's length")
        factor = yarn_factor(total_tokens, trained)
    return RopePlan("yarn", float(factor), trained, configured, total_tokens)


def apply_rope(model: PreTrainedModel, plan: RopePlan) -> None:
    """Give `model` the rotary embedding of `plan` (in place). "none" leaves it as configured."""
    if plan.scaling == "none":
        return
    config = model.config
    params = {k: v for k, v in _rope_parameters(config).items() if k not in ("factor", "attention_factor")}
    params.update(rope_type="yarn", factor=plan.factor, original_max_position_embeddings=plan.trained_length)
    config.rope_parameters = params
    config.max_position_embeddings = max(plan.configured_length, plan.supported_length)
    decoder = model.get_decoder()  # type: ignore[no-untyped-call]
    old = decoder.rotary_emb
    new = type(old)(config)
    decoder.rotary_emb = new.to(old.inv_freq.device)


def _rope_parameters(config: PretrainedConfig) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or {}
    return dict(params)


def rotary_frequencies(model: PreTrainedModel) -> tuple[torch.Tensor, float]:
    """The model's rotary inverse frequencies `[head_dim / 2]` and attention scaling (for tests)."""
    rotary = model.get_decoder().rotary_emb  # type: ignore[no-untyped-call]
    return rotary.inv_freq.detach().clone(), float(rotary.attention_scaling)
