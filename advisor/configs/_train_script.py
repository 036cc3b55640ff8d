"""train.py: a runnable transformers Trainer + peft script that reads advisor.yaml beside it.

The script is data, not generated code: ``templates/train.py`` is copied byte for byte, so what
the tests run is exactly what a user gets. It reads every setting from advisor.yaml; a vision-language
model's side is ``templates/vision_setup.py``, written beside it.
"""

from __future__ import annotations

from pathlib import Path

from advisor.configs.formats import FORMATS
from advisor.configs._base import (ExportContext, Unsupported, template, vision_script_rules,
                                   write_long_context_script, write_text, write_vision_script)
from advisor.core.plan import RL_TASKS

FILENAME = FORMATS["train"].filename


def template_text() -> str:
    return template("train.py")


def write(ctx: ExportContext, out_dir: Path) -> Path:
    if ctx.plan.task in RL_TASKS:  # a Trainer over text: GRPO/DPO run on TRL's trainers (the trl format)
        raise Unsupported("train", f"train.py runs supervised fine-tuning only: export {ctx.plan.task.upper()} to TRL "
                                   "(trl.yaml + its script)")
    vision_script_rules(ctx, "train")
    write_vision_script(ctx, out_dir)  # a vision-language model: its processor and what trains
    write_long_context_script(ctx, out_dir)  # sequence parallelism, tiled MLP
    path = write_text(out_dir / FILENAME, template_text())
    path.chmod(0o755)
    return path
