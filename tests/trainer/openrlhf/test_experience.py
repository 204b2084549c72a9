"""The experience maker subclass on real OpenRLHF 0.11.2 classes: rollouts from the agent executor
become `Experience`s through the stock samples generator code, the stock `make_experience` runs the
student forward on a real `RayActorGroup` (one CPU actor holding OpenRLHF's `Actor`), and the
advantages that come out are the credit core's, on generated tokens only. Then one `PolicyLoss`
update runs on them.

What cannot run here (CUDA): DeepSpeed's engine and distributed setup, so the CPU actor below
replaces `PolicyModelActor`'s model setup and its `.cuda()` moves, and the update uses a plain torch
optimizer instead of `ActorPPOTrainer.training_step`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

pytest.importorskip("openrlhf.utils", reason="OpenRLHF is not installed in this venv: run `make test-openrlhf`")

# Imported after the importorskip above (E402): the bridge modules import OpenRLHF.
from agentgym_opsd import Hindsight, TextEnv, Transition, hash_state, register_env  # noqa: E402
from trainer.openrlhf.config import BridgeConfig, TaskLabel  # noqa: E402
from trainer.openrlhf.hf_engine import Completion, HFAsyncEngine, RequestOutput  # noqa: E402
from trainer.openrlhf.launch import complete_flags, parse_openrlhf_flags  # noqa: E402

GROUP = 8
SEEDS = (2, 6)  # secrets 3 and 7: the warm-started policy opens with 3 or 7, so groups mix outcomes
MAX_LEN = 512


def openrlhf_args(model_path):
    """OpenRLHF's own parsed args for a small CPU-sized run (the real parser and checks)."""
    return parse_openrlhf_flags(
        complete_flags(
            [
                "--actor.model_name_or_path", str(model_path),
                "--data.prompt_dataset", "unused.jsonl",
                "--rollout.n_samples_per_prompt", str(GROUP),
                "--rollout.batch_size", str(len(SEEDS)),
                "--rollout.micro_batch_size", "3",
                "--train.batch_size", str(GROUP * len(SEEDS)),
                "--train.micro_batch_size", "4",
                "--data.max_len", str(MAX_LEN),
                "--algo.kl.use_loss", "--algo.kl.init_coef", "0",
                "--vllm.num_engines", "1",
                "--actor.num_gpus_per_node", "1",
                "--ds.attn_implementation", "eager",
            ]
        )
    )


@pytest.fixture(scope="module")
def rollout(guess_policy, qwen3_tokenizer, example_env_id, policy_group):
    """Rollout samples of 2 prompts x 8 episodes, as OpenRLHF's SamplesGenerator hands them over."""
    from openrlhf.utils.deepspeed import DeepspeedStrategy
    from vllm import SamplingParams

    from trainer.openrlhf.agent_func import AgentExecutor
    from trainer.openrlhf.samples import AgentGymSamplesGenerator

    model, path = guess_policy
    args = openrlhf_args(path)
    strategy = DeepspeedStrategy(seed=0, zero_stage=2, args=args)
    bridge = BridgeConfig.from_dict({"rollout": {"turn_max_tokens": 12, "max_turns": 3}})
    executor = AgentExecutor(bridge)
    engine = HFAsyncEngine(model, qwen3_tokenizer, seed=3)
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1,
                            skip_special_tokens=False)

    async def play():
        jobs = [
            executor.execute("prompt", TaskLabel(example_env_id, seed).to_json(), params, MAX_LEN, qwen3_tokenizer,
                             engine)
            for seed in SEEDS
            for _ in range(GROUP)
        ]
        return await asyncio.gather(*jobs)

    responses = asyncio.run(play())
    generator = AgentGymSamplesGenerator(strategy, None, None, qwen3_tokenizer, [])
    samples = [generator._process_response_into_experience(r, max_len=MAX_LEN) for r in responses]
    group = policy_group
    return SimpleNamespace(args=args, strategy=strategy, bridge=bridge, responses=responses, samples=samples,
                           group=group, model=model, path=path)


def make_maker(rollout, tokenizer, credit=None):
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from trainer.openrlhf.experience import CreditExperienceMaker

    bridge = BridgeConfig.from_dict({"rollout": {"turn_max_tokens": 12, "max_turns": 3}, "credit": credit or {}})
    return CreditExperienceMaker(rollout.group, None, None, None, FixedKLController(0.0), rollout.strategy, tokenizer,
                                 bridge=bridge)


def actor_forward_calls(group):
    import ray

    return sum(ray.get([a.forward_calls.remote() for a in group._actor_handlers]))


def test_samples_keep_the_executor_turn_structure(rollout):
    from trainer.openrlhf.samples import ACTION_KEY, RECORD_KEY, TURN_KEY

    for response, sample in zip(rollout.responses, rollout.samples):
        turn = sample.info[TURN_KEY][0]
        assert torch.equal((turn > 0).long(), sample.action_mask[0].long())
        ids = response["agentgym"]["turn_ids"]
        assert turn.tolist() == [t + 1 for t in ids[1:]]
        assert (sample.info[ACTION_KEY][0].bool() <= (turn > 0)).all()
        assert json.loads(sample.info[RECORD_KEY][0])["reward"] == pytest.approx(sample.rewards.item())


@pytest.fixture(scope="module")
def made(rollout, qwen3_tokenizer):
    maker = make_maker(rollout, qwen3_tokenizer)
    experiences = maker.make_experience_batch(copy.deepcopy(rollout.samples))
    return maker, experiences


def test_credit_advantages_on_generated_tokens_only(made, rollout):
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    from trainer.openrlhf.samples import ACTION_KEY, RECORD_KEY, TURN_KEY

    maker, experiences = made
    assert sum(len(e.sequences) for e in experiences) == GROUP * len(SEEDS)
    assert len(experiences) == -(-GROUP * len(SEEDS) // 3)  # the stock split into micro-batches of 3
    nonzero = 0
    for e in experiences:
        # Only the agent's own tokens carry advantage; prompt, framing and observations carry none.
        assert (e.advantages[e.action_mask == 0] == 0).all()
        nonzero += int((e.advantages[e.action_mask.bool()] != 0).sum())
        for key in (TURN_KEY, ACTION_KEY, RECORD_KEY):
            assert key not in e.info
        assert e.info["credit/success_rate"].shape == (len(e.sequences),)
    assert nonzero > 0, "mixed groups must give non-zero advantages"
    assert 0 < maker.last_diagnostics["credit/success_rate"] < 1

    # The same rollout through the stock experience maker (OpenRLHF's own group_norm advantage):
    # with GRPO the credit core must agree with OpenRLHF token for token (eps 1e-6 vs 1e-9 aside).
    stock = RemoteExperienceMaker(rollout.group, None, None, None, maker.kl_ctl, rollout.strategy, maker.tokenizer)
    reference = stock.make_experience_batch(copy.deepcopy(rollout.samples))
    for ours, theirs in zip(experiences, reference):
        mask = ours.action_mask.bool()
        assert torch.allclose(ours.advantages[mask], theirs.advantages[mask], atol=1e-4)


def episode_advantages(experiences):
    """[(episode advantage from the stock GRPO returns, token advantages, action mask)] per episode."""
    out = []
    for e in experiences:
        for i in range(len(e.sequences)):
            out.append((e.advantages[i], e.action_mask[i].bool(), e.info["return"][i]))
    return out


@pytest.mark.parametrize("method", ["agentopsd", "stepopsd"])
def test_teacher_methods_score_on_the_actor_group(method, made, rollout, qwen3_tokenizer, load_policy_actor):
    """The teacher forward runs on the actor group, gives what the credit core's own scorer gives
    with the same weights, and the reshaped advantages keep GRPO's signs within their bounds
    (docs/credit.md#properties)."""
    from trainer.credit import compute_advantages
    from trainer.env_knowledge import credit_config
    from trainer.openrlhf.credit_rows import rollout_token_rows
    from trainer.openrlhf.samples import ACTION_KEY, RECORD_KEY, TURN_KEY
    from trainer.teacher import score_teacher

    grpo_maker, grpo = made
    credit = {"method": method, "lam_mix": 1.0, "decay_steps": 0} if method == "stepopsd" else {"method": method}
    maker = make_maker(rollout, qwen3_tokenizer, credit)
    calls = actor_forward_calls(rollout.group)
    experiences = maker.make_experience_batch(copy.deepcopy(rollout.samples))
    student_calls = len(experiences)  # make_experience: one forward per micro-batch
    assert actor_forward_calls(rollout.group) > calls + student_calls, "no teacher forward on the actor group"
    logs = maker.last_diagnostics
    assert logs["teacher/truncated"] == 0 and logs["credit/scored_tokens"] > 0
    assert logs["credit/delta_std"] > 0, "privileged context must move some teacher log-probs"

    # The credit core's own teacher scorer, on the same weights, sees the same log-probs.
    config = credit_config("example/GuessNumber-v0", method, teacher_mode="live",
                           **{k: v for k, v in credit.items() if k != "method"})
    samples = copy.deepcopy(rollout.samples)
    stock = grpo_maker.make_experience(grpo_maker.split_rollout_samples(samples))
    batch = rollout_token_rows(stock, GROUP, qwen3_tokenizer, config, TURN_KEY, ACTION_KEY, RECORD_KEY)
    local = load_policy_actor(rollout.path).model
    scores = score_teacher(local, qwen3_tokenizer, batch.episodes, batch.rows, config, strategy="per-turn")
    assert scores.truncated == 0 and int(scores.scored.sum()) == logs["credit/scored_tokens"]
    # Same weights, same sequences: the actor group's teacher log-probs are the local scorer's up to
    # the kernels' summation order (a 151k-way softmax), so the advantages agree closely.
    expected, _ = compute_advantages(batch.rows.credit_batch(batch.student_logprobs, scores.logprobs, scores.scored),
                                     config, 0)
    for e, (start, end) in zip(experiences, batch.slices):
        n = e.action_mask.shape[1]
        assert torch.allclose(e.advantages, expected[start:end, 1 : n + 1] * e.action_mask, rtol=2e-3, atol=2e-3)

    # docs/credit.md#properties on the way out: GRPO's sign everywhere, bounded reshaping.
    lam, bound = (1.0, 0.2) if method == "stepopsd" else (0.5, 0.2)
    reshaped = 0
    for (ours, mask, _), (base, _, _) in zip(episode_advantages(experiences), episode_advantages(grpo)):
        a, g = ours[mask], base[mask]
        assert torch.equal(torch.sign(a), torch.sign(g))
        nz = g != 0
        ratio = a[nz] / g[nz]
        if method == "agentopsd":
            assert (ratio >= 1 - lam * bound - 1e-5).all() and (ratio <= 1 + lam * bound + 1e-5).all()
        reshaped += int((ratio - 1).abs().gt(1e-6).sum())
    assert reshaped > 0, "the teacher's evidence must reshape some advantages"


def test_student_log_probs_come_from_the_actor_group(made, rollout, load_policy_actor):
    _, experiences = made
    local = load_policy_actor(rollout.path)
    e = experiences[0]
    with torch.no_grad():
        expected = local(e.sequences, e.action_mask, e.attention_mask)
    assert torch.allclose(e.action_log_probs, expected, atol=1e-5)


def test_one_policy_loss_update(made, rollout, load_policy_actor):
    from openrlhf.models import Actor, PolicyLoss

    _, experiences = made
    model = load_policy_actor(rollout.path).model.train()
    actor = Actor(model)
    actor.packing_samples = False  # an Actor built from a ready module lacks it (OpenRLHF 0.11.2)
    loss_fn = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, token_level_loss=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer.zero_grad()
    total_tokens = sum(float(e.action_mask.sum()) for e in experiences)
    for e in experiences:
        log_probs = actor(e.sequences, e.action_mask, e.attention_mask)
        loss, clip_ratio, ppo_kl, _, _ = loss_fn(log_probs, e.action_log_probs, e.advantages, action_mask=e.action_mask,
                                                   batch_num_tokens=total_tokens)
        assert float(ppo_kl) == pytest.approx(0.0, abs=1e-5) and float(clip_ratio) == 0.0  # on-policy: ratio 1
        loss.backward()
    optimizer.step()
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed
    # The update moves log-probs in the direction of the advantages.
    with torch.no_grad():
        up, down = [], []
        for e in experiences:
            delta = actor(e.sequences, e.action_mask, e.attention_mask) - e.action_log_probs
            mask = e.action_mask.bool()
            up.append(delta[mask & (e.advantages > 0)])
            down.append(delta[mask & (e.advantages < 0)])
        assert torch.cat(up).mean() > torch.cat(down).mean()


def test_gigpo_clusters_the_env_state_keys(made, rollout, qwen3_tokenizer):
    """GiGPO reads the executor's records (state keys before each turn, step rewards): every group
    starts in one state, so turn 0 forms a cluster and its step advantage reshapes GRPO's."""
    from trainer.credit import compute_advantages
    from trainer.env_knowledge import credit_config
    from trainer.openrlhf.credit_rows import rollout_token_rows
    from trainer.openrlhf.samples import ACTION_KEY, RECORD_KEY, TURN_KEY

    grpo_maker, grpo = made
    maker = make_maker(rollout, qwen3_tokenizer, {"method": "gigpo"})
    experiences = maker.make_experience_batch(copy.deepcopy(rollout.samples))
    assert maker.last_diagnostics["credit/step_adv_std"] > 0
    config = credit_config("example/GuessNumber-v0", "gigpo", teacher_mode="live")
    stock = grpo_maker.make_experience(grpo_maker.split_rollout_samples(copy.deepcopy(rollout.samples)))
    batch = rollout_token_rows(stock, GROUP, qwen3_tokenizer, config, TURN_KEY, ACTION_KEY, RECORD_KEY)
    first_states = batch.rows.state_id[:, 0]
    for g in batch.rows.episode_group.unique():
        assert first_states[batch.rows.episode_group == g].unique().numel() == 1
    expected, _ = compute_advantages(batch.rows.credit_batch(batch.student_logprobs), config, 0)
    changed = 0
    for e, base, (start, end) in zip(experiences, grpo, batch.slices):
        n = e.action_mask.shape[1]
        assert torch.allclose(e.advantages, expected[start:end, 1 : n + 1] * e.action_mask, atol=1e-5)
        changed += int((e.advantages - base.advantages).abs().gt(1e-6).sum())
    assert changed > 0


# ------------------------------------------------------------------------------------------------
# One bad episode never ends an OpenRLHF run: an env that raises, a retrieval server that is down, a
# prompt that does not fit come back as errored samples (reward 0, zero advantage, counted), through
# OpenRLHF's real samples-generator conversion and the credit experience maker; a batch in which every
# episode failed stops the run with the first error. Data set errors (a malformed label, an unknown env
# id) still raise at once.

class RaisesAtTurnTwo(TextEnv):
    """Plays one turn, then its engine breaks (a bug, a crashed simulator)."""

    instructions = "Answer inside <action>...</action>."
    allow_bare_action = True
    max_turns = 5

    @property
    def num_tasks(self) -> int:
        return 3

    def _load_task(self, index, options):
        self.task_id, self.task_type, self.turns = f"raise-{index}", "raise", 0
        return "Say anything."

    def _apply(self, action):
        self.turns += 1
        if self.turns >= 2:
            raise RuntimeError("simulator crashed")
        return Transition("Again.", admissible=True)

    def state_key(self):
        return hash_state(self.turns)

    def hindsight(self):
        return Hindsight(False, 0.0, "", {})


register_env("erroredtest/RaisesAtTurnTwo-v0", RaisesAtTurnTwo, family="ErroredTest", splits=("test",))


class ScriptedEngine:
    """Always writes the same turn (a stand-in for vLLM's async generate, which needs a GPU)."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = tokenizer(text,
                             add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    async def generate(self, prompt_token_ids, sampling_params):
        return RequestOutput(list(prompt_token_ids), [Completion(list(self.ids), "", "stop")])


def params():
    from vllm import SamplingParams

    return SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1,
                          skip_special_tokens=False)


def play(executor, engine, tokenizer, labels, max_len=MAX_LEN):
    async def run():
        return await asyncio.gather(*[executor.execute("prompt", label, params(), max_len, tokenizer, engine)
                                      for label in labels])

    return asyncio.run(run())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_errored(response, reason):
    record = response["agentgym"]["record"]
    assert record["errored"] and record["reward"] == 0.0 and response["reward"] == 0.0
    assert reason in record["episode"]["error"]
    assert response["extra_logs"]["env/errored"] == 1.0
    assert response["action_ranges"] == [(1, 2)] and response["agentgym"]["turn_ids"] == [-1, -1]


def test_env_errors_server_outages_and_long_prompts_are_errored_samples(guess_policy, qwen3_tokenizer, example_env_id):
    model, _ = guess_policy
    tok = qwen3_tokenizer
    from trainer.openrlhf.agent_func import AgentExecutor

    executor = AgentExecutor(BridgeConfig.from_dict({"rollout": {"turn_max_tokens": 12, "max_turns": 3}}))
    # An env that raises mid-episode.
    crashed = play(executor, ScriptedEngine(tok, "<action>hi</action>"), tok,
                   [TaskLabel("erroredtest/RaisesAtTurnTwo-v0", s).to_json() for s in range(3)])
    for response in crashed:
        assert_errored(response, "RuntimeError: simulator crashed")
    # A retrieval server that is down when the agent searches.
    label = TaskLabel("agentgym/SearchQA-Synthetic-v0", 0,
                      env_kwargs={"server_url": f"http://127.0.0.1:{closed_port()}", "check_server": False}).to_json()
    down = play(executor, ScriptedEngine(tok, "<search>capital of France</search>"), tok, [label])
    assert_errored(down[0], "serve-retrieval")
    # A first prompt longer than --data.max_len.
    long = play(executor, HFAsyncEngine(model, tok), tok, [TaskLabel(example_env_id, 0).to_json()], max_len=8)
    assert_errored(long[0], "PromptTooLong")
    # Healthy episodes still play, and say they did not error.
    fine = play(executor, HFAsyncEngine(model, tok, seed=1), tok, [TaskLabel(example_env_id, 2).to_json()])
    assert fine[0]["extra_logs"]["env/errored"] == 0.0 and not fine[0]["agentgym"]["record"]["errored"]
    # Data set errors are not episodes' bad luck: they raise.
    from agentgym_opsd.registry import UnknownEnvError

    with pytest.raises(UnknownEnvError):
        play(executor, HFAsyncEngine(model, tok), tok, [TaskLabel("example/Nope-v0", 1).to_json()])


def test_errored_samples_get_no_credit_and_do_not_move_their_group(rollout, qwen3_tokenizer):
    """Two episodes of the first group fail: they get advantage 0 and the others of their group are
    normalised among themselves (GRPO's A over the 6 that played)."""
    from trainer.openrlhf.samples import AgentGymSamplesGenerator

    tok = qwen3_tokenizer
    from trainer.openrlhf.agent_func import AgentExecutor

    executor = AgentExecutor(BridgeConfig.from_dict({"rollout": {"turn_max_tokens": 12, "max_turns": 3}}))
    crashed = play(executor, ScriptedEngine(tok, "<action>hi</action>"), tok,
                   [TaskLabel("erroredtest/RaisesAtTurnTwo-v0", 0).to_json()] * 2)
    generator = AgentGymSamplesGenerator(rollout.strategy, None, None, tok, [])
    errored = [generator._process_response_into_experience(r, max_len=MAX_LEN) for r in crashed]
    samples = copy.deepcopy(rollout.samples)
    failed_at = (1, 5)  # two episodes of the first prompt group
    for position, sample in zip(failed_at, errored, strict=True):
        samples[position] = sample
    maker = make_maker(rollout, tok)
    experiences = maker.make_experience_batch(samples)
    assert maker.last_diagnostics["credit/errored_episodes"] == 2.0
    rows = [(e.advantages[i], e.action_mask[i].bool()) for e in experiences for i in range(len(e.sequences))]
    for position in failed_at:
        assert bool((rows[position][0] == 0).all())
    rewards = [json.loads(json.dumps(r["agentgym"]["record"]))["reward"] for r in rollout.responses]
    played = [i for i in range(GROUP) if i not in failed_at]
    R = torch.tensor([rewards[i] for i in played], dtype=torch.float64)
    expected = (R - R.mean()) / (R.std() + 1e-6)
    for i, value in zip(played, expected.tolist(), strict=True):
        advantages, mask = rows[i]
        assert torch.allclose(advantages[mask].double(), torch.full((int(mask.sum()),), value, dtype=torch.float64),
                              atol=1e-5)
    assert len(rows) == GROUP * len(SEEDS)

    with pytest.raises(RuntimeError, match="every episode of this batch failed.*simulator crashed"):
        make_maker(rollout, tok).make_experience_batch(copy.deepcopy(errored))
