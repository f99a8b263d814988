"""THE declaration of the pipeline: the seven steps of an iteration, in order, with the files each
one writes. `PIPELINE` is the single source: `storage.layout.RunLayout.step_outputs`, the
iteration flow (a test checks its calls follow this order), the step-deployment flow, the config's
`run.step_deployments` keys and the fault hook all read it. It imports nothing of ours: every
layer, the config included, may import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One step of an iteration and the files whose existence means it finished."""

    name: str
    artifacts: tuple[str, ...]  # iter_NNNN/<artifact>.parquet (their schemas: storage/schemas.py ARTIFACTS)
    checkpoint: str | None = None  # "policy" | "rm": also writes checkpoints/<kind>/iter_NNNN/
    next_tasks: bool = False  # also writes the next iteration's task buffer tasks/v(N+1).parquet


PIPELINE = (
    Step("rollout", ("rollouts", "episodes")),  # 1. the policy plays each task G times
    # 2. the environment's outcome ±1 per trajectory (and its step labels, where it knows them)
    Step("verify", ("step_labels", "outcomes")),
    # 3. the generative RM judges every step m times (or, coding, writes unit tests: rm.role);
    # progress: the Monte-Carlo target of algo.rm_target progress (empty otherwise)
    Step("rm_score", ("progress", "judgments", "unit_tests", "pass_matrix")),
    Step("advantages", ("advantages",)),  # 4. rewards, advantages, which samples train
    Step("policy_update", ("policy_update",), checkpoint="policy"),  # 5. PPO-clip on the policy
    Step("rm_update", ("rm_update",), checkpoint="rm"),  # 6. the same loss on the RM's judgments
    Step("adapt_tasks", ("adaptation",), next_tasks=True),  # 7. tasks outside the band are adapted
)
STEPS = tuple(step.name for step in PIPELINE)  # the names, in order
