"""`CreditConfig`: the method and every knob of docs/credit.md, with their defaults (docs/credit.md#configuration).

Symbols in comments are docs/credit.md's. `CreditConfig.for_method(method, family_defaults, ...)` puts
together the method's rules, an env family's defaults (span mode, invalid penalty, mixing strength:
each env family registers its own, `trainer.env_knowledge.credit_config` reads them from the
registry) and keyword overrides. This module knows nothing of environments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CreditConfig", "METHODS", "SPAN_MODES", "RELEASE_PRESET"]

METHODS = ("grpo", "gigpo", "stepopsd", "agentopsd", "rlsd")
SPAN_MODES = ("action_only", "clean_step")
PRIORS = ("success", "release_reward")
PEER_FORMATS = ("actions", "actions_observations")

# AgentOPSD `release` preset (docs/credit.md#the-release-preset): reproduces the public code.
RELEASE_PRESET: dict[str, Any] = {"belief_gamma": 1.0, "eps0": 1e-4, "prior": "release_reward"}
# The release's raw episode reward: 10 for a success, 0 otherwise (what its B_0 averages).
RELEASE_SUCCESS_REWARD = 10.0


_TYPES = {"bool": bool, "int": int, "float": float, "str": str}
_TYPE_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


@dataclass(frozen=True)
class CreditConfig:
    """How episodes' outcomes become per-token advantages.

    Every method (docs/credit.md#shared-pipeline):
        method: `grpo`, `gigpo`, `stepopsd`, `agentopsd` (or the optional `rlsd`).
        success_scale: R_i = success_scale * success_i + score_coef * score_i - invalid_coef * n_invalid_i.
        score_coef: weight of the env's graded score (WebShop's family default is 1, the generic one
            0: an env that only knows success reports score == success, and adding it would count
            success twice).
        invalid_coef: penalty per invalid turn (0.1; 0.01 for Search-QA).
        adv_eps: the 1e-6 in every `/ (std + 1e-6)`.
        max_abs_gap: |lp_T - lp_S| is clamped to this many nats, so -inf log-probs cannot make NaN.
            Far beyond where sigma() saturates, so it changes no finite result.

    GiGPO (docs/credit.md#gigpo):
        gigpo_omega: omega in A = A_episode + omega * A_step.
        gigpo_gamma: gamma in R_t = r_t + gamma * R_{t+1}.

    StepOPSD (docs/credit.md#stepopsd):
        span_mode: `action_only` (score the action block, tags included) or `clean_step` (the whole
            turn response). AgentOPSD and RLSD always score the whole response.
        alpha_clip: alpha in w_t = clip(2 sigma(sign(A) delta_t), 1 - alpha, 1 + alpha).
        lam_mix: lam_mix, the mixing strength at step 0.
        decay_steps: lam_t = lam_mix * max(0, 1 - step / decay_steps); <= 0 keeps lam_mix constant.
        budget: the normalized per-step credit budget (on by default).
        budget_cap: C, the budget coefficients are clipped to [1/C, C].
        teacher_mode: `stale` (a policy snapshot refreshed every `teacher_refresh` updates) or `live`
            (the current policy). `for_method` gives StepOPSD `stale` and AgentOPSD `live`
            (docs/credit.md#agentopsd-teacher: AgentOPSD's teacher is the current (old) policy); the
            OpenRLHF bridge is always live.
        teacher_refresh: updates between snapshot refreshes.
        hindsight_peer: add the first successful peer's trajectory to failed episodes of mixed groups.
        hindsight_reference: add the env's hindsight reference (expert plan, gold answer, target).
        peer_format: how the peer trajectory is written: `actions` (its actions, one line per step:
            what the successful episode did) or `actions_observations` (each action and the env's
            answer; several times longer, and the teacher scores every turn's span after it).
        peer_max_chars: the peer trajectory's text is cut at this many characters (with a visible
            "[... N characters cut]" marker; counted in the teacher's stats).

    AgentOPSD (docs/credit.md#agentopsd):
        lam: lam, the mixing strength.
        b: b, the turn weights are clip(1 + b z_k, 1 - b, 1 + b).
        belief_gamma: gamma in c_k = gamma c_{k-1} + e_k.
        eps0: B_0 is clipped to [eps0, 1 - eps0].
        prior: `success` (B_0 = S_g / G, binary successes) or `release_reward` (the `release`
            preset: the group mean of the public code's raw 0/10 reward, 10 x success, so B_0
            saturates to 1 - eps0 as soon as one episode of the group succeeds and is eps0 when none
            does; no score and no invalid-turn penalty in it).
        skills_dir: a folder of skill files replacing trainer/skills (None: the project's own).

    RLSD (optional, docs/credit.md#rlsd): w_t = clip(exp(sign(A) delta_t), 1 - rlsd_clip, 1 + rlsd_clip),
        mixed like StepOPSD with lam_t.

    Teacher scoring:
        teacher_max_length: longest teacher sequence (None: the model's max_position_embeddings).
    """

    method: str = "grpo"
    # -- every method: outcome reward and sequence advantage (docs/credit.md#shared-pipeline)
    success_scale: float = 1.0
    score_coef: float = 0.0
    invalid_coef: float = 0.1
    adv_eps: float = 1e-6
    max_abs_gap: float = 1e4
    # -- GiGPO
    gigpo_omega: float = 1.0
    gigpo_gamma: float = 0.95
    # -- StepOPSD
    span_mode: str = "action_only"
    alpha_clip: float = 0.2
    lam_mix: float = 0.2
    decay_steps: int = 50
    budget: bool = True
    budget_cap: float = 2.0
    teacher_mode: str = "stale"
    teacher_refresh: int = 10
    hindsight_peer: bool = True
    hindsight_reference: bool = True
    peer_format: str = "actions"
    peer_max_chars: int = 4000
    # -- AgentOPSD
    lam: float = 0.5
    b: float = 0.2
    belief_gamma: float = 0.95
    eps0: float = 1e-3
    prior: str = "success"
    skills_dir: str | None = None
    # -- RLSD
    rlsd_clip: float = 0.2
    # -- teacher
    teacher_max_length: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> None:
            raise ValueError(f"CreditConfig.{name}={getattr(self, name)!r}: {rule}")

        # Types first (values come from command lines and config files): an int is a fine float.
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), f.type.split(" | ")
            if value is None and "None" in kind:
                continue
            if kind[0] == "float" and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))
            elif not isinstance(value, _TYPES[kind[0]]) or (kind[0] in ("int", "float") and isinstance(value, bool)):
                bad(f.name, f"must be {_TYPE_WORDS[kind[0]]}{' or None' if 'None' in kind else ''}")

        if self.method not in METHODS:
            bad("method", f"use one of {', '.join(METHODS)}")
        if self.span_mode not in SPAN_MODES:
            bad("span_mode", f"use one of {', '.join(SPAN_MODES)}")
        if self.method in ("agentopsd", "rlsd") and self.span_mode != "clean_step":
            bad("span_mode", f"{self.method} scores the whole turn response: use 'clean_step'")
        if self.prior not in PRIORS:
            bad("prior", f"use one of {', '.join(PRIORS)}")
        if self.teacher_mode not in ("stale", "live"):
            bad("teacher_mode", "use 'stale' or 'live'")
        if not 0.0 <= self.alpha_clip < 1.0:
            bad("alpha_clip", "must be in [0, 1) so that weights stay positive (signs preserved)")
        if not 0.0 <= self.b < 1.0:
            bad("b", "must be in [0, 1) so that weights stay positive (signs preserved)")
        if not 0.0 <= self.rlsd_clip < 1.0:
            bad("rlsd_clip", "must be in [0, 1)")
        for name in ("lam", "lam_mix"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                bad(name, "must be in [0, 1]")
        for name in ("belief_gamma", "gigpo_gamma"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                bad(name, "must be in [0, 1]")
        if not 0.0 < self.eps0 < 0.5:
            bad("eps0", "must be in (0, 0.5)")
        if self.budget_cap < 1.0:
            bad("budget_cap", "must be >= 1 (coefficients are clipped to [1/C, C])")
        if not self.adv_eps > 0:
            bad("adv_eps", "must be > 0")
        if not self.max_abs_gap > 0:
            bad("max_abs_gap", "must be > 0")
        if self.teacher_refresh < 1:
            bad("teacher_refresh", "must be >= 1")
        if self.peer_max_chars < 0:
            bad("peer_max_chars", "must be >= 0")
        if self.peer_format not in PEER_FORMATS:
            bad("peer_format", f"use one of {', '.join(PEER_FORMATS)}")
        if self.teacher_max_length is not None and self.teacher_max_length < 2:
            bad("teacher_max_length", "must be >= 2 or None")

    # ------------------------------------------------------------------------------------------

    @property
    def needs_teacher(self) -> bool:
        """StepOPSD, AgentOPSD and RLSD read teacher log-probs; GRPO and GiGPO do not."""
        return self.method in ("stepopsd", "agentopsd", "rlsd")

    def replace(self, **changes: Any) -> CreditConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CreditConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"CreditConfig: unknown fields {sorted(extra)}")
        return cls(**d)

    @classmethod
    def for_method(
        cls,
        method: str,
        family_defaults: Mapping[str, Any] | None = None,
        *,
        preset: str = "default",
        **overrides: Any,
    ) -> CreditConfig:
        """The settings for `method` with an env family's defaults (docs/credit.md#configuration).

        Order (later wins): the dataclass defaults; the generic family defaults (span `clean_step`,
        which works for any action format); `family_defaults` (what the env family registered, e.g.
        ALFWorld: span `action_only`, invalid_coef 0.1, lam_mix 0.2; WebShop also score_coef 1;
        Search-QA: span `clean_step`, invalid_coef 0.01, lam_mix 0.1); the method's own rules
        (AgentOPSD and RLSD score the whole response, `clean_step`; AgentOPSD's teacher is the live
        policy); `preset="release"` (AgentOPSD's public-code preset: gamma 1, eps0 1e-4, the 0/10
        reward prior); keyword overrides.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(family_defaults or {}) - known
        if unknown:
            raise ValueError(f"family defaults name unknown CreditConfig fields: {sorted(unknown)}")
        values: dict[str, Any] = {"method": method, "span_mode": "clean_step"}
        values.update(family_defaults or {})
        if method in ("agentopsd", "rlsd"):
            values["span_mode"] = "clean_step"
        if method == "agentopsd":
            values["teacher_mode"] = "live"
        if preset == "release":
            values.update(RELEASE_PRESET)
        elif preset != "default":
            raise ValueError(f"preset {preset!r}: use 'default' or 'release'")
        values.update(overrides)
        return cls(**values)
