"""Episodes for the trainer tests, put together from the contract's own records (Episode, Turn,
StepInfo, Hindsight), with action spans found by the contract's parser, as an env would record them."""

from __future__ import annotations

from agentgym_opsd import Episode, Hindsight, StepInfo, Turn, parse_action


def make_episode(
    responses: list[str],
    observations: list[str] | None = None,
    *,
    success: bool = False,
    episode_id: str = "ep",
    group: str = "g0",
    context: str = "full",
    task_type: str = "heat",
    env_id: str = "agentgym/ALFWorld-Heat-v0",
    instructions: str = "Solve the task. Think inside <think></think>, then act inside <action>...</action>.",
    initial_observation: str = "You are in the middle of a room. Your task is to: heat some egg and put it in the "
                               "garbagecan.",
    states: list[str] | None = None,
    rewards: list[float] | None = None,
    reference: str = "Expert plan: go to fridge 1, take egg 1, heat egg 1 with microwave 1, put egg 1 in garbagecan 1.",
    tags: tuple[str, ...] = ("action",),
) -> Episode:
    observations = observations or [f"Observation {k + 1}." for k in range(len(responses))]
    states = states or [f"s{k + 1}" for k in range(len(responses))]
    rewards = rewards or [0.0] * (len(responses) - 1) + [1.0 if success else 0.0]
    turns = []
    for k, response in enumerate(responses):
        parsed = parse_action(response, tags)
        step = StepInfo(
            turn=k + 1, action=parsed.content, action_kind=parsed.kind, action_span=parsed.span,
            format_ok=parsed.ok, format_error=parsed.error, admissible=parsed.ok, admissible_actions=None,
            state_key=states[k], task_id="task-1", task_type=task_type, episode_id=episode_id,
        )
        last = k == len(responses) - 1
        turns.append(Turn(response, parsed.content, observations[k], rewards[k], last and success, last and not success,
                          step))
    initial = StepInfo(0, None, None, None, True, None, None, None, "s0", "task-1", task_type, episode_id)
    return Episode(
        env_id=env_id, task_id="task-1", task_type=task_type, episode_id=episode_id, seed=0, agent="test",
        context=context, instructions=instructions, initial_observation=initial_observation, initial=initial,
        turns=turns, hindsight=Hindsight(success, float(success), reference, {}), group=group,
    )


UNICODE_RESPONSES = [
    "<think>\n我想一想……先去冰箱🍳 then heat it.\n</think>\n好的：<action>go to fridge 1</action>",
    "\n\nLet me take it — é, ü, 中文.<action>take egg 1 from fridge 1</action>\n",
    "<think>微波炉 is the right tool.</think>x.<action>heat egg 1 with microwave 1</action> done ✅",
    "no tags here, just text 🤷",
]
