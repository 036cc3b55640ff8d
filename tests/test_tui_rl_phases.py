"""The TUI's GRPO/DPO phase bars (advisor.ui.tui.draw.phase_lines): one bar per phase against the budget line, the
peak phase marked, and what vLLM holds."""

from __future__ import annotations

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.core.units import format_bytes
from advisor.ui.phase_view import picture_of_plan
from advisor.ui.tui.draw import LABEL_W, phase_lines


def test_phase_lines_draw_each_phase_the_peak_and_vllm():
    model, gpu = resolve_model("qwen7b"), resolve_gpu("rtx-4090")
    plan = Plan(task="grpo", method="qlora", quantization="nf4", gradient_checkpointing=True, micro_batch=8,
                max_prompt_length=256, max_completion_length=256, generation="vllm-colocate", vllm_sleep=2).validate()
    pic = picture_of_plan(model, plan, gpu)
    lines = [t.plain for t in phase_lines(pic, gpu.memory_bytes, format_bytes, 100)]
    assert lines[0].startswith("GRPO step by phase") and f"{pic.step_peak_phase} sets the step's peak" in lines[0]
    bars = {ln.split()[0]: ln for ln in lines[1:] if ln[:LABEL_W].strip().split(" ")[0] in {b.name for b in pic.bars}}
    assert set(bars) == {b.name for b in pic.bars}
    assert "◀ peak" in bars[pic.step_peak_phase]
    assert all(len(ln) <= 100 for ln in bars.values())  # the bars fit the width (the text lines wrap)
    for b in pic.bars:  # longer bars draw more cells
        assert bars[b.name].count("█") >= 1
    gen, score = (next(b for b in pic.bars if b.name == n) for n in ("generate", "score"))
    assert bars["generate"].count("█") > bars["score"].count("█") and gen.live_bytes > score.live_bytes
    assert any("vLLM pool" in ln and "KV" in ln and "asleep while training" in ln for ln in lines)
    assert phase_lines(None, gpu.memory_bytes, format_bytes, 100) == []
