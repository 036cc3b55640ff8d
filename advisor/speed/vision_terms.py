"""The vision tower's step time: its blocks' GEMMs and attention over its own sequence (the patches, before the
merge), its projector, and what trains in it (advisor.memory.vision says what is saved; this says what is run).

- forward: every block's linears on the tower's tokens (2 FLOPs per weight per token, Kaplan et al. 2020 §2.1),
  attention 4 L^2 d FLOPs per chunk (Q K^T and P V; Dao 2023 §3.1) within each image (or Qwen2.5-VL window);
- backward: only where something in the tower trains: the input gradients of every block above the lowest trained
  one (all of them: each block holds adapters or weights), the weight gradients of a fully trained tower, the
  attention backward (2.5x its forward, flash_backward_flops_ratio); nothing for a frozen tower;
- recompute: one more forward of every block under ``--vision-gradient-checkpointing``.
"""

from __future__ import annotations

from advisor.core.plan import has_vision_input
from advisor.speed.inputs import StepInputs
from advisor.speed.kernels import gemm_seconds
from advisor.speed.terms import _cached, term


def _vision(s: StepInputs):
    """(VisionInput of one sample, the tower LoRA modules) for a vision-language plan, or None."""
    def compute():
        from advisor.core.vision_tokens import count_sample
        from advisor.memory.vision import tower_lora_modules

        return count_sample(s.model, s.plan), tower_lora_modules(s.model, s.plan)[0]
    cache = s.__dict__.setdefault("_parts", {})
    if "vision_input" not in cache:
        cache["vision_input"] = compute() if s.model.vision is not None and has_vision_input(s.plan) else None
    return cache["vision_input"]


def tower_seconds(s: StepInputs) -> dict[str, float]:
    """Seconds of one micro-batch's tower: forward, backward, recompute (0s for a text plan)."""
    def compute() -> float:
        found = _vision(s)
        if found is None:
            return {"forward": 0.0, "backward": 0.0, "recompute": 0.0}
        from advisor.memory.vision import block_chunks

        vis, lora = found
        v, plan = s.model.vision, s.plan
        M = vis.vision_tokens * plan.micro_batch
        full = plan.vision_tower == "full"
        fwd = dx = dw = 0.0
        for m in v.block_linears:
            fwd += gemm_seconds(s, M, m.out_features, m.in_features)
            dx += gemm_seconds(s, M, m.in_features, m.out_features)
            if full:
                dw += gemm_seconds(s, m.out_features, m.in_features, M)
            elif m.short in lora:  # the adapters' narrow GEMMs (rank r) in both directions
                r = plan.lora_r
                fwd += gemm_seconds(s, M, r, m.in_features) + gemm_seconds(s, M, m.out_features, r)
                dw += 2 * (gemm_seconds(s, r, m.in_features, M) + gemm_seconds(s, m.out_features, r, M))
        eff = s.k["matmul_efficiency"]
        attn = sum(4.0 * plan.micro_batch * c * c * v.hidden_size for block in block_chunks(vis, s.model)
                   for c in block) / (s.peak_flops * eff)
        proj = sum(gemm_seconds(s, M // max(v.spatial_merge_size ** 2, 1), m.out_features, m.in_features)
                   for m in v.projector_linears)
        forward = v.depth * fwd + attn + proj
        trains = full or bool(lora)
        backward = (v.depth * (dx + dw) + attn * s.k["flash_backward_flops_ratio"] + 2 * proj) if trains else (
            2 * proj if plan.train_projector else 0.0)
        recompute = forward - proj if trains and plan.vision_gradient_checkpointing else 0.0
        return {"forward": forward, "backward": backward, "recompute": recompute}
    return _cached(s, "vision_tower", compute)


@term("vision", label="vision tower")
def vision(s: StepInputs) -> float:
    """The vision tower and projector on their own sequence (see the module docstring)."""
    t = tower_seconds(s)
    return t["forward"] + t["backward"] + t["recompute"]
