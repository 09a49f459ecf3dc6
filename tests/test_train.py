"""Training the draft heads on a tiny model: row alignment, losses, the loop, interruption."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import VOCAB, tiny_model
from helpers import random_prompt

from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.train.data import DistillConfig, Rows, rows_from_sequence, self_distill, teacher_forced
from tokenswift_cli.train.fit import TrainConfig, evaluate, head_loss, lm_head_weight, split_by_position, train_heads
from tokenswift_cli.train.resume import StateMismatch
from tokenswift_cli.train.run import texts_of


def test_rows_pair_each_hidden_state_with_the_tokens_two_and_more_ahead() -> None:
    tokens = torch.arange(100, 111)  # positions 5..15 hold tokens 100..110
    hidden = torch.arange(10).float()[:, None].expand(10, 4)  # row r: hidden of tokens[r]
    ids = torch.arange(10)[:, None].expand(10, 2) + 1000  # row r predicts tokens[r + 1]
    rows = rows_from_sequence(tokens, hidden, (ids, ids.float()), offset=5, heads=3)
    assert rows.size == 7
    assert rows.targets[0].tolist() == [102, 103, 104]  # head i: token at t + 2 + i
    assert rows.teacher_ids[0, :, 0].tolist() == [1001, 1002, 1003]  # the distribution of that same token
    assert rows.targets[-1].tolist() == [108, 109, 110]
    assert rows.positions.tolist() == list(range(5, 12))


def test_teacher_forced_rows_match_the_model() -> None:
    model = tiny_model("llama-gqa")
    tokens = random_prompt(40)
    rows = teacher_forced(model, tokens, heads=3)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]  # [T, vocab]
    # row r's head-0 teacher predicts token r + 2, i.e. comes from the logits at position r + 1
    assert torch.equal(rows.teacher_ids[:, 0, 0].long(), logits[1 : 1 + rows.size].argmax(-1))
    assert rows.targets[:, 0].tolist() == tokens[2 : 2 + rows.size]


def test_self_distilled_rows_match_reading_the_same_text() -> None:
    """The states captured while the model writes are those of reading its text back (fp32)."""
    model = tiny_model("llama-mha")
    prompts = [random_prompt(7, seed=1), random_prompt(5, seed=2)]  # unequal: left padding is exercised
    greedy = DistillConfig(new_tokens=12, batch_size=2, min_p=0.999, penalty=1.0)  # min-p 0.999: the argmax
    rows = self_distill(model, prompts, greedy, heads=2)
    assert rows.size == 2 * (12 - 2)
    for b, prompt in enumerate(prompts):
        mine = rows.take(torch.arange(10 * b, 10 * b + 10))
        with torch.no_grad():
            first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())  # rows start at token 2 ahead
        text = [*prompt, first, *mine.targets[:, 0].tolist(), int(mine.targets[-1, 1])]
        reread = teacher_forced(model, text, heads=2)
        start = len(prompt) - 1  # row 0 sits on the last prompt token
        assert mine.positions.tolist() == list(range(start, start + 10))
        assert torch.equal(mine.targets, reread.targets[start : start + 10])
        assert torch.allclose(mine.hidden.float(), reread.hidden.float()[start : start + 10], atol=0.05, rtol=0.02)
        assert torch.equal(mine.teacher_ids[:, :, :3], reread.teacher_ids[start : start + 10, :, :3])


def _rows(seed: int = 0, tokens: int = 96) -> tuple[torch.nn.Module, Rows]:
    model = tiny_model("llama-gqa")
    parts = [teacher_forced(model, random_prompt(tokens, seed=s), heads=3) for s in range(seed, seed + 4)]
    return model, Rows.concat(parts)


def test_soft_loss_with_a_one_hot_teacher_is_the_hard_loss() -> None:
    model, rows = _rows()
    batch = rows.take(torch.arange(32))
    one_hot = Rows(batch.hidden, batch.targets, batch.targets[..., None].int(),
                   torch.zeros(32, 3, 1, dtype=torch.float16), batch.positions)  # fmt: skip
    heads = DraftHeads.for_model(model.config, 3)
    weight = lm_head_weight(model)
    soft, _ = head_loss(heads, weight, one_hot, "soft")
    hard, _ = head_loss(heads, weight, one_hot, "hard")
    assert torch.allclose(soft, hard)


@pytest.mark.parametrize("target", ["soft", "hard"])
def test_training_fits_the_heads(target: str) -> None:
    model, rows = _rows()
    weight = lm_head_weight(model)
    heads = DraftHeads.for_model(model.config, 3, norm_weight=model.model.norm.weight)
    before = evaluate(heads, weight, rows)
    cfg = TrainConfig(target=target, steps=60, batch_size=64, lr=3e-3, warmup=10)  # type: ignore[arg-type]
    assert train_heads(heads, weight, rows, cfg) == 60
    after = evaluate(heads, weight, rows)
    # soft learns the model's own distribution; hard the (here random) text's tokens
    fitted = (after.model_top3, before.model_top3) if target == "soft" else (after.top3, before.top3)
    assert sum(fitted[0]) > sum(fitted[1]) + 0.3


def test_fresh_heads_predict_what_the_model_predicts_next() -> None:
    model, rows = _rows()
    heads = DraftHeads.for_model(model.config, 2, norm_weight=model.model.norm.weight)
    states = heads(rows.hidden.float()[:8])  # [8, 2, hidden]
    expected = model.model.norm(rows.hidden.float()[:8])
    assert torch.allclose(states[:, 0], expected, atol=1e-5) and torch.allclose(states[:, 1], expected, atol=1e-5)


def test_ctrl_c_and_the_time_budget_leave_usable_heads() -> None:
    model, rows = _rows(tokens=48)
    weight = lm_head_weight(model)
    heads = DraftHeads.for_model(model.config, 3)

    def interrupt(report: object) -> None:
        if report.step == 3:  # type: ignore[attr-defined]
            raise KeyboardInterrupt

    saved: list[int] = []
    cfg = TrainConfig(steps=100, batch_size=16)
    assert train_heads(heads, weight, rows, cfg, on_step=interrupt) == 3
    assert not heads.training and all(torch.isfinite(p).all() for p in heads.parameters())
    assert train_heads(heads, weight, rows, TrainConfig(steps=100, batch_size=16, max_seconds=0.0)) == 1
    cfg = TrainConfig(steps=10, batch_size=16)
    train_heads(heads, weight, rows, cfg, on_checkpoint=saved.append, checkpoint_every=4)
    assert saved == [4, 8]


def test_accuracy_split_by_position() -> None:
    _, rows = _rows(tokens=96)
    parts = split_by_position(rows, short=20, long=60)
    assert parts["all"].size == rows.size
    assert bool((parts["<20"].positions < 20).all()) and bool((parts[">=60"].positions >= 60).all())
    assert 0 < parts["<20"].size < rows.size and VOCAB > 0


def test_texts_are_recovered_from_rows_for_the_long_windows() -> None:
    model = tiny_model("llama-gqa")
    texts = [random_prompt(30, seed=5), random_prompt(20, seed=6)]
    rows = Rows.concat([teacher_forced(model, t, heads=3) for t in texts])
    assert texts_of(rows) == [t[2:] for t in texts]


def test_interrupted_training_resumes_to_the_same_heads(tmp_path: Path) -> None:
    model, rows = _rows(tokens=48)
    weight = lm_head_weight(model)
    cfg = TrainConfig(steps=12, batch_size=16, lr=3e-3, warmup=3)

    def fresh() -> DraftHeads:
        return DraftHeads.for_model(model.config, 3, norm_weight=model.model.norm.weight)

    whole = fresh()
    assert train_heads(whole, weight, rows, cfg) == 12

    def interrupt(report: object) -> None:
        if report.step == 5:  # type: ignore[attr-defined]
            raise KeyboardInterrupt

    state = tmp_path / "heads.state.pt"
    first = fresh()
    assert train_heads(first, weight, rows, cfg, on_step=interrupt, state_file=state, checkpoint_every=4) == 5
    assert state.is_file()
    resumed = fresh()  # a new process: everything comes from the state file
    assert train_heads(resumed, weight, rows, cfg, state_file=state) == 12
    assert not state.is_file()  # finished: nothing left to resume
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    train_heads(fresh(), weight, rows, cfg, on_step=interrupt, state_file=state)
    with pytest.raises(StateMismatch):
        train_heads(fresh(), weight, rows, TrainConfig(steps=12, batch_size=8), state_file=state)


def test_parallel_heads_all_read_the_model_state() -> None:
    model, rows = _rows()
    heads = DraftHeads.for_model(model.config, 3, chained=False)
    for block in heads.blocks:
        torch.nn.init.normal_(block.linear.weight, std=0.1)
    hidden = rows.hidden.float()[:4]
    states = heads(hidden)
    for i, block in enumerate(heads.blocks):
        assert torch.allclose(states[:, i], block(hidden)[1])
    heads.chained = True
    assert not torch.allclose(heads(hidden)[:, 2], states[:, 2])


def test_past_the_writing_deadline_no_new_batch_starts() -> None:
    model = tiny_model("llama-mha")
    prompts = [random_prompt(5, seed=s) for s in range(6)]
    cfg = DistillConfig(new_tokens=6, batch_size=2)
    rows = self_distill(model, prompts, cfg, heads=2, deadline=0.0)  # long past: the first batch only
    assert rows.size == 2 * (6 - 2)
    assert self_distill(model, prompts, cfg, heads=2).size == 6 * (6 - 2)


def test_parallel_heads_load_back_parallel(tmp_path: Path) -> None:
    from tokenswift_cli.model.heads import load_heads, read_metadata, save_heads

    model = tiny_model("llama-gqa")
    for chained in (False, True):
        save_heads(DraftHeads.for_model(model.config, 2, chained=chained), tmp_path / "h.safetensors", {})
        assert read_metadata(tmp_path / "h.safetensors")["chained"] == str(chained).lower()
        assert load_heads(tmp_path / "h.safetensors", model.config).chained is chained
