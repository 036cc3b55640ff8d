"""A study's description, typed: what `advisor tune` was asked and for what, stored with the study.

It is derived from the study settings' declarations (advisor.search.settings): one field per setting
stored with the study, under the setting's key. It travels as JSON in the Optuna study's user attribute
"advisor" (``to_dict`` / ``from_dict``, a tested round trip), and every reader rebuilds the model, GPU,
budget and space from it in this one way: the tuner (and a worker joining the study), `advisor export`,
`advisor report` and the TUI. Studies written before a setting existed still load, with what the setting
declares for them (``missing``, else its default): a study without gpus, sharding or task is a one-GPU
training study; older ModelSpec / GpuSpec fields are resolved again by name. A study written before the
host budget existed loads with ``host_budget`` None: its host memory is not checked, by the tuner resuming
it, the selection, the report or the TUI (its trials were chosen without the host rule; a budget detected on
whichever machine reads it would re-decide them).
"""

from __future__ import annotations

from advisor.search.settings import ATTR, StudyDescription, gpu_from_dict, model_from_dict

__all__ = ["ATTR", "StudyDescription", "gpu_from_dict", "model_from_dict"]
